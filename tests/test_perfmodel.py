"""TernGrad's performance model (Appendix B, Eq. 27-30): hand-computed cases and limits."""

import math

import jax
import jax.numpy as jnp
import pytest

from jaxcomp import perfmodel as pm
from jaxcomp.compressors.terngrad import TernGrad

# C_gwd = 10 GB/s, C_cwd = 2 GB/s, C_nwd = 0.1 GB/s, C_ncost = 1 ms; 4 GPUs per machine.
C = pm.Cluster("test", 4, gpu_bandwidth=1e10, cpu_bandwidth=2e9, network_bandwidth=1e8,
               network_latency=1e-3)
INF = pm.Cluster("ideal", 4, math.inf, math.inf, math.inf, 0.0)


def test_comm_time_by_hand():
  # |g| = 1 GB, i = 4, j = 2: 1e9/1e10 * 2 + 1e9/2e9 + (1e-3 + 1e9/1e8) * 1 = 0.2 + 0.5 + 10.001
  assert pm.comm_time(4, 2, 1e9, C) == pytest.approx(10.701)
  # One machine: no network term; one GPU: only the GPU-to-CPU copy.
  assert pm.comm_time(4, 1, 1e9, C) == pytest.approx(0.7)
  assert pm.comm_time(1, 1, 1e9, C) == pytest.approx(0.5)


def test_strong_scaling_by_hand():
  # Eq. 27 with T(1,1,K) = 2.5 s, |g| = 1 GB, N = 8: (2.5 - 0.5)/8 + 10.701 = 10.951 s.
  assert pm.strong_time(4, 2, 2.5, 1e9, C) == pytest.approx(10.951)
  assert pm.strong_throughput(256, 4, 2, 2.5, 1e9, C) == pytest.approx(256 / 10.951)  # Eq. 28


def test_weak_scaling_by_hand():
  # Eq. 29: T(1,1,K) + |g|/C_gwd log2 i + (C_ncost + |g|/C_nwd) log2 j = 2.5 + 0.2 + 10.001.
  assert pm.weak_time(4, 2, 2.5, 1e9, C) == pytest.approx(12.701)
  assert pm.weak_throughput(32, 4, 2, 2.5, 1e9, C) == pytest.approx(8 * 32 / 12.701)  # Eq. 30
  # Eq. 29 is Eq. 27's sum with the computation not divided by N.
  assert pm.weak_time(4, 2, 2.5, 1e9, C) == pytest.approx(
      pm.comp_time_strong(4, 2, 2.5, 1e9, C) * 8 + pm.comm_time(4, 2, 1e9, C))


def test_one_gpu_is_the_profiled_time():
  for t in (0.01, 1.0):
    assert pm.strong_time(1, 1, t, 1e8, C) == pytest.approx(t)
    assert pm.weak_time(1, 1, t, 1e8, C) == pytest.approx(t)


def test_infinite_bandwidth_scales_linearly():
  for n in (1, 4, 8, 512):
    i, j = pm.layout(n, 4)
    assert pm.strong_throughput(128, i, j, 0.5, 1e9, INF) == pytest.approx(n * 128 / 0.5)
    assert pm.weak_throughput(128, i, j, 0.5, 1e9, INF) == pytest.approx(n * 128 / 0.5)


def test_compression_ratio_divides_every_communication_term():
  r = 16.0
  for i, j in ((1, 1), (4, 1), (4, 8)):
    assert pm.comm_time(i, j, 1e9 / r, C) == pytest.approx(
        (pm.comm_time(i, j, 1e9, C) - C.network_latency * math.log2(j)) / r
        + C.network_latency * math.log2(j))
  # Communication-bound limit: the weak-scaling speedup tends to the ratio.
  slow_net = pm.Cluster("slow", 4, math.inf, math.inf, 1e3, 0.0)
  fast = pm.weak_throughput(1, 4, 64, 1e-9, 1e9 / r, slow_net)
  assert fast / pm.weak_throughput(1, 4, 64, 1e-9, 1e9, slow_net) == pytest.approx(r, rel=1e-6)


def test_layout_fills_machines():
  assert pm.layout(1, 4) == (1, 1)
  assert pm.layout(2, 4) == (2, 1)
  assert pm.layout(8, 4) == (4, 2)
  assert pm.layout(512, 4) == (4, 128)
  with pytest.raises(ValueError):
    pm.layout(6, 4)


def test_assumed_times():
  assert pm.compute_time(3e9, 128, 8e12, 0.5) == pytest.approx(3e9 * 128 / 4e12)
  assert pm.profiled_time(0.1, 2e9, C) == pytest.approx(1.1)


