"""Hierarchical exchange (``within=``): float mean within a host, compressed exchange between hosts.

A mesh of 2 hosts x 4 local devices (8 host CPU devices), under ``jax.shard_map``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import core
from jaxcomp import parallel

from _layouts import device_update, on_mesh

H, L = 2, 4
AXES = ("hosts", "local")
# Split along the last axis that L divides ("head": its first); "bias" (10) and the scalar are
# averaged whole and exchanged by every device of a host alike.
SHAPES = {"kernel": (3, 5, 8), "dense": (6, 12), "head": (8, 10), "bias": (10,), "scale": ()}


def _mesh():
  return jax.make_mesh((H, L), AXES, axis_types=(jax.sharding.AxisType.Auto,) * 2,
                       devices=jax.devices()[:H * L])


def _grads(step):
  rng = np.random.default_rng(100 + step)
  return {k: jnp.asarray(rng.standard_normal((H * L,) + s), jnp.float32) for k, s in SHAPES.items()}


def _params(shapes=SHAPES):
  return {k: jnp.zeros(s, jnp.float32) for k, s in shapes.items()}


def _runner(tx, state):
  """One jitted update per device over the (hosts, local) mesh: (updates, state)."""
  specs = parallel.worker_specs(state, AXES)
  mesh = _mesh()
  return on_mesh(jax.jit(jax.shard_map(device_update(tx), mesh=mesh, in_specs=(P(AXES), specs), out_specs=(P(), specs))),
                 mesh, AXES, state)


def _hierarchical(name, steps, **kwargs):
  tx = jaxcomp.get_transform(name, axis_name="hosts", within="local", **kwargs)
  state = parallel.replicate_workers(tx.init(_params()), H * L)
  step = _runner(tx, state)
  outs = []
  for t in range(steps):
    upd, state = step(_grads(t), state)
    outs.append(jax.device_get(upd))
  return outs, jax.device_get(state)


def _by_hand(name, steps, **kwargs):
  """The same steps written out: the mean over "local", this device's slice, the flat transform over
  "hosts" on the slices, all-gather over "local"."""
  slice_shapes = {k: _sliced(s, _axis(k, name)) for k, s in SHAPES.items()}
  tx = jaxcomp.get_transform(name, axis_name="hosts", **kwargs)
  state = parallel.replicate_workers(tx.init(_params(slice_shapes)), H * L)
  specs = parallel.worker_specs(state, AXES)

  def per_device(g, s):
    # The host's mean as the hierarchy sums it: in a fixed order (pairwise), the same in every layout.
    mean = jax.tree.map(lambda a: core.sum_leading(lax.all_gather(a[0], "local")) / L, g)
    mine = {k: _slice(a, k, name) for k, a in mean.items()}
    upd, s2 = tx.update(mine, parallel.worker_slice(s, 0))
    whole = {k: _join(u, k, name) for k, u in upd.items()}
    return whole, parallel.expand_workers(s2)

  mesh = _mesh()
  step = on_mesh(jax.jit(jax.shard_map(per_device, mesh=mesh, in_specs=(P(AXES), specs), out_specs=(P(), specs),
                                       check_vma=False)), mesh, AXES, state)
  outs = []
  for t in range(steps):
    upd, state = step(_grads(t), state)
    outs.append(jax.device_get(upd))
  return outs, jax.device_get(state)


def _axis(k, name=None):
  """The axis tensor ``k`` is split along over the host's devices: the last one L divides, unless the
  compressor's state has the tensor's shape in it (PowerSGD's Q does); None: whole."""
  axes = [a for a, n in enumerate(SHAPES[k]) if n % L == 0]
  return axes[-1] if axes and name != "powersgd" else None


def _split(k, name=None):
  return _axis(k, name) is not None


def _sliced(shape, axis):
  return shape if axis is None else shape[:axis] + (shape[axis] // L,) + shape[axis + 1:]


def _slice(a, k, name):
  axis = _axis(k, name)
  if axis is None:
    return a
  w = a.shape[axis] // L
  return lax.dynamic_slice_in_dim(a, lax.axis_index("local") * w, w, axis=axis)


def _join(u, k, name):
  axis = _axis(k, name)
  if axis is None:
    return u
  parts = lax.all_gather(u, "local")  # (L, ...), slice l from device l
  return jnp.concatenate(list(parts), axis=axis)


def _residuals(state):
  """The error-feedback residuals of a state laid over the 8 devices (worker-major)."""
  compress_state = next(x for x in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, jaxcomp.CompressState))
                        if isinstance(x, jaxcomp.CompressState))
  return compress_state.local.residual


# Deterministic compressors: the hierarchy's slices draw randomness as worker h*L + l, which a
# flat transform over "hosts" by hand cannot reproduce, so the stochastic ones are checked apart.
# One of each kind: float; a bucket-encoded quantizer with error feedback and a variable-length
# wire; a column-wise one; a custom exchange (an all-reduce) that splits; one whose tensors stay whole.
BY_HAND = ["none", "threelc", "onebit", "half", "powersgd"]


