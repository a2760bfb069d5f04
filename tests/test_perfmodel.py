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
