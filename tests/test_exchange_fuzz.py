"""The exchange plan fuzzed: random trees, buckets, routes and worker counts, for every registered name.

A hypothesis property, for each name of :func:`jaxcomp.names` (compressors and
wrappers), over trees of awkward sizes (0, 1, primes, sizes no worker count or
packing group divides), bucket sizes, the three routes (``exchange=
"all_gather"``, ``"two_phase"``, ``"auto"``; a route a compressor refuses is
not drawn), tensors left in float (``min_size``) and 2 to 5 workers, one a
device (``shard_map``: buckets fuse only over a device axis). Over two steps:

* the bucketed exchange gives the per-tensor exchange's updates, optimizer
  state and metrics bit for bit (PowerSGD within 4 ulp: its matrix products
  may be compiled with other fusions, :mod:`jaxcomp.exchange.buckets`;
  1-bit Adam over 2 or 4 workers: :data:`POWER_OF_TWO_WORKERS`);
* the bytes the transport counted (``jaxcomp.metrics``: ``bytes_on_wire``,
  ``received_bytes``) are those of the arrays the step hands to collectives,
  read off the collectives themselves while the step is traced: sent, their
  bytes; received, ``(N − 1)×`` a gather's, ``(N − 1)/N`` of an
  all-to-all's, a ring's ``2(N − 1)/N`` of a reduction's (rounded up per
  collective: a fused reduction of ``k`` messages counts up to ``k − 1``
  bytes more as its messages). A round inside a conditional
  (:func:`jaxcomp.parallel.replicated_cond`: 3LC's fallback, local steps'
  exchange on the last step, 1-bit Adam's warm-up) runs only sometimes: its
  bytes bound the count from above.

The gradients are small dyadic numbers (:func:`_grads`), so that a tensor
left in float sums exactly in any order (a ring all-reduce over more than
two workers adds in an order that depends on where a value sits in its
buffer: :mod:`jaxcomp.exchange.buckets`).

Compilation dominates (two programs an example), so trees are tiny and the
suite's run is bounded: profile ``exchange-suite``, a fixed seed
(``derandomize``) and :data:`SUITE_EXAMPLES` examples a name, about a minute
on two cores. The long run, 50 new examples a name (about two hours on two shared cores;
``--timeout=0`` lifts the suite's per-test limit)::

  .venv/bin/python -m pytest tests/test_exchange_fuzz.py -p no:cacheprovider --timeout=0 \
      --hypothesis-profile=exchange-long
"""

import contextlib
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import parallel

from _layouts import device_update, on_mesh