def test_gradient_bytes_use_the_real_payload():
  shapes = {"conv": {"kernel": jax.ShapeDtypeStruct((10,), jnp.float32)},
            "logits": {"kernel": jax.ShapeDtypeStruct((3,), jnp.float32)}}
  assert pm.gradient_bytes(shapes) == 4 * 13
  # TernGrad: ceil(10/4) = 3 bytes of 2-bit codes + float32 scalar + float32 agreed scalar.
  tern = TernGrad()
  assert pm.gradient_bytes(shapes, tern) == (3 + 4 + 4) + (1 + 4 + 4)
  assert pm.gradient_bytes(shapes, tern, lambda path, shape: "logits" in path) == 11 + 12


def test_vgg_a_parameter_count():
  """Simonyan & Zisserman Table 1 (A): 132,863,336 parameters (Table 2: 133M)."""
  v = jax.eval_shape(lambda: pm.VGGA().init(jax.random.PRNGKey(0), jnp.zeros((1, 224, 224, 3))))
  assert sum(math.prod(x.shape) for x in jax.tree.leaves(v)) == 132_863_336


# -- each exchange's bytes and time on a link (bandwidth B, latency alpha) --------------------

from jaxcomp.compressors.qsgd import QSGD  # noqa: E402
from jaxcomp.compressors.threelc import ThreeLC  # noqa: E402
from jaxcomp.exchange import plan
from jaxcomp.exchange import transport


def test_exchange_costs_by_hand():
  # 3LC (no agreement) on 4,000 values, 4 workers, B = 1 MB/s, alpha = 1 ms.
  # Float ring: 2*3/4 * 16,000 = 24,000 bytes in 6 steps: 6 ms + 24 ms.
  # All-gather: 800 base-3^5 bytes + 4 for m; 3 * 804 = 2,412 bytes in 3 steps.
  # Two-phase: chunks of 1,000 -> 200 + 4 bytes, chunk and shard: 3 * (204 + 204) = 1,224 in 6 steps.
  c = pm.exchange_costs(ThreeLC(), 4000, 4, 1e6, 1e-3)
  assert c["float"] == pm.ExchangeCost(24_000, pytest.approx(0.006 + 0.024))
  assert c["all_gather"] == pm.ExchangeCost(2_412, pytest.approx(0.003 + 0.002412))
  assert c["two_phase"] == pm.ExchangeCost(1_224, pytest.approx(0.006 + 0.001224))
  # TernGrad agrees on its scalar first: one more all-reduce (2(N-1) steps, a ring's bytes).
  t = pm.exchange_costs(TernGrad(), 4000, 4, 1e6, 1e-3)
  assert t["all_gather"].bytes == 3 * (1000 + 4) + 6  # 4 agreed bytes: a ring receives 2*3/4 of them
  assert t["all_gather"].seconds == pytest.approx(9e-3 + t["all_gather"].bytes / 1e6)
  assert t["two_phase"].bytes == 3 * (254 + 254) + 24  # 4 chunks' scalars agreed: 16 bytes
  assert pm.exchange_costs(None, 4000, 4, 1e6, 1e-3).keys() == {"float"}


@pytest.mark.parametrize("comp", [TernGrad(), QSGD(), ThreeLC()], ids=["terngrad", "qsgd", "threelc"])
def test_two_phase_bytes_do_not_grow_with_workers(comp):
  """Two-phase stays within 1.1 x 2(N-1)/N·P; the all-gather's (N-1)·P passes the float ring from N = 2r on."""
  from jaxcomp.exchange import two_phase

  n = 4 << 20
  p = plan.traffic(comp, n, 2, "all_gather").sent  # P: the all-gather's bytes_on_wire, agreement included
  r = 4 * n / p
  for workers in (4, 8, 64, 1024):
    c = pm.exchange_costs(comp, n, workers, 1e9, 0.0)
    assert c["two_phase"].bytes <= 1.1 * 2 * (workers - 1) / workers * p
    assert c["two_phase"].bytes < c["float"].bytes
    assert c["all_gather"].bytes == pytest.approx((workers - 1) * p, rel=1e-5)
    assert (c["all_gather"].bytes > c["float"].bytes) == (workers > 2 * r)


# ---------------------------------------------------------------------------------------------
# TG-F5's exchange charges and break-even N (experiments/perfmodel_estimates.py).


def _break_even_compressors():
  from experiments import perfmodel_estimates as est

  return {"terngrad": est.make_compressor("terngrad", {"clip_sigma": 2.5}),
          "qsgd_4bit": est.make_compressor("qsgd", {"bits_per_value": 4, "bucket_size": 512}),
          "threelc": est.make_compressor("threelc", {"sparsity": 1.0, "zero_run": False})}


