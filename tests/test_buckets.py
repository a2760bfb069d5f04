"""Buckets: one fused collective per bucket and round, and the same numbers, bit for bit, as per tensor."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from benchmarks import link
import jaxcomp
from jaxcomp.exchange import buckets
from jaxcomp.exchange import layout
from jaxcomp import parallel

from _layouts import device_update, on_mesh

N = 4  # workers: shard_map over 4 devices, or 2 devices with 2 vmap workers each


def _mesh(n):
  return jax.make_mesh((n,), ("d",), axis_types=(jax.sharding.AxisType.Auto,), devices=jax.devices()[:n])


# -- the plan -------------------------------------------------------------------


def test_assign_fills_buckets_from_the_last_tensor():
  assert buckets.assign([4, 4, 4, 4, 4], 8) == [[4, 3], [2, 1], [0]]
  assert buckets.assign([4, 100, 4, 4], 8) == [[3, 2], [1], [0]]  # a large tensor closes its bucket
  assert buckets.assign([4, 4, 4], 10**9) == [[2, 1, 0]]
  assert buckets.assign([4, 4, 4], 0) == [[0], [1], [2]]  # per tensor, in leaf order
  assert buckets.assign([], 8) == []
  # Billion-parameter sizes are Python ints: no overflow.
  assert buckets.assign([4 * 2**31, 4 * 2**31, 4], 2**34) == [[2, 1, 0]]


@pytest.mark.parametrize("bad", [-1, 1.5, True, "25MiB"])
def test_bad_bucket_bytes_are_refused(bad):
  with pytest.raises(ValueError, match="bucket_bytes must be an int >= 0"):
    jaxcomp.terngrad(bucket_bytes=bad)


# -- the same numbers ------------------------------------------------------------


def _grads(step):
  """Per-worker gradients: tensors of several sizes and dtypes, one kept in float (min_size).

  With ``bucket_bytes=4000`` they fill three buckets (leaves sort by key, buckets fill from the
  last): ``wide`` alone, then ``half`` (a bfloat16 matrix) and ``dense``, encoded together, then
  ``bias`` (in float) alone: fused rounds of mixed dtypes, a second bucket whose agreement rides
  on the first one's gather, and a float bucket, at a small compile cost.
  """
  ks = jax.random.split(jax.random.PRNGKey(10 + step), 4)
  return {
      "dense": jax.random.normal(ks[0], (N, 40, 24)),
      "bias": jax.random.normal(ks[1], (N, 3)),  # < min_size: float
      "half": jax.random.normal(ks[2], (N, 12, 20)).astype(jnp.bfloat16),
      "wide": jax.random.normal(ks[3], (N, 30, 40)) * 3.0,
  }


def _tx(name, axis, bucket_bytes):
  kwargs = dict(axis_name=axis, bucket_bytes=bucket_bytes, min_size=4)
  if name == "local_steps":
    return jaxcomp.make_optimizer("local_steps", optax.sgd(0.1), k=2, exchange="terngrad", **kwargs)
  if name == "onebit_adam":
    return jaxcomp.make_optimizer("onebit_adam", optax.sgd(0.1), freeze_step=1, **kwargs)
  if name == "demo":
    return jaxcomp.make_optimizer("demo", optax.sgd(0.1), k=4, chunk=8, **kwargs)
  if name.startswith("two_phase:"):
    base = name.split(":")[1]
    extra = {"capacity": 0.5} if base == "threelc" else {}
    return jaxcomp.get_transform(base, exchange="two_phase", **extra, **kwargs)
  if name == "threelc_capacity":
    return jaxcomp.threelc(1.5, capacity=0.5, **kwargs)
  if name == "dgc":
    kwargs["warmup_steps"] = 0
  return jaxcomp.get_transform(name, **kwargs)


def _shard_map_vmap(tx):
  """Two devices with two vmap workers each: fused collectives over ("d", "w")."""
  def build(state):
    specs = parallel.worker_specs(state, "d")
    axes = parallel.worker_axes(state)
    inner = jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w")
    mesh = _mesh(N // 2)
    return on_mesh(jax.jit(jax.shard_map(inner, mesh=mesh, in_specs=(P("d"), specs),
                                         out_specs=(P(), specs), check_vma=False)), mesh, "d", state)
  return build


def _shard_map(tx):
  """One worker per device."""
  def build(state):
    specs = parallel.worker_specs(state, "d")
    mesh = _mesh(N)
    return on_mesh(jax.jit(jax.shard_map(device_update(tx), mesh=mesh, in_specs=(P("d"), specs), out_specs=(P(), specs))),
                   mesh, "d", state)
  return build


def _run(name, layout, bucket_bytes, steps=2):
  axis = ("d", "w") if layout == "shard_map+vmap" else "d"
  tx = _tx(name, axis, bucket_bytes)
  params = jax.tree.map(lambda g: g[0], _grads(0))
  state = parallel.replicate_workers(_tx(name, "w", bucket_bytes).init(params), N)
  step = {"shard_map+vmap": _shard_map_vmap, "shard_map": _shard_map}[layout](tx)(state)
  outs = []
  for t in range(steps):
    upd, state = step(_grads(t), state)
    jax.block_until_ready((upd, state))
    outs.append(upd)
  return jax.device_get((outs, state)), step


# diloco exchanges through local_steps' exchange and step (on_last_step), checked here as local_steps.
CASES = [n for n in jaxcomp.names() if n != "diloco"] + ["threelc_capacity", "two_phase:terngrad", "two_phase:threelc"]


@pytest.mark.parametrize("name", CASES)
def test_buckets_give_the_numbers_of_the_per_tensor_exchange(name):
  """Updates, states and metrics over two steps are bit-identical per tensor and in three buckets.

  Two devices with two vmap workers each: the fused collectives run over ("d", "w").
  """
  layout = "shard_map+vmap"
  assert buckets.assign([4 * g[0].size for g in jax.tree.leaves(_grads(0))], 4000) == [[3], [2, 1], [0]]
  ref, _ = _run(name, layout, 0)
  got, _ = _run(name, layout, 4000)
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


def _ops(compiled_text, kind):
  return link.collectives(compiled_text).get(kind, 0)


@pytest.mark.parametrize("name", ["terngrad", "two_phase:terngrad", "powersgd", "none"])
def test_one_device_per_worker_same_numbers_and_fewer_collectives(name):
  """shard_map over 4 devices: the same numbers, and one collective per bucket and round."""
  (ref, _), (got, step) = _run(name, "shard_map", 0, steps=1), _run(name, "shard_map", 10**9, steps=1)
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
    if name == "powersgd":
      # The messages are the same bit for bit; XLA:CPU compiles PowerSGD's matrix products in
      # the two programs with other fusions, which round differently by a few ulp (jaxcomp.exchange.buckets).
      np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7, err_msg=name)
    else:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)
  state = jax.tree.map(jnp.asarray, got[1])
  text = step.lower(_grads(0), state).compile().as_text()
  # One bucket: one collective per round that moves payloads. (The float baseline's bfloat16
  # tensor is summed on CPU by an all-to-all and an all-gather of its 16-bit values.)
  per_round = {"terngrad": {"all-gather": 1}, "two_phase:terngrad": {"all-gather": 1, "all-to-all": 1},
               "powersgd": {}, "none": {"all-gather": 1, "all-to-all": 1}}[name]
  for kind in ("all-gather", "all-to-all"):
    assert _ops(text, kind) == per_round.get(kind, 0), (kind, _ops(text, kind))
  # All-reduces: the non-finite flags, the agreed scalars (per dtype), the float tensors (per
  # dtype), PowerSGD's P and Q rounds: a handful, however many tensors.
  assert _ops(text, "all-reduce") <= 6, _ops(text, "all-reduce")


def _spy_on_deliver(monkeypatch) -> list:
  """From now on, every fused round's ``(kind, number of trees)``, in order."""
  delivered = []
  deliver = buckets.deliver

  def spy(trees, kind, axis_name):
    delivered.append((kind, len(trees)))
    return deliver(trees, kind, axis_name)

  monkeypatch.setattr(buckets, "deliver", spy)
  return delivered


