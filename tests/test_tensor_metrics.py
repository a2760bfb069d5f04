"""Per-tensor sparsity counters of compress(tensor_metrics=...) (TernGrad Fig. 4(c))."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxcomp
from jaxcomp import parallel

pytestmark = pytest.mark.accelerator


def _grads(n=10_000):
  # |x| = 1 everywhere but one element of 2: without clipping s = 2, so every other
  # element is sent as +-s with probability 1/2 (Eq. 3) and zero otherwise.
  w = jnp.where(jnp.arange(n) % 2 == 0, 1.0, -1.0).at[0].set(2.0)
  return {"fc6": {"kernel": w.reshape(100, n // 100), "bias": jnp.ones((7,))},
          "logits": {"kernel": jnp.ones((3, 4))}}


def test_zeros_of_the_matched_tensor_only_one_worker():
  g = _grads()
  tx = jaxcomp.terngrad(clip_sigma=None, tensor_metrics=r"fc6/kernel$|logits")
  out, state = jax.jit(tx.update)(g, tx.init(g))  # one program, not eager ops
  m = jaxcomp.metrics(state)
  # Every compressed tensor the pattern matches is tracked; the bias is not matched.
  assert {k for k in m if ":" in k} == {"zeros:fc6/kernel", "elements:fc6/kernel",
                                        "zeros:logits/kernel", "elements:logits/kernel"}
  # One worker: the update is this worker's own decoded message.
  assert int(m["zeros:fc6/kernel"]) == int(np.sum(np.asarray(out["fc6"]["kernel"]) == 0))
  assert int(m["elements:fc6/kernel"]) == 10_000
  frac = float(m["zeros:fc6/kernel"]) / 10_000
  assert abs(frac - 0.5) < 5 * 0.5 / np.sqrt(10_000)  # 5 standard errors
  assert int(m["zeros:logits/kernel"]) == 0  # constant tensor: s = |x|, all sent


def test_skipped_tensors_are_not_tracked():
  g = _grads()
  tx = jaxcomp.terngrad(tensor_metrics="logits",
                        skip=jaxcomp.skip_by_path(lambda p: p.startswith("logits")))
  state = tx.init(g)
  assert not [k for k in jaxcomp.metrics(state) if ":" in k]


def test_per_worker_counts_under_vmap():
  """Each worker counts its own message; jaxcomp.metrics averages over workers."""
  n_workers = 4
  g = _grads()
  tx = jaxcomp.terngrad(clip_sigma=None, axis_name="w", tensor_metrics="fc6/kernel")
  state = parallel.replicate_workers(tx.init(g), n_workers)
  axes = parallel.worker_axes(state)
  grads = jax.tree.map(lambda x: jnp.stack([x] * n_workers), g)

  def step(gr, st):
    return tx.update(gr, st)[1]

  state = jax.jit(jax.vmap(step, in_axes=(0, axes), out_axes=axes, axis_name="w"))(grads, state)
  per_worker = np.asarray(state.local.metrics["zeros:fc6/kernel"])
  assert per_worker.shape == (n_workers,)
  assert len(set(per_worker.tolist())) > 1  # independent draws per worker
  assert np.all(np.abs(per_worker / 10_000 - 0.5) < 0.025)
  m = jaxcomp.metrics(state)
  np.testing.assert_allclose(float(m["zeros:fc6/kernel"]), per_worker.mean(), rtol=1e-6)


def test_bad_pattern_fails_at_construction():
  with pytest.raises(Exception):
    jaxcomp.terngrad(tensor_metrics="fc6[")
