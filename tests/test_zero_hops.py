"""A sharded chain over hosts of several devices (``within=``): the gradient reduce-scattered in two hops.

ZeRO++'s hierarchical qgZ (Wang et al., arXiv:2306.10209, §3.3): the
compressor at the chain's head takes ``axis_name="hosts", within="local"``,
the sharded wrapper the axes of both (``("hosts", "local")``, 2 hosts of 2
devices). What must hold:

* with ``none`` (float) the step is the flat one (compressor over both
  axes), bit for bit;
* values that every hop encodes exactly reach the chunk the flat route gives
  each worker, with the same bits (the routing of both all-to-alls);
* error feedback conserves the gradient over both hops: after ``T`` steps the
  updates, the workers' residuals (a mean) and the second hop's residuals (a
  mean over the hosts) sum to ``T`` times the mean gradient;
* the bytes: the first hop's all-to-all inside the host is ``local_bytes``,
  and what goes between hosts is ``H`` chunk payloads where the flat route
  hands ``N``;
* compressors whose reduce-scatter cannot be re-encoded between hops are
  refused by name.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

import jaxcomp

H, L = 2, 2
N = H * L
ALIGN = 40
SHAPE = (3, 500)  # 1,500 values: chunks of 400 (the last one padded)
CHUNK = 400
PARAMS = {"w": jnp.zeros(SHAPE), "b": jnp.zeros((7,))}  # b: under N·align values, averaged whole


def _step(name: str, within: bool, opt=None, hybrid: bool = False, shard_params: bool = False, **kwargs):
  """The data-parallel step of a sharded chain (SGD, learning rate 1) whose batch is each worker's gradient.

  ``hybrid``: the state (and with ``shard_params`` the parameters) cut over a host's devices only."""
  head = jaxcomp.get_transform(name, axis_name="hosts" if within else ("hosts", "local"),
                               within="local" if within else None, **kwargs)
  cut = dict(within="local", host_devices=L) if hybrid else {}
  tx = jaxcomp.shard_optimizer(optax.chain(head, opt or optax.sgd(1.0)), axis_name=("hosts", "local"),
                               num_workers=N, align=ALIGN, shard_params=shard_params, **cut)

  def step(params, opt_state, grads):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state

  mesh = Mesh(np.array(jax.devices()[:N]).reshape(H, L), ("hosts", "local"))
  return jaxcomp.data_parallel(step, tx, mesh=mesh)


def _train(name: str, within: bool, grads, steps: int = 1, **kwargs):
  step = _step(name, within, **kwargs)
  params, state = step.init(PARAMS)
  for _ in range(steps):
    params, state = step(params, state, grads)
  return params, state


def _conserved(params, state, grads, steps: int) -> np.ndarray:
  """The updates, the workers' residuals (a mean) and the second hop's (a mean over the hosts), summed."""
  compression = state.replicated[0]
  workers = np.asarray(compression.local.residual["w"])  # each worker's, for its first hop
  second = np.asarray(compression.shard.residual["w"])  # each device's re-encoded rows, zero elsewhere
  assert np.any(second), "the second hop's residual is kept"
  kept = -np.asarray(params["w"]) + second.sum(0) / H + workers.mean(0)
  np.testing.assert_allclose(kept, steps * np.asarray(grads["w"]).mean(0), rtol=0, atol=2e-5)


def _random_grads(seed: int = 0):
  rng = np.random.default_rng(seed)
  return {"w": jnp.asarray(rng.normal(size=(N,) + SHAPE), jnp.float32),
          "b": jnp.asarray(rng.normal(size=(N, 7)), jnp.float32)}


def _exact_grads():
  """Integers every hop of int8 encodes exactly: each chunk's largest value is 127 on every worker,
  and each host's mean is an integer whose chunks also peak at 127."""
  rng = np.random.default_rng(1)
  host = rng.integers(-100, 101, size=(H,) + SHAPE)
  spread = rng.integers(-27, 28, size=SHAPE)
  starts = np.arange(0, SHAPE[0] * SHAPE[1], CHUNK)
  for a in (host.reshape(H, -1), spread.reshape(-1)):
    a[..., starts] = 0
  host.reshape(H, -1)[:, starts] = 127
  w = np.stack([host[h] + (-1) ** l * spread for h in range(H) for l in range(L)])  # worker h·L + l
  return {"w": jnp.asarray(w, jnp.float32), "b": jnp.zeros((N, 7), jnp.float32)}