def test_bucket_agreements_travel_ahead_of_their_buckets(monkeypatch):
  """shard_map over 4 devices, three buckets: TernGrad's numbers per tensor, and its collectives.

  The agreed scalars of the first two buckets share the first collective, so that the second
  bucket encodes while the first is on the wire; then the two buckets' gathers (each with its
  tensors' non-finite flags) and the float bucket's mean. In the compiled step: those
  all-gathers, and all-reduces for the first agreement and the float bucket.
  """
  ref, _ = _run("terngrad", "shard_map", 0, steps=1)
  delivered = _spy_on_deliver(monkeypatch)
  got, step = _run("terngrad", "shard_map", 4000, steps=1)
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert delivered == [("max", 2), ("gather", 1), ("gather", 1), ("mean", 1)]
  text = step.lower(_grads(0), jax.tree.map(jnp.asarray, got[1])).compile().as_text()
  assert (_ops(text, "all-gather"), _ops(text, "all-reduce")) == (2, 2)


def test_a_gather_carries_the_agreement_two_buckets_ahead(monkeypatch):
  """Five one-tensor buckets of TernGrad: bucket k's gather carries bucket k + 2's agreement.

  Per tensor the numbers are those of the per-tensor exchange; the rounds are the first
  agreement (buckets 0 and 1), then each bucket's gather with one rider while one is left.
  """
  grads = {f"w{i}": jnp.arange(N * (8 + i), dtype=jnp.float32).reshape(N, 8 + i) / (3 + i) - 2 for i in range(5)}

  def run(tx):
    state = parallel.replicate_workers(tx.init(jax.tree.map(lambda g: g[0], grads)), N)
    return _shard_map(tx)(state)(grads, state)

  ref = run(jaxcomp.terngrad(axis_name="d", bucket_bytes=0))
  delivered = _spy_on_deliver(monkeypatch)
  got = run(jaxcomp.terngrad(axis_name="d", bucket_bytes=4))  # every tensor a bucket of its own
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert delivered == [("max", 2), ("gather", 2), ("gather", 2), ("gather", 2), ("gather", 1), ("gather", 1)]


