"""TernGrad's performance model of distributed data-parallel training (Appendix B).

Wen et al. (NeurIPS 2017), §5 and Appendix B, extend the model of Yan et al.
(KDD 2015, [44]) to GPU clusters: ``j`` machines with ``i`` GPUs each,
``N = i·j`` workers, all-reduce within and across machines. With ``|g|`` the
bytes of the exchanged gradient:

* Communication (Appendix B, in the text before Eq. 27)::

    T_comm(i, j, K, |g|) = |g|/C_gwd · log2 i + |g|/C_cwd + (C_ncost + |g|/C_nwd) · log2 j

  ``C_gwd``: GPU-to-GPU bandwidth within a machine; ``C_cwd``: GPU-to-CPU
  bandwidth; ``C_nwd``: network bandwidth; ``C_ncost``: network latency.
* Computation, strong scaling (before Eq. 27): every worker trains ``K/N`` of
  the mini-batch of ``K``::

    T_comp(i, j, K, |g|) = (T(1, 1, K, |g|) − |g|/C_cwd) / N

  where ``T(1, 1, K, |g|)`` is the profiled time of one mini-batch of ``K`` on
  one CPU + one GPU, which includes one GPU-to-CPU copy of ``|g|``.
* Eq. 27: ``T_strong = T_comp + T_comm``; Eq. 28: ``Tput_strong = K / T_strong``.
* Eq. 29 (weak scaling, ``K`` per worker, mini-batch ``N·K``)::

    T_weak = T(1, 1, K, |g|) + |g|/C_gwd · log2 i + (C_ncost + |g|/C_nwd) · log2 j

* Eq. 30: ``Tput_weak = N·K / T_weak``.

TernGrad enters only through ``|g|``: the bytes one worker sends
(:func:`gradient_bytes`, from the compressor's real payload: 2-bit codes plus
the float32 scalar and its agreement, and float32 for tensors kept in float).
As in the paper, every hop of the all-reduce is charged the same ``|g|``; the
sums of ternary codes need ``log2(2m+1)`` bits after ``m`` workers (§3.1), so
this is optimistic for TernGrad's later hops. Encoding/decoding time is not
modelled (the paper does not model it either).

We have no GPU: ``T(1, 1, K, |g|)`` is not profiled here but built from an
assumed sustained fraction of the GPU's peak FLOP/s (:func:`profiled_time`),
and every bandwidth and latency is an assumption. Everything this module
returns is a performance-model ESTIMATE, never a measurement. The assumed
inputs live in ``configs/terngrad_perfmodel.py``.

A second, simpler model compares the exchanges of one tensor on a link of
bandwidth ``B`` and latency ``α`` (:func:`exchange_costs`): the float ring
all-reduce, the compressed all-gather and the compressed two-phase exchange
(:mod:`jaxcomp.exchange.two_phase`), with the bytes each worker receives taken from
the compressors' real payloads.

References:
  Wen et al., *TernGrad*, NeurIPS 2017, Appendix B.
  Yan, Ruwase, He, Chilimbi, *Performance modeling and scalability
  optimization of distributed deep learning systems*, KDD 2015.
  Simonyan, Zisserman, *Very deep convolutional networks for large-scale
  image recognition*, ICLR 2015, Table 1 (configuration A) and Table 2.
  Thakur, Rabenseifner, Gropp, *Optimization of Collective Communication
  Operations in MPICH*, IJHPCA 2005 (ring and pairwise-exchange costs).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxcomp import core


@dataclasses.dataclass(frozen=True)
class Cluster:
  """The machine parameters of Appendix B (bandwidths in bytes/s, latency in s).

  Attributes:
    name: a label.
    gpus_per_machine: GPUs per machine (``i`` of a full machine).
    gpu_bandwidth: ``C_gwd``, GPU-to-GPU within a machine.
    cpu_bandwidth: ``C_cwd``, GPU-to-CPU.
    network_bandwidth: ``C_nwd``, between machines.
    network_latency: ``C_ncost``, per network hop.
  """

  name: str
  gpus_per_machine: int
  gpu_bandwidth: float
  cpu_bandwidth: float
  network_bandwidth: float
  network_latency: float


def layout(gpus: int, gpus_per_machine: int) -> tuple[int, int]:
  """``(i, j)``: GPUs per machine and machines, filling machines first (``N = i·j``)."""
  if gpus < 1 or gpus_per_machine < 1:
    raise ValueError(f"need gpus >= 1 and gpus_per_machine >= 1, got {gpus}, {gpus_per_machine}")
  i = min(gpus, gpus_per_machine)
  if gpus % i:
    raise ValueError(f"{gpus} GPUs do not fill machines of {gpus_per_machine} evenly")
  return i, gpus // i


def comm_time(i: int, j: int, g_bytes: float, c: Cluster) -> float:
  """``T_comm(i, j, K, |g|)`` (Appendix B): all-reduce within and across machines."""
  return (g_bytes / c.gpu_bandwidth * math.log2(i) + g_bytes / c.cpu_bandwidth
          + (c.network_latency + g_bytes / c.network_bandwidth) * math.log2(j))


def comp_time_strong(i: int, j: int, t_single: float, g_bytes: float, c: Cluster) -> float:
  """``T_comp(i, j, K, |g|) = (T(1,1,K,|g|) − |g|/C_cwd) / N`` (strong scaling)."""
  return (t_single - g_bytes / c.cpu_bandwidth) / (i * j)


def strong_time(i: int, j: int, t_single: float, g_bytes: float, c: Cluster) -> float:
  """Eq. 27: seconds per mini-batch of ``K`` spread over ``N = i·j`` workers."""
  return comp_time_strong(i, j, t_single, g_bytes, c) + comm_time(i, j, g_bytes, c)


def strong_throughput(k: int, i: int, j: int, t_single: float, g_bytes: float, c: Cluster) -> float:
  """Eq. 28: ``K / T_strong``, samples per second."""
  return k / strong_time(i, j, t_single, g_bytes, c)


def weak_time(i: int, j: int, t_single: float, g_bytes: float, c: Cluster) -> float:
  """Eq. 29: seconds per mini-batch of ``N·K`` (``K`` per worker)."""
  return (t_single + g_bytes / c.gpu_bandwidth * math.log2(i)
          + (c.network_latency + g_bytes / c.network_bandwidth) * math.log2(j))


def weak_throughput(k: int, i: int, j: int, t_single: float, g_bytes: float, c: Cluster) -> float:
  """Eq. 30: ``N·K / T_weak``, samples per second."""
  return i * j * k / weak_time(i, j, t_single, g_bytes, c)


def profiled_time(compute_sec: float, g_bytes: float, c: Cluster) -> float:
  """``T(1, 1, K, |g|)``: the single-GPU mini-batch time, compute plus one GPU-to-CPU copy.

  Appendix B's profiled time includes ``|g|/C_cwd`` (that is why Eq. 27
  subtracts it); with no GPU to profile we add it to an assumed compute time.
  """
  return compute_sec + g_bytes / c.cpu_bandwidth


def compute_time(train_flops_per_sample: float, k: int, peak_flops: float, efficiency: float) -> float:
  """ASSUMED compute time of ``k`` samples: FLOPs / (peak FLOP/s · sustained fraction)."""
  return train_flops_per_sample * k / (peak_flops * efficiency)


# ---------------------------------------------------------------------------------------------
# Gradient sizes |g|.


def gradient_bytes(shapes: Any, compressor: Optional[core.Compressor] = None,
                   keep_float: Callable[[str, tuple[int, ...]], bool] = lambda path, shape: False) -> int:
  """Bytes one worker sends per step for parameters of the given shapes.

  Args:
    shapes: a pytree of arrays or ``jax.ShapeDtypeStruct``.
    compressor: ``None`` for float32 gradients; else each tensor costs its
      payload's bytes (from ``jax.eval_shape`` of ``encode``, so the real wire
      format) plus the bytes of what workers agree on first (TernGrad's
      scalar sharing, Eq. 4).
    keep_float: ``(path, shape) -> bool``: tensors sent as float32 (e.g. the
      last layer, TernGrad §4.2).
  """
  total = 0
  key = jax.random.PRNGKey(0)
  for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
    shape = tuple(leaf.shape)
    n = core.size_of(shape)
    name = "/".join(str(getattr(p, "key", getattr(p, "name", p))) for p in path)
    if compressor is None or n == 0 or keep_float(name, shape):
      total += 4 * n
      continue
    x = jax.ShapeDtypeStruct(shape, jnp.float32)
    agreed = jax.eval_shape(compressor.agree, x)
    payload = jax.eval_shape(compressor.encode, x, key, agreed)
    total += core.tree_nbytes(payload) + (core.tree_nbytes(agreed) if agreed is not None else 0)
  return total


# ---------------------------------------------------------------------------------------------
# VGG-A (for Fig. 5; not a training model of this project).


VGG_A_CONVS = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGGA(nn.Module):
  """VGG configuration A (Simonyan & Zisserman 2015, Table 1): 8 conv 3x3 + 3 fc, 11 layers.

  Only for its size and FLOPs in the performance model (Fig. 5's "VggNet-A");
  224x224x3 input, no batch norm. 132,863,336 parameters for 1000 classes
  (Table 2 rounds it to 133M): convs 9,220,480, fc6 102,764,544, fc7
  16,781,312, logits 4,097,000.
  """

  num_classes: int = 1000

  @nn.compact
  def __call__(self, x, train: bool = False):
    del train
    conv = 0
    for v in VGG_A_CONVS:
      if v == "M":
        x = nn.max_pool(x, (2, 2), strides=(2, 2))
      else:
        conv += 1
        x = nn.relu(nn.Conv(v, (3, 3), padding="SAME", name=f"conv{conv}")(x))
    x = x.reshape((x.shape[0], -1))
    x = nn.relu(nn.Dense(4096, name="fc6")(x))
    x = nn.relu(nn.Dense(4096, name="fc7")(x))
    return nn.Dense(self.num_classes, name="logits")(x)


def model_stats(model: nn.Module, image_size: int = 224) -> dict[str, Any]:
  """Parameter shapes and forward FLOPs per image of a Flax model, without running it.

  ``flops`` is XLA's cost analysis of the lowered (not compiled) forward
  pass for one ``image_size``² RGB image.
  """
  x = jax.ShapeDtypeStruct((1, image_size, image_size, 3), jnp.float32)
  rngs = {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(0)}
  variables = jax.eval_shape(lambda: model.init(rngs, jnp.zeros(x.shape), train=False))
  lowered = jax.jit(lambda v, im: model.apply(v, im, train=False)).lower(variables, x)
  cost = lowered.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  params = variables["params"]
  return {"params": params, "param_count": sum(core.size_of(p.shape) for p in jax.tree.leaves(params)),
          "forward_flops": float(cost["flops"])}


# ---------------------------------------------------------------------------------------------
# One tensor's exchange on a link of bandwidth B and latency α (the α-β model).
#
# Every worker has one full-duplex link of ``B`` bytes/s; a message costs ``α + bytes/B``.
# Bandwidth-optimal collectives (Thakur, Rabenseifner, Gropp, *Optimization of Collective
# Communication Operations in MPICH*, IJHPCA 2005, §4-5), per worker, N workers:
#
# * float ring all-reduce of ``4n`` bytes: a reduce-scatter and an all-gather ring,
#   ``2(N−1)`` steps of ``4n/N``: ``2(N−1)/N·4n`` bytes, ``2(N−1)α + 2(N−1)/N·4n/B``;
# * compressed all-gather of ``P``-byte payloads (ring): ``(N−1)·P`` bytes, ``(N−1)α + (N−1)P/B``;
# * compressed two-phase (:mod:`jaxcomp.exchange.two_phase`): a pairwise all-to-all of ``N − 1``
#   chunk payloads ``p1``, then a ring all-gather of ``N − 1`` shard payloads ``p2``:
#   ``(N−1)(p1 + p2)`` bytes, ``2(N−1)α + (N−1)(p1 + p2)/B``.
#
# A compressor that agrees on scalars first (TernGrad's Eq. 4) adds a small all-reduce:
# its bytes (a ring's) and ``2(N−1)α``. Bytes are those one worker receives (= sends);
# encoding and decoding time is not modelled. Everything here is a model ESTIMATE.


@dataclasses.dataclass(frozen=True)
class ExchangeCost:
  """Bytes one worker receives per step for one tensor, and the modelled seconds."""

  bytes: int
  seconds: float


def ring_allreduce_cost(nbytes: int, workers: int, bandwidth: float, latency: float) -> ExchangeCost:
  """A float ring all-reduce of ``nbytes``: ``2(N−1)/N·nbytes`` in ``2(N−1)`` steps."""
  from jaxcomp.exchange import transport  # pylint: disable=g-import-not-at-top

  b = transport.allreduce_received(nbytes, workers)
  steps = 2 * (workers - 1)
  return ExchangeCost(bytes=b, seconds=steps * latency + b / bandwidth)


def _agreement(compressor: core.Compressor, workers: int) -> int:
  """All-reduce rounds of agreement before encoding (0 or 1)."""
  x = jax.ShapeDtypeStruct((8,), jnp.float32)
  return int(workers > 1 and jax.eval_shape(compressor.agree, x) is not None)


def all_gather_cost(compressor: core.Compressor, n: int, workers: int, bandwidth: float,
                    latency: float) -> ExchangeCost:
  """The compressed all-gather of a tensor of ``n`` values: ``(N−1)·P`` bytes in ``N − 1`` steps."""
  from jaxcomp.exchange import plan  # pylint: disable=g-import-not-at-top

  b = plan.traffic(compressor, n, workers, "all_gather").received
  steps = (workers - 1) * (1 + 2 * _agreement(compressor, workers))
  return ExchangeCost(bytes=b, seconds=steps * latency + b / bandwidth)


def two_phase_cost(compressor: core.Compressor, n: int, workers: int, bandwidth: float,
                   latency: float) -> Optional[ExchangeCost]:
  """The compressed two-phase exchange: ``(N−1)(p1 + p2)`` bytes in ``2(N−1)`` steps (``None``: too small)."""
  from jaxcomp.exchange import plan  # pylint: disable=g-import-not-at-top
  from jaxcomp.exchange import two_phase  # pylint: disable=g-import-not-at-top

  if two_phase.unsupported(compressor) or two_phase.split(compressor, n, workers) is None:
    return None
  tp = plan.traffic(compressor, n, workers, "two_phase")
  steps = (workers - 1) * (2 + 2 * _agreement(compressor, workers))
  return ExchangeCost(bytes=tp.received, seconds=steps * latency + tp.received / bandwidth)


def exchange_costs(compressor: Optional[core.Compressor], n: int, workers: int, bandwidth: float,
                   latency: float) -> dict[str, Optional[ExchangeCost]]:
  """``{"float": ..., "all_gather": ..., "two_phase": ...}`` for one tensor of ``n`` float32 values.

  ``two_phase`` is ``None`` when the tensor is too small to split (or the
  compressor runs its own exchange); without a compressor only ``float``.
  """
  out = {"float": ring_allreduce_cost(4 * n, workers, bandwidth, latency)}
  if compressor is not None:
    out["all_gather"] = all_gather_cost(compressor, n, workers, bandwidth, latency)
    out["two_phase"] = two_phase_cost(compressor, n, workers, bandwidth, latency)
  return out