def test_float_within_is_the_flat_step():
  grads = _random_grads()
  flat, hops = _train("none", False, grads, steps=2), _train("none", True, grads, steps=2)
  for a, b in zip(jax.tree.leaves(flat[0]), jax.tree.leaves(hops[0])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(jaxcomp.metrics(hops[1])["local_bytes"]) == 0  # nothing compressed: no hop


def test_values_encoded_exactly_reach_the_chunk_the_flat_route_gives():
  grads = _exact_grads()
  (flat, _), (hops, state) = _train("int8", False, grads), _train("int8", True, grads)
  np.testing.assert_array_equal(np.asarray(hops["w"]), np.asarray(flat["w"]))
  np.testing.assert_array_equal(np.asarray(hops["w"]), -np.asarray(grads["w"]).mean(0))
  assert not np.any(np.asarray(state.replicated[0].shard.residual["w"]))  # the second hop was exact too


@pytest.mark.parametrize("name,kwargs", [("int8", {}), ("blockint", {"bits": 4, "block": 40}), ("threelc", {})])
def test_error_feedback_conserves_the_gradient_over_both_hops(name, kwargs):
  grads, steps = _random_grads(2), 3
  params, state = _train(name, True, grads, steps=steps, **kwargs)
  _conserved(params, state, grads, steps)


def test_stochastic_hops_are_unbiased():
  """TernGrad (no error feedback): each hop is unbiased, so the shard's mean over steps is the mean gradient."""
  grads, steps = _random_grads(3), 200
  step = _step("terngrad", True, clip_sigma=None)  # clipping (its Eq. 21) is biased by design
  params, state = step.init(PARAMS)
  estimates = []
  for _ in range(steps):
    before = np.asarray(params["w"])  # the step donates its parameters
    params, state = step(params, state, grads)
    estimates.append(before - np.asarray(params["w"]))
  estimates = np.stack(estimates)
  z = (estimates.mean(0) - np.asarray(grads["w"]).mean(0)) / (estimates.std(0, ddof=1) / np.sqrt(steps))
  assert np.max(np.abs(z)) < 5.5 and abs(np.mean(z)) < 0.1, (np.max(np.abs(z)), np.mean(z))


def test_between_hosts_go_a_hosts_worth_of_chunks():
  grads = _random_grads()
  flat, hops = (jaxcomp.metrics(_train("int8", within, grads)[1]) for within in (False, True))
  payload = CHUNK + 4  # int8 codes and a float32 scale a chunk
  assert int(hops["local_bytes"]) == N * payload  # the first hop: every chunk, to the host's devices
  assert int(flat["compressed_bytes_on_wire"]) - int(hops["compressed_bytes_on_wire"]) == (N - H) * payload
  assert int(hops["float32_bytes"]) == int(flat["float32_bytes"])


@pytest.mark.parametrize("name,kwargs", [("signsgd", {}), ("threelc", {"capacity": 0.5})])
def test_reduce_scatters_that_cannot_hop_are_refused(name, kwargs):
  with pytest.raises(ValueError, match="within="):  # votes; a zero-run wire with its fallback round
    _train(name, True, _random_grads(), **kwargs)



# -- each host a whole copy, cut over its devices (hybrid sharding) -----------------------------------


def test_hybrid_float_is_the_mean_and_every_host_holds_the_same_copy():
  grads, steps = _exact_grads(), 2  # integers: every mean exact, whatever the order of the sums
  params, state = _train("none", True, grads, steps=steps, opt=optax.adamw(1e-2), hybrid=True, shard_params=True)
  reference = _train("none", False, grads, steps=steps, opt=optax.adamw(1e-2))[0]  # the flat cut over all 4
  whole = _step("none", True, hybrid=True, shard_params=True).tx.unshard(params)
  np.testing.assert_allclose(np.asarray(whole["w"]), np.asarray(reference["w"]), rtol=0, atol=1e-7)
  for rows in jax.tree.leaves((params.local.residual, state.local.residual)):  # (N, ...): device h·L + l
    rows = np.asarray(rows)
    np.testing.assert_array_equal(rows[:L], rows[L:])  # host 1's copy is host 0's, bit for bit
  assert np.asarray(params.local.residual["w"]).shape == (N, 760)  # w's 1,500 values over a host's 2 devices


def test_hybrid_sends_only_the_compressed_gradient_between_hosts():
  grads, steps = _random_grads(4), 3
  params, state = _train("int8", True, grads, steps=steps, hybrid=True)
  _conserved(params, state, grads, steps)
  m = jaxcomp.metrics(state)
  chunk = 760  # w cut over a host's 2 devices (aligned to 40)
  assert int(m["bytes_on_wire"]) == int(m["compressed_bytes_on_wire"]) == (chunk + 4) + (7 + 4) + 2  # w, b, flags
  assert int(m["gather_bytes"]) == 4 * chunk  # the updates' float all-gather, inside the host
  assert int(m["local_bytes"]) == L * (chunk + 4) + 4 * chunk


@pytest.mark.parametrize("kwargs", [dict(within="hosts", host_devices=H), dict(within="local"),
                                    dict(within="local", host_devices=3)])
def test_hybrid_needs_the_last_axes_and_their_size(kwargs):
  with pytest.raises(ValueError, match="within="):
    jaxcomp.shard_optimizer(optax.chain(jaxcomp.get_transform("int8", axis_name="hosts", within="local"),
                                        optax.sgd(1.0)), axis_name=("hosts", "local"), num_workers=N, **kwargs)