# -- encoding per bucket ------------------------------------------------------------

BUCKET_ENCODED = ["terngrad", "qsgd", "int8", "threelc", "stochastic_ternary"]


def _run_vmap(name, bucket_bytes, steps=2):
  """Four vmap-simulated workers: nothing is fused on the wire, but a bucket is encoded at once."""
  tx = _tx(name, "w", bucket_bytes)
  state = parallel.replicate_workers(tx.init(jax.tree.map(lambda g: g[0], _grads(0))), N)
  axes = parallel.worker_axes(state)
  step = jax.jit(jax.vmap(tx.update, in_axes=(0, axes), out_axes=(None, axes), axis_name="w"))
  outs = []
  for t in range(steps):
    upd, state = step(_grads(t), state)
    outs.append(upd)
  return jax.device_get((outs, state))


def test_the_quantizers_encode_a_bucket_at_once():
  from experiments import throughput
  for name in BUCKET_ENCODED:
    assert throughput.compressor_of(name).bucket_encode, name
  assert not throughput.compressor_of("threelc", capacity=0.5).bucket_encode  # its own two-round exchange
  assert not throughput.compressor_of("qsgd", norm="l2").bucket_encode  # a float sum per row


@pytest.mark.parametrize("name", BUCKET_ENCODED)
def test_a_bucket_encoded_at_once_under_vmap_gives_the_per_tensor_numbers(name):
  """Over vmap-simulated workers alone: a bucket's tensors encoded at once, the numbers of one at a time."""
  ref, got = _run_vmap(name, 0), _run_vmap(name, 4000)
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(got)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=name)


