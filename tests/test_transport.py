"""The transport counts every byte an exchange moves, from its messages (jaxcomp.exchange.transport)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import jaxcomp
from jaxcomp import core
from jaxcomp.exchange import buckets
from jaxcomp.exchange import plan
from jaxcomp.exchange import transport
from jaxcomp.exchange import two_phase

from _layouts import require_devices

pytestmark = pytest.mark.accelerator

W = 4


def _rounds(x):
  """An exchange of every kind: a max of 2 float32, a gather of 3 uint8, an all-to-all of W rows of 2 int32."""
  top = yield core.Message("max", jnp.stack([x, -x]))
  gathered = yield core.Message("gather", jnp.full((3,), x, jnp.uint8))
  rows = yield core.Message("all_to_all", jnp.arange(2 * W, dtype=jnp.int32).reshape(W, 2) + x.astype(jnp.int32))
  return top, gathered, rows


def _counted_under_vmap(steps_fn, xs):
  return jax.jit(jax.vmap(lambda x: transport.counted(steps_fn(x), "w"), axis_name="w", out_axes=(0, None)))(xs)


def test_every_kind_counts_sent_and_received():
  (top, gathered, rows), traffic = _counted_under_vmap(_rounds, jnp.arange(W, dtype=jnp.float32))
  np.testing.assert_array_equal(top[0], [W - 1, 0])
  assert gathered.shape == (W, W, 3) and rows.shape == (W, W, 2)
  sent = 8 + 3 + 8 * W
  received = transport.allreduce_received(8, W) + (W - 1) * 3 + (W - 1) * 8
  assert (traffic.sent, traffic.received, traffic.encoded) == (sent, received, sent)
  assert traffic.sent.is_static  # known while tracing: the plan reads it without running


def test_a_conditional_round_runs_and_counts_only_where_it_holds():
  def steps(x, fallback):
    out = yield core.Message("gather", x, when=fallback, encoded=0)
    return out

  for fallback in (False, True):
    out, traffic = _counted_under_vmap(lambda x: steps(x, jnp.bool_(fallback)), jnp.ones((W, 5)))
    np.testing.assert_array_equal(out, np.ones((W, W, 5)) if fallback else 0)
    assert (int(traffic.sent), int(traffic.received), int(traffic.encoded)) == (
        (20, 3 * 20, 0) if fallback else (0, 0, 0))


def test_counts_hold_past_32_bits():
  """A conditional gather of 6 GB (shapes only: nothing is allocated) counts exactly."""
  big = jax.ShapeDtypeStruct((3 * 2**29,), jnp.float32)
  traffic = transport.Traffic()
  traffic.add(core.Message("gather", big, when=jnp.bool_(True)), workers=8)
  traffic.add(core.Message("gather", big), workers=8)
  assert int(traffic.sent) == 2 * 6 * 2**30 and int(traffic.received) == 7 * 2 * 6 * 2**30


def test_one_worker_counts_what_it_would_hand():
  x = jnp.arange(10.0)
  ex, traffic = transport.counted(jaxcomp.exchange.allgather.exchange_steps(jaxcomp.Int8(), x, jax.random.PRNGKey(0),
                                                                             None), None)
  assert ex.mean.shape == x.shape
  assert (traffic.sent, traffic.received) == (10 + 4, 0)  # the int8 codes and a float32 scale


def test_the_plan_predicts_what_the_transport_counts_in_a_step():
  """plan.traffic (an abstract trace) equals the bytes a real two-phase exchange counts, for several sizes."""
  comp = jaxcomp.TernGrad()
  for n in (1000, 4096, 40 * W + 1):
    xs = jax.random.normal(jax.random.PRNGKey(n), (W, n))
    keys = jax.random.split(jax.random.PRNGKey(1), W)
    _, traffic = jax.jit(jax.vmap(lambda x, k: transport.counted(two_phase.two_phase_steps(comp, x, k, "w"), "w"),
                                  axis_name="w", out_axes=(0, None)))(xs, keys)
    assert plan.traffic(comp, n, W, "two_phase") == plan.Bytes(int(traffic.sent), int(traffic.received))


def test_fused_buckets_count_each_exchange_as_it_travels():
  """Over devices, buckets.run fuses the messages: each step's sent bytes are its own, as when alone."""
  require_devices(W)
  mesh = jax.make_mesh((W,), ("d",))

  def step(x):
    steps = [_rounds(x[0] + i) for i in range(3)]
    fused_results, fused = buckets.run(steps, [4, 4, 4], 1, "d")
    alone = [transport.counted(_rounds(x[0] + i), "d")[1] for i in range(3)]
    return ([f.sent.static for f in fused], [a.sent.static for a in alone],
            [f.received.static for f in fused], [a.received.static for a in alone])

  fused_sent, alone_sent, fused_received, alone_received = _static_counts(step, mesh)
  assert fused_sent == alone_sent
  # Buckets go from the last step to the first; the first step's "max" rides the first bucket's
  # all-gather, two buckets ahead: it arrives N − 1 times, not as a ring's share.
  assert fused_received[1:] == alone_received[1:]
  assert fused_received[0] == alone_received[0] - transport.allreduce_received(8, W) + (W - 1) * 8


def _static_counts(step, mesh):
  """What ``step`` returns, traced abstractly under shard_map (the counts are static)."""
  out = {}

  def body(x):
    out["counts"] = step(x)
    return jnp.zeros(())

  x = jax.ShapeDtypeStruct((W,), jnp.float32, sharding=jax.sharding.NamedSharding(mesh, P("d")))
  jax.eval_shape(jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=P()), x)
  return out["counts"]