@pytest.mark.parametrize("name", BY_HAND)
def test_hierarchy_is_the_two_steps_by_hand(name):
  """Updates and residuals over three steps equal the float mean over "local" followed by the flat
  exchange of each device's slice over "hosts", bit for bit."""
  got, got_state = _hierarchical(name, 3)
  ref, ref_state = _by_hand(name, 3)
  for t in range(3):
    for k in SHAPES:
      np.testing.assert_array_equal(got[t][k], ref[t][k], err_msg=f"{name} step {t} {k}")
  got_r, ref_r = _residuals(got_state), _residuals(ref_state)
  for k in SHAPES:
    if isinstance(ref_r[k], optax.MaskedNode):
      continue
    for d in range(H * L):
      mine = np.array(got_r[k][d])
      axis = _axis(k, name)
      if axis is not None:  # a device keeps the residual of its slice, zero elsewhere
        w = SHAPES[k][axis] // L
        mine = np.moveaxis(mine, axis, 0)
        l = d % L
        np.testing.assert_array_equal(mine[l * w:(l + 1) * w], np.moveaxis(ref_r[k][d], axis, 0),
                                      err_msg=f"{name} {k} {d}")
        mine[l * w:(l + 1) * w] = 0
        assert not mine.any()
      else:
        np.testing.assert_array_equal(mine, ref_r[k][d], err_msg=f"{name} {k} {d}")


@pytest.mark.parametrize("name", ["threelc", "onebit", "ef_signsgd"])
def test_error_feedback_is_conserved_per_host(name):
  """Σ updates + the hosts' mean residual = Σ of every device's gradients / (H·L), where a host's
  residual is the sum of its devices' buffers (split tensors) or any one of them (whole tensors)."""
  steps = 4
  got, state = _hierarchical(name, steps)
  residual = _residuals(state)
  for k in SHAPES:
    total = sum(np.asarray(_grads(t)[k], np.float64).mean(0) for t in range(steps))
    sent = sum(np.asarray(got[t][k], np.float64) for t in range(steps))
    r = np.asarray(residual[k], np.float64).reshape((H, L) + SHAPES[k])
    host = r.sum(1) if _split(k) else r[:, 0]
    np.testing.assert_allclose(sent + host.mean(0), total, atol=2e-5, err_msg=f"{name} {k}")


def test_every_device_of_a_host_draws_its_own_randomness():
  """TernGrad on a tensor whose four slices are equal: the slices' decoded values differ (each
  device draws as its own worker), and every device ends with the same whole update."""
  row = np.random.default_rng(0).standard_normal(16).astype(np.float32)
  g = {"w": jnp.asarray(np.tile(np.tile(row, L), (H * L, 4, 1)))}  # (8, 4, 64): split along 64, slices equal
  tx = jaxcomp.terngrad(axis_name="hosts", within="local")
  state = parallel.replicate_workers(tx.init({"w": jnp.zeros((4, 64))}), H * L)
  upd, _ = _runner(tx, state)(g, state)
  slices = np.asarray(upd["w"]).reshape(4, L, 16)
  assert len({slices[:, l].tobytes() for l in range(L)}) == L


@pytest.mark.parametrize("name", sorted(set(jaxcomp.names()) - {"diloco", "local_steps", "onebit_adam", "demo"}))
def test_every_compressor_runs_hierarchically_with_per_device_counts(name):
  """One step per compressor: every device holds the same update, close to the mean (a loose bound:
  one compressed step), and the counts are a device's: its slices' bytes over "hosts", the float
  traffic over "local" apart."""
  kwargs = {"warmup_steps": 0} if name == "dgc" else {}
  (upd,), state = _hierarchical(name, 1, **kwargs)
  mean = {k: np.asarray(v).mean(0) for k, v in _grads(0).items()}
  for k in SHAPES:
    assert np.all(np.isfinite(upd[k])), (name, k)
    assert np.abs(upd[k] - mean[k]).max() < 4 * np.abs(mean[k]).max() + 1e-6, (name, k)
  m = jaxcomp.metrics(state)
  whole = {k for k in SHAPES if not _split(k)}
  elements = sum(np.prod(s) // (1 if k in whole else L) for k, s in SHAPES.items())
  if name != "powersgd":  # PowerSGD's Q depends on the tensor's shape: its tensors stay whole
    assert int(m["float32_bytes"]) == 4 * elements
  assert int(m["local_bytes"]) > 0
  assert int(m["bytes_on_wire"]) <= int(m["float32_bytes"]) or name in ("none", "half")


def test_a_host_of_one_device_is_the_flat_exchange():
  """With ``within`` of size 1 every count and number is the flat exchange's (TernGrad: its keys too)."""
  g = {k: a[:2] for k, a in _grads(0).items()}
  outs = []
  for within in (None, "local"):
    tx = jaxcomp.terngrad(axis_name="hosts", within=within)
    state = parallel.replicate_workers(tx.init(_params()), 2)
    axes = parallel.worker_axes(state)
    f = jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="hosts")
    if within is not None:
      f = jax.vmap(f, in_axes=(None, None), out_axes=0, axis_name="local", axis_size=1)
    upd, state = jax.jit(f)(g, state)
    if within is not None:
      upd, state = jax.tree.map(lambda a: a[0], (upd, state))
    m = jaxcomp.metrics(state)
    outs.append((upd, {k: int(v) for k, v in m.items() if k != "local_bytes" and "ratio" not in k}))
  for k in SHAPES:
    np.testing.assert_array_equal(outs[0][0][k], outs[1][0][k])
  assert outs[0][1] == outs[1][1]