def test_layout_lays_tensors_side_by_side_and_back():
  lay = layout.Layout([1, 9, 4, 0, 21], planes=4, chunk=2)
  assert lay.widths == (1, 3, 1, 0, 6) and lay.chunks == (1, 2, 1, 1, 3) and lay.columns == 11
  flats = [jnp.arange(n, dtype=jnp.float32) + 100 * i for i, n in enumerate(lay.sizes)]
  # Each step below is one jitted program, not eager ops (every slice and pad compiled alone).
  joined = jax.jit(lambda f: lay.join(f, fill=-1))(flats)
  assert joined.shape == (4, 8, 2)
  for a, b in zip(jax.jit(lay.split)(joined), flats):
    np.testing.assert_array_equal(a, b)
  # Each value's index within its own tensor, as the tensor alone would number it.
  for idx, n in zip(jax.jit(lambda: lay.split(lay.index().astype(jnp.int32)))(), lay.sizes):
    np.testing.assert_array_equal(idx, np.arange(n))
  assert all(bool(np.asarray(v).all()) for v in jax.jit(lambda: lay.split(lay.valid()))())
  # In the tensors' columns, the rest is padding.
  assert int(jax.jit(lambda: lay.compact(lay.valid()).sum())()) == sum(lay.sizes)
  # Packed bytes: one a column, every tensor's m_i columns end to end.
  cols = jnp.arange(8 * 2, dtype=jnp.int32).reshape(8, 2)
  compact = jax.jit(lay.compact)(cols)
  assert compact.shape == (11,)
  np.testing.assert_array_equal(jax.jit(lambda c: lay.compact(lay.expand(c)))(compact), compact)


def test_a_bucket_payload_is_its_tensors_payloads_end_to_end_at_any_size():
  """Billion-value tensors trace (eval_shape, no memory); sizes are Python ints."""
  from jaxcomp.compressors.terngrad import TernGrad
  c = TernGrad()
  sizes = [2**31 + 3, 100, 7]
  lay = layout.Layout(sizes, c.planes)
  xs = [jax.ShapeDtypeStruct((n,), jnp.float32) for n in sizes]
  keys = jax.ShapeDtypeStruct((3, 2), jnp.uint32)
  out = jax.eval_shape(lambda xs, keys: c.encode_bucket(xs, keys, None, lay), xs, keys)
  parts = [c.payload_struct(n) for n in sizes]
  assert out.codes.shape == (sum(p.codes.shape[0] for p in parts),) == (lay.columns,)
  assert out.scale.shape == (3,)
  cut = layout.payload_parts(jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(
      lambda: c.encode_bucket([jnp.zeros(5), jnp.zeros(9)], jnp.zeros((2, 2), jnp.uint32), None,
                              layout.Layout([5, 9], c.planes)))), [c.payload_struct(5), c.payload_struct(9)])
  assert [p.codes.shape for p in cut] == [(2,), (3,)] and [p.scale.shape for p in cut] == [(), ()]


# -- per-tensor statistics of a bucket at once ------------------------------------

_SIZES = [0, 1, 5, 127, 128, 129, 513, 2048, 3]  # empty, under and over a chunk, several chunks


def _tensors(sizes, seed=0):
  rng = np.random.default_rng(seed)
  return [jnp.asarray(rng.standard_normal(n, dtype=np.float32) * 10.0**rng.integers(-3, 3) + rng.normal())
          for n in sizes]