SUITE_EXAMPLES = 2  # a name: the simplest example (one empty tensor, 2 workers) and one drawn
settings.register_profile("exchange-suite", max_examples=SUITE_EXAMPLES, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _profile() -> settings:
  """The suite's profile, unless ``--hypothesis-profile`` loaded one of this file's (``exchange-long``,
  tests/conftest.py).

  Any other profile is the suite's: hypothesis loads its own ``ci`` profile (100 examples) where
  the environment says CI (``CI=true``), which would make this property a hundred compilations a name.
  """
  loaded = settings.get_current_profile_name()
  return settings.get_profile(loaded if loaded.startswith("exchange-") else "exchange-suite")

# 0, 1, primes, and sizes no worker count (2..5) or packing group (4, 5, 8, 32) divides.
SIZES = (0, 1, 2, 3, 5, 7, 11, 13, 31, 37, 61, 97, 127, 131, 257, 331)
ROUTES = ("all_gather", "two_phase", "auto")
ROUNDED = ("powersgd",)  # matrix products: a few ulp (jaxcomp.exchange.buckets)
# 1-bit Adam multiplies its float warm-up's mean by (1 − β1). XLA folds the constants, (s/N)·0.1 →
# s·(0.1/N), in a tensor's own program and not where a bucket's slice stands between them: for N
# not a power of two the momenta then differ by an ulp, and later by a flipped sign of its 1-bit
# code. The exchanges themselves are the property's "none" and "ef_signsgd" at every N.
POWER_OF_TWO_WORKERS = ("onebit_adam",)


def _transform(name: str, axis, bucket_bytes: int, route: str, min_size: int):
  """``name``'s update (the optimizer a plain SGD), or None where it refuses ``route``.

  The wrappers exchange TernGrad's payloads (local steps and DiLoCo every second step,
  1-bit Adam compressed from the second) and take the all-gather only.
  """
  kwargs = dict(axis_name=axis, bucket_bytes=bucket_bytes, min_size=min_size)
  wrapper = {"local_steps": dict(k=2, exchange="terngrad"), "diloco": dict(inner_steps=2, exchange="terngrad"),
             "onebit_adam": dict(freeze_step=1)}.get(name)
  if wrapper is not None:
    return jaxcomp.make_optimizer(name, optax.sgd(0.125), **wrapper, **kwargs) if route == "all_gather" else None
  if name == "dgc":
    kwargs["warmup_steps"] = 0
  try:
    return jaxcomp.make_optimizer(name, optax.sgd(0.125), exchange=route, **kwargs)
  except ValueError as e:
    if "two_phase" in str(e) or "exchange" in str(e):
      return None
    raise


@dataclasses.dataclass
class _Wire:
  """The collectives a traced step hands its arrays to: ``(kind, bytes, conditional)`` each."""

  workers: int
  calls: list = dataclasses.field(default_factory=list)
  conditional: int = 0  # inside a conditional round's lax.cond
  abstract: int = 0  # inside jax.eval_shape: traced for its shapes, never run

  def add(self, kind: str, tree) -> None:
    if self.abstract:
      return
    self.calls.append((kind, sum(int(np.prod(jnp.shape(a), dtype=np.int64)) * jnp.result_type(a).itemsize
                                 for a in jax.tree.leaves(tree)), self.conditional > 0))

  def predicted(self) -> dict[str, int]:
    """Sent and received over the rounds that always run, and the bytes of those that may."""
    sure = [(k, b) for k, b, c in self.calls if not c]
    maybe = [(k, b) for k, b, c in self.calls if c]
    return {"sent": sum(b for _, b in sure),
            "received": sum(self.received(k, b) for k, b in sure),
            "reductions": sum(k in ("max", "sum", "mean") for k, _ in sure),
            "maybe_sent": sum(b for _, b in maybe),
            "maybe_received": sum(self.received(k, b) for k, b in maybe)}

  def received(self, kind: str, nbytes: int) -> int:
    """What reaches one worker when each hands ``nbytes`` to a collective of ``kind`` (the
    definitions of :mod:`jaxcomp.exchange.transport`, written out again here)."""
    n = self.workers
    if kind == "gather":
      return (n - 1) * nbytes
    if kind == "all_to_all":
      return nbytes // n * (n - 1)
    return -(-2 * (n - 1) * nbytes // n)


@contextlib.contextmanager
def _watch(workers: int):
  """Records every collective over a device axis that the step traced meanwhile."""
  wire = _Wire(workers)
  real = {name: getattr(parallel, name) for name in ("all_gather", "all_to_all", "_reduce", "replicated_cond")}

  def on_device(axis_name) -> bool:
    return any(parallel.is_device_axis(n) for n in parallel.axis_names(axis_name))

  def gather(tree, axis_name):
    if on_device(axis_name):
      wire.add("gather", tree)
    return real["all_gather"](tree, axis_name)

  def all_to_all(tree, axis_name):
    if on_device(axis_name):
      wire.add("all_to_all", tree)
    return real["all_to_all"](tree, axis_name)

  def reduce(kind, tree, axis_name):
    if on_device(axis_name):
      wire.add(kind, tree)
    return real["_reduce"](kind, tree, axis_name)

  def within(counter: str, fn):
    def counted(*args, **kwargs):
      setattr(wire, counter, getattr(wire, counter) + 1)
      try:
        return fn(*args, **kwargs)
      finally:
        setattr(wire, counter, getattr(wire, counter) - 1)
    return counted

  with pytest.MonkeyPatch.context() as m:
    m.setattr(parallel, "all_gather", gather)
    m.setattr(parallel, "all_to_all", all_to_all)
    m.setattr(parallel, "_reduce", reduce)
    m.setattr(parallel, "replicated_cond", within("conditional", real["replicated_cond"]))
    m.setattr(jax, "eval_shape", within("abstract", jax.eval_shape))
    yield wire


def _grads(sizes, workers: int, step: int):
  """Per-worker gradients: multiples of 2**-6 below 1 in magnitude, times a power of two per tensor.

  Their sums over 5 workers are exact in float32 in any order: a tensor left in float is
  summed by a ring all-reduce whose order, over more than two workers, depends on where the
  values sit in its buffer (:mod:`jaxcomp.exchange.buckets`); here that order cannot move a bit.
  """
  rng = np.random.default_rng(1000 * step + len(sizes))
  return {f"t{i}": jnp.asarray(rng.integers(-63, 64, (workers, n)).astype(np.float32)
                               * np.float32(2.0 ** (int(rng.integers(-4, 4)) - 6)))
          for i, n in enumerate(sizes)}


def _run(name, sizes, workers, bucket_bytes, route, min_size):
  """Two steps over ``workers`` devices: the updates, the states, each step's metrics, and the wire."""
  tx = _transform(name, "d", bucket_bytes, route, min_size)
  if tx is None:
    return None
  params = jax.tree.map(lambda g: g[0], _grads(sizes, workers, 0))
  state = parallel.replicate_workers(tx.init(params), workers)
  mesh = jax.make_mesh((workers,), ("d",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:workers])
  specs = parallel.worker_specs(state, "d")
  step = on_mesh(jax.jit(jax.shard_map(device_update(tx), mesh=mesh, in_specs=(P("d"), specs),
                                       out_specs=(P(), specs))), mesh, "d", state)
  out = []
  with _watch(workers) as wire:
    for t in range(2):
      upd, state = step(_grads(sizes, workers, t), state)
      out.append((upd, state, jaxcomp.metrics(state)))
  return jax.device_get(out), wire


def _value(v):
  """A metric's exact value (a Count's is a Fraction: a mean over workers)."""
  return v.value() if hasattr(v, "value") else int(np.asarray(v))


def _check_wire(out, wire, case: str, fused_reductions: int = 0) -> None:
  """Each step's counted bytes against the collectives' (``fused_reductions``: how many reduction
  messages a bucketed run may have fused, each rounding its ring share up on its own)."""
  want = wire.predicted()
  for _, _, metrics in out:
    sent = _value(metrics["bytes_on_wire"])
    assert want["sent"] <= sent <= want["sent"] + want["maybe_sent"], (case, sent, want)
    if "received_bytes" in metrics:
      received = _value(metrics["received_bytes"])
      assert 0 <= received - want["received"] <= want["maybe_received"] + fused_reductions, (case, received, want)


@pytest.mark.parametrize("name", jaxcomp.names())
@settings(_profile())
@given(sizes=st.lists(st.sampled_from(SIZES), min_size=1, max_size=3),
       workers=st.integers(2, 5),
       bucket_bytes=st.sampled_from([1, 64, 600, 10**6]),
       route=st.sampled_from(ROUTES),
       min_size=st.sampled_from([0, 3, 40]))
def test_buckets_equal_per_tensor_and_the_wire_is_what_the_collectives_move(
    name, sizes, workers, bucket_bytes, route, min_size):
  assume(name not in POWER_OF_TWO_WORKERS or workers in (2, 4))
  ref = _run(name, sizes, workers, 0, route, min_size)
  assume(ref is not None)  # not a route the compressor refuses (it says why)
  got = _run(name, sizes, workers, bucket_bytes, route, min_size)
  case = f"{name} sizes={sizes} N={workers} bucket_bytes={bucket_bytes} {route} min_size={min_size}"
  for a, b in zip(jax.tree.leaves(ref[0]), jax.tree.leaves(got[0])):
    a, b = np.asarray(a), np.asarray(b)
    if name in ROUNDED and np.issubdtype(a.dtype, np.floating):
      np.testing.assert_array_max_ulp(a, b, maxulp=4)
    else:
      np.testing.assert_array_equal(a, b, err_msg=case)
  _check_wire(*ref, case)
  _check_wire(*got, case, fused_reductions=ref[1].predicted()["reductions"])