def test_nonfinite_input_on_one_device_is_the_hosts():
  """An Inf in one device's gradient: the whole tensor's mean is NaN (propagate) on every device."""
  g = _grads(0)
  g["dense"] = g["dense"].at[5, 0, 0].set(jnp.inf)
  tx = jaxcomp.int8(axis_name="hosts", within="local")
  state = parallel.replicate_workers(tx.init(_params()), H * L)
  upd, state = _runner(tx, state)(g, state)
  assert np.all(np.isnan(np.asarray(upd["dense"])))
  assert np.all(np.isfinite(np.asarray(upd["kernel"])))
  assert int(jaxcomp.metrics(state)["nonfinite_tensors"]) == 1  # the host's, counted once


@pytest.mark.parametrize("name", ["int8", "threelc"])
def test_a_hosts_nonfinite_tensor_is_sent_as_zeros_by_every_device(name):
  """nonfinite="zero": an Inf on one device, and the host's tensor is sent as zeros from all its slices.

  The numbers are those of the host's tensor being zero (its devices' gradients zeroed), bit for bit:
  the bucket's join, which the check computes once for the encoder, is zeroed by the host's flags.
  """
  tx = jaxcomp.get_transform(name, axis_name="hosts", within="local", nonfinite="zero")
  poisoned, zeroed = _grads(0), _grads(0)
  poisoned["dense"] = poisoned["dense"].at[5, 0, 0].set(jnp.inf)  # device 5: host 1 holds devices 4-7
  zeroed["dense"] = zeroed["dense"].at[4:8].set(0.0)
  outs = []
  for g in (poisoned, zeroed):
    state = parallel.replicate_workers(tx.init(_params()), H * L)
    upd, state = _runner(tx, state)(g, state)
    outs.append((upd, state.local.residual, int(jaxcomp.metrics(state)["nonfinite_tensors"])))
  for a, b in zip(jax.tree.leaves(outs[0][:2]), jax.tree.leaves(outs[1][:2])):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert (outs[0][2], outs[1][2]) == (1, 0)


def test_within_and_axis_name_must_not_share_an_axis():
  with pytest.raises(ValueError, match="share an axis"):
    jaxcomp.terngrad(axis_name=("hosts", "local"), within="local")


def test_two_processes_of_four_devices_give_the_numbers_of_one(tmp_path):
  """2 processes x 4 CPU devices (gloo between them): the updates and residuals of one process's
  8-device mesh, for TernGrad (its keys), 3LC (error feedback, zero-run) and int8."""
  from _processes import run_workers  # pylint: disable=g-import-not-at-top
  outs = run_workers("hierarchy_worker.py", H, tmp_path, devices=L)
  for k in outs[0]:
    if "residual" not in k:
      np.testing.assert_array_equal(outs[0][k], outs[1][k], err_msg=k)
  for name in ("terngrad", "threelc", "int8"):
    got, state = _hierarchical(name, 3)
    for t in range(3):
      for k in SHAPES:
        np.testing.assert_array_equal(outs[0][f"{name}_{k}{t}"], got[t][k], err_msg=f"{name} {k} {t}")
    for k, r in _residuals(state).items():
      if isinstance(r, optax.MaskedNode):
        continue
      for d in range(H * L):
        np.testing.assert_array_equal(outs[d // L][f"{name}_residual_{k}_{d}"], r[d], err_msg=f"{name} {k} {d}")


@pytest.mark.parametrize("name, kwargs", [("local_steps", {"k": 2}), ("onebit_adam", {"freeze_step": 1}),
                                          ("diloco", {"inner_steps": 2}), ("terngrad", {"exchange": "two_phase"}),
                                          ("demo", {"k": 4, "chunk": 8})])
def test_the_optimizer_wrappers_and_two_phase_run_hierarchically(name, kwargs):
  """``within`` passes through the optimizer wrappers to their exchanges, and composes with the
  two-phase exchange: two steps, finite updates, float traffic inside the hosts counted."""
  tx = (jaxcomp.get_transform(name, axis_name="hosts", within="local", **kwargs) if name == "terngrad" else
        jaxcomp.make_optimizer(name, optax.sgd(0.1), axis_name="hosts", within="local", **kwargs))
  state = parallel.replicate_workers(tx.init(_params()), H * L)
  step = _runner(tx, state)
  for t in range(2):
    upd, state = step(_grads(t), state)
  assert all(np.isfinite(np.asarray(u)).all() for u in jax.tree.leaves(upd))
  assert int(jaxcomp.metrics(state)["local_bytes"]) > 0