@pytest.mark.parametrize("planes", [1, 4, 5])
def test_a_buckets_sums_and_maxima_are_each_tensors_own(planes):
  """Every tensor's sum and max|x|, reduced for the whole bucket, are bit for bit its own alone (and right)."""
  xs = _tensors(_SIZES)

  @jax.jit
  def stats(xs):
    lay = layout.Layout([x.size for x in xs], planes)
    x = lay.join(xs)
    return lay.tensor_sum(x), lay.tensor_max(jnp.abs(x))

  sums, maxima = stats(xs)
  for x, s, m in zip(xs, np.asarray(sums), np.asarray(maxima)):
    alone_s, alone_m = stats([x])
    assert (s, m) == (float(alone_s[0]), float(alone_m[0])), x.size
    ref = np.asarray(x, np.float64)
    np.testing.assert_allclose(s, ref.sum(), rtol=1e-5, atol=1e-5 * np.abs(ref).sum())
    assert m == (np.abs(ref).max() if x.size else 0.0)


@pytest.mark.parametrize("planes", [1, 4, 5])
def test_a_buckets_maxima_propagate_nan_and_give_positive_zero(planes):
  """A NaN anywhere makes its tensor's maximum NaN (also in a large tensor: XLA:CPU's fast reduction skips
  NaNs); a tensor of ±0 has the maximum +0; the other tensors keep theirs."""
  sizes = [300_000, 700, 40, 9]
  xs = _tensors(sizes, seed=4)
  for at in (0, 123_457, 299_999):
    ys = [xs[0].at[at].set(np.nan), xs[1], jnp.full((40,), -0.0), xs[3].at[8].set(np.nan)]
    lay = layout.Layout(sizes, planes)
    got = np.asarray(jax.jit(lambda ys: lay.tensor_max(lay.join(ys)))(ys))
    assert np.isnan(got[0]) and np.isnan(got[3]), (at, got)
    assert got[1] == np.asarray(ys[1]).max() and got[2] == 0.0 and not np.signbit(got[2])


@pytest.mark.parametrize("sparsity", [1.0, 1.75])
def test_threelc_bucket_bytes_are_each_tensors_base243(sparsity):
  """3LC's bucket encode writes every tensor's own §3.2 bytes, its padding digits 0 included (sizes not
  a multiple of 5, under 5, empty), and its m = max|x|·s."""
  from jaxcomp.codecs import base243
  xs = _tensors(_SIZES + [7, 4, 2, 6], seed=5)
  comp = jaxcomp.ThreeLC(sparsity)
  lay = layout.Layout([x.size for x in xs], comp.planes)
  payload = jax.jit(lambda xs: comp.encode_bucket(xs, None, None, lay))(xs)
  for x, part in zip(xs, layout.payload_parts(payload, [comp.payload_struct(x.size) for x in xs])):
    x = np.asarray(x)
    m = np.float32(np.abs(x).max() * np.float32(sparsity)) if x.size else np.float32(0)
    q = np.round(x * (np.float32(1) / m if m > 0 else np.float32(0))).astype(np.int8)
    assert float(part.scale) == float(m), x.size
    np.testing.assert_array_equal(np.asarray(part.codes), np.asarray(base243.base243_encode(q)), err_msg=str(x.size))


def test_nonfinite_flags_of_a_bucket_are_each_tensors_own():
  from jaxcomp import update_steps
  xs = _tensors(_SIZES, seed=1)
  poison = {2: np.nan, 4: np.inf, 6: -np.inf, 8: np.nan}  # also the last value of a chunk (index 127)
  xs = [x.at[min(127, x.size - 1)].set(poison[i]) if i in poison else x for i, x in enumerate(xs)]
  together = jax.jit(update_steps.nonfinite_flags)(xs)
  alone = [bool(jax.jit(update_steps.is_nonfinite)(x)) for x in xs]
  assert list(np.asarray(together)) == alone == [i in poison for i in range(len(xs))]
  # An Inf and a -Inf in one tensor, NaN from their sum, and a huge finite tensor (no overflow).
  odd = [jnp.array([np.inf, -np.inf, 1.0]), jnp.full((300,), 3e38, jnp.float32)]
  assert list(np.asarray(jax.jit(update_steps.nonfinite_flags)(odd))) == [True, False]