def test_break_even_compressors_are_the_named_ones():
  c = _break_even_compressors()
  assert (c["qsgd_4bit"].levels, c["qsgd_4bit"].bucket_size) == (7, 512)
  assert (c["threelc"].sparsity, c["threelc"].zero_run) == (1.0, False)


@pytest.mark.parametrize("name,expected", [("terngrad", 32), ("qsgd_4bit", 16), ("threelc", 40)])
def test_break_even_workers_against_a_direct_scan(name, expected):
  """The solver's N is the first N at which plan.traffic(..., "all_gather") passes allreduce_received."""
  from experiments import perfmodel_estimates as est
  from jaxcomp.exchange import two_phase

  comp = _break_even_compressors()[name]
  over = lambda n, w: plan.traffic(comp, n, w, "all_gather").received > transport.allreduce_received(4 * n, w)
  # The scan (a trace per N) at one size shows the sign changes once; at the others, that the
  # solver's N is where it changes.
  scan = next(w for w in range(2, 1000) if over(1 << 20, w))
  assert est.break_even_workers(comp, 1 << 20) == scan
  for n in (60_966_600, 7_005_832):
    found = est.break_even_workers(comp, n)
    assert over(n, found) and not over(n, found - 1)
  # And the closed form it should match: (N-1)·P > 2(N-1)/N·4n  <=>  N > 8n/P (P ~ 2, 4.06, 1.6 bits/value).
  assert scan == expected


def test_break_even_small_tensors_and_limit():
  """Small tensors (scalars weigh more) against the direct scan; ``None`` when not below ``limit``."""
  from experiments import perfmodel_estimates as est
  from jaxcomp.exchange import two_phase

  for comp in _break_even_compressors().values():
    for n in (4, 40, 400):
      scan = next(w for w in range(2, 1000)
                  if plan.traffic(comp, n, w, "all_gather").received > transport.allreduce_received(4 * n, w))
      assert est.break_even_workers(comp, n) == scan
  assert est.break_even_workers(_break_even_compressors()["terngrad"], 1 << 20, limit=8) is None


@pytest.mark.slow
def test_two_phase_never_crosses_the_float_ring_where_it_splits():
  from experiments import perfmodel_estimates as est
  from jaxcomp.exchange import two_phase

  for comp in _break_even_compressors().values():
    n = 7_005_832
    r = est.two_phase_vs_float(comp, n, [2 ** k for k in range(1, 17)])
    assert r["first_crossing"] is None and r["max_ratio"] < 0.2
    for w in r["workers_checked"]:
      assert (plan.traffic(comp, n, w, "two_phase").received
              < transport.allreduce_received(4 * n, w))
    assert all(two_phase.split(comp, n, w) is None for w in r["too_small_to_split"])
  qsgd = _break_even_compressors()["qsgd_4bit"]  # chunks of whole 512-value buckets: 7M splits up to 13,683
  assert est.two_phase_vs_float(qsgd, 7_005_832, [8192, 16384])["too_small_to_split"] == [16384]


def test_charged_bytes_keep_float_and_scale_the_exchanges():
  """Float keeps |g| = 4n; the all-gather is charged N·P/2, the two-phase exchange about P."""
  from experiments import perfmodel_estimates as est
  from jaxcomp.exchange import two_phase

  comp = TernGrad()
  n, cache = 1 << 22, {}
  sizes = [(n, False), (1000, True)]  # one compressed tensor, one kept in float32 (last layer)
  g_float = 4 * (n + 1000)
  for w in (2, 8, 64):
    rf = est.model_received_bytes(sizes, comp, w, "float", cache)
    assert rf == transport.allreduce_received(4 * n, w) + transport.allreduce_received(4000, w)
    ag = est.model_received_bytes(sizes, comp, w, "all_gather", cache)
    assert ag == plan.traffic(comp, n, w, "all_gather").received + transport.allreduce_received(4000, w)
    tp = est.model_received_bytes(sizes, comp, w, "two_phase", cache)
    assert tp == plan.traffic(comp, n, w, "two_phase").received + transport.allreduce_received(4000, w)
    assert est.charged_bytes(g_float, rf, rf) == g_float
    p = n // 4  # 2-bit codes
    assert est.charged_bytes(g_float, ag, rf) == pytest.approx(w * p / 2 + 4000, rel=1e-3)
    assert est.charged_bytes(g_float, tp, rf) == pytest.approx(p + 4000, rel=0.02)
  # A tensor too small to split is exchanged by the all-gather, as jaxcomp's choose() does.
  assert est.received_bytes(comp, 100, 8, "two_phase") == plan.traffic(comp, 100, 8, "all_gather").received