def test_the_check_joins_a_bucket_once_for_its_encoder():
  """With the encoder's layout, the flags are the same, and the join it carries is that of the zeroed tensors."""
  from jaxcomp import update_steps
  xs = _tensors(_SIZES, seed=2)
  xs = [x.at[0].set(-0.0) if x.size else x for x in xs]  # a signed zero, kept as it is
  xs[1], xs[3] = xs[1].at[-1].set(np.nan), xs[3].at[0].set(-np.inf)
  lay = layout.Layout([x.size for x in xs], 5)

  def check(xs):
    zeroed, bad, carried = update_steps.set_aside_nonfinite(xs, lay)  # the layout, carrying the join
    expected = lay.join(zeroed)
    return (zeroed, bad, carried.joined_input(None), expected, carried.input_max_abs(None),
            lay.tensor_max(jnp.abs(expected)))

  zeroed, bad, joined, expected, tops, expected_tops = jax.jit(check)(xs)
  alone = [bool(update_steps.is_nonfinite(x)) for x in xs]
  assert list(np.asarray(bad)) == alone == [i in (1, 3) for i in range(len(xs))]
  bits = lambda a: np.asarray(a).view(np.uint32)
  np.testing.assert_array_equal(bits(joined), bits(expected))
  np.testing.assert_array_equal(bits(tops), bits(expected_tops))  # and the maxima it carries
  for x, z, b in zip(xs, zeroed, bad):
    np.testing.assert_array_equal(bits(z), bits(jnp.zeros_like(x) if b else x))


@pytest.mark.parametrize("layout_name", ["shard_map", "shard_map+vmap"])
def test_a_transform_built_outside_the_mesh_joins_once_per_device(monkeypatch, layout_name):
  """The single join is decided where the axes are bound: a transform is built before its mesh.

  With one worker per device the check hands its join to the encoder; with vmap-simulated workers
  inside it does not (see jaxcomp.compress_update.Compress.inputs).
  """
  from jaxcomp import compress_update
  given = []
  real = compress_update.set_aside_nonfinite

  def spy(xs, layout=None):
    if jax.sharding.get_abstract_mesh().axis_names:  # the step's trace (init traces without a mesh)
      given.append(layout is not None)
    return real(xs, layout)

  monkeypatch.setattr(compress_update, "set_aside_nonfinite", spy)
  _run("threelc", layout_name, 4000, steps=1)
  assert given and set(given) == {layout_name == "shard_map"}


def test_terngrad_moments_of_a_bucket_are_each_tensors_own():
  """σ (two-pass, padding masked) and max|x| of every tensor, as numpy has them; a constant tensor has σ = 0."""
  tg = importlib.import_module("jaxcomp.compressors.terngrad")  # the module (the package exports the factory)
  xs = _tensors(_SIZES, seed=2) + [jnp.full((300,), 0.5, jnp.float32)]

  @jax.jit
  def moments(xs):
    lay = layout.Layout([x.size for x in xs], tg.TernGrad.planes)
    return tg.bucket_moments(lay.join(xs), lay)

  sigma, amax = moments(xs)
  for x, s, m in zip(xs, np.asarray(sigma), np.asarray(amax)):
    alone = moments([x])
    assert (s, m) == (float(alone[0][0]), float(alone[1][0])), x.size
    ref = np.asarray(x, np.float64)
    np.testing.assert_allclose(s, ref.std() if x.size else 0.0, rtol=1e-5, atol=1e-12)
    assert m == (np.abs(ref).max() if x.size else 0.0)
  assert float(sigma[-1]) == 0.0


@pytest.mark.parametrize("sparsity", [1.0, 1.5])
def test_threelc_reads_a_buckets_own_and_zero_run_sizes_at_once(sparsity):
  """3LC's error feedback takes ``round(x/m)·m`` from the tensors, bit for bit each part's decode
  (ties at m/2, signed zeros, all-zero tensors), and every tensor's zero-run size in one pass."""
  from jaxcomp.compressors.threelc import ThreeLC
  c = ThreeLC(sparsity=sparsity)
  xs = _tensors(_SIZES, seed=3) + [jnp.array([4.0, 2.0, -2.0, -0.0, 0.0, -1e-30, 0.75, -0.75]),
                                   jnp.zeros(7), jnp.full((40,), -0.0), jnp.zeros(700).at[::97].set(1.0)]

  @jax.jit
  def both(xs):
    lay = layout.Layout([x.size for x in xs], c.planes)
    payload = c.encode_bucket(xs, None, None, lay)
    parts = layout.payload_parts(payload, [c.payload_struct(x.size) for x in xs])
    return (c.own_bucket(xs, payload, lay), [c.decode(p, x.shape) for p, x in zip(parts, xs)],
            c.encoded_bytes_bucket(payload, lay), [c.encoded_bytes(p, x.shape) for p, x in zip(parts, xs)])

  own, decoded, sizes, alone = both(xs)
  for o, d in zip(own, decoded):
    np.testing.assert_array_equal(np.asarray(o).view(np.uint32), np.asarray(d).view(np.uint32))
  assert [int(s) for s in sizes] == [int(a) for a in alone]
  assert ThreeLC(zero_run=False).encoded_bytes_bucket(None, None) is None


def _equations(closed) -> int:
  """Equations of a jaxpr, its sub-jaxprs' included."""
  jaxpr = closed.jaxpr if hasattr(closed, "jaxpr") else closed
  return sum(1 + sum(_equations(j) for j in jax.extend.core.jaxprs_in_params(e.params)) for e in jaxpr.eqns)


def test_a_buckets_program_grows_by_a_few_operations_a_tensor():
  """QSGD's partial buckets of one length are quantized at once, and a layout's tables take a few
  operations whatever its tensors: a bucket's program does not grow by an encoder a tensor (at 8
  workers a two-phase bucket of ResNet-110 was 57K operations and ran out of memory compiling).
  The bucket's payload stays every tensor's own, byte for byte."""
  from jaxcomp.compressors.qsgd import QSGD
  c = QSGD()
  sizes = lambda k: [1100, 64, 3, 64, 600] * k  # full buckets and partial ones; three partial lengths repeat

  def program(k):
    lay = layout.Layout(sizes(k), c.planes)
    xs = [jnp.zeros((n,)) for n in lay.sizes]
    keys = jnp.zeros((len(xs), 2), jnp.uint32)
    return _equations(jax.make_jaxpr(lambda xs, keys: c.decode_bucket(c.encode_bucket(xs, keys, None, lay), lay))(
        xs, keys))

  small, large = program(2), program(10)
  assert (large - small) / (8 * 5) <= 20, (small, large)  # its slices; it was 144 (an encoder a tensor)
  lay = layout.Layout(sizes(2), c.planes)
  xs = _tensors(lay.sizes, seed=3)
  keys = jax.random.split(jax.random.PRNGKey(1), len(xs))
  payload = jax.jit(lambda xs, keys: c.encode_bucket(xs, keys, None, lay))(xs, keys)
  for part, x, key in zip(layout.payload_parts(payload, [c.payload_struct(n) for n in lay.sizes]), xs, keys):
    alone = jax.jit(lambda x, key: c.encode_bucket([x], key[None], None, layout.Layout([x.size], c.planes)))(x, key)
    for a, b in zip(jax.tree.leaves(part), jax.tree.leaves(alone)):
      np.testing.assert_array_equal(a, b)
  for d, x in zip(jax.jit(lambda p: c.decode_bucket(p, lay))(payload), xs):
    assert d.shape == x.shape


def test_a_layouts_tables_take_a_few_operations_whatever_its_tensors():
  def program(k):
    lay = layout.Layout([300, 5, 129] * k, planes=4)
    return _equations(jax.make_jaxpr(lambda: (lay.index(), lay.own(), lay.per_chunk(list(range(len(lay)))),
                                              lay.per_chunk(jnp.arange(len(lay), dtype=jnp.float32))))())

  assert program(40) == program(2)
