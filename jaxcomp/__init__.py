"""jaxcomp: data-parallel training with compressed gradient exchange.

Compressors are optax transforms::

    tx = optax.chain(jaxcomp.terngrad(axis_name="workers"), optax.sgd(0.01, momentum=0.9))

Inside ``vmap``/``pmap``/``shard_map`` over ``"workers"`` the transform
quantizes each worker's gradients, moves the packed codes with
``lax.all_gather`` and returns the average; ``jaxcomp.metrics(opt_state)``
reports the bytes that crossed the wire.

``jaxcomp.data_parallel(worker_step, tx, mesh=...)`` turns one worker's
step into the jitted step over every worker, its state laid out.

The public API is ``__all__``: the entry point, the transform and its metrics, the
compressors (a factory and a class each), the registry configs pick them
from, and the modules ``core`` (the compressor protocol), ``parallel``
(collectives, laying states over workers), ``flax_nnx`` (laying an
``nnx.Optimizer``'s state over workers), ``rng``, ``codecs`` and
``models``. Each thing has one public name: the compressor classes are
``jaxcomp.TernGrad`` etc., not ``jaxcomp.compressors.TernGrad``.
"""

from jaxcomp import codecs
from jaxcomp import core
from jaxcomp import flax_nnx
from jaxcomp.exchange import hierarchy
from jaxcomp import models
from jaxcomp import parallel
from jaxcomp import rng
from jaxcomp import sharded
from jaxcomp.compressors import REGISTRY, get_transform, make_optimizer, names
from jaxcomp.compressors.terngrad import TernGrad, terngrad
from jaxcomp.compressors.qsgd import QSGD, qsgd
from jaxcomp.compressors.threelc import ThreeLC, threelc
from jaxcomp.compressors.int8 import Int8, int8
from jaxcomp.compressors.stochastic_ternary import StochasticTernary, stochastic_ternary
from jaxcomp.compressors.signsgd import SignSGD, signsgd
from jaxcomp.compressors.ef_signsgd import EFSignSGD, ef_signsgd
from jaxcomp.compressors.onebit import OneBit, onebit
from jaxcomp.compressors.topk import TopK, topk
from jaxcomp.compressors.powersgd import PowerSGD, powersgd
from jaxcomp.compressors.diloco import DiLoCoState, diloco, local_params
from jaxcomp.compressors.local_steps import local_steps
from jaxcomp.compressors.onebit_adam import OneBitAdamSign, onebit_adam
from jaxcomp.compressors.threshold import Threshold, threshold
from jaxcomp.compressors.adaptive import Adaptive, adaptive
from jaxcomp.compressors.signum import Signum, signum
from jaxcomp.compressors.dgc import DGC, dgc, dgc_warmup_schedule
from jaxcomp.compressors.half import Half, half
from jaxcomp.compressors.randomk import RandomK, randomk
from jaxcomp.compressors.natural import Natural, natural
from jaxcomp.compressors.fp4 import FP4, fp4
from jaxcomp.compressors.blockint import BlockInt, blockint
from jaxcomp.compressors.demo import DCTTopK, demo
from jaxcomp.count import Count
from jaxcomp.data_parallel import DataParallel, data_parallel
from jaxcomp.metrics import metrics
from jaxcomp.sharded import PerShardState, per_shard
from jaxcomp.transforms import CompressState, compress, path_str, skip_by_path
from jaxcomp.wrappers import ApplyIfFiniteState, apply_if_finite, multi_steps
from jaxcomp.zero import ShardedOptimizerState, clip_by_global_norm, global_norm, shard_optimizer

__version__ = "0.1.0"

__all__ = [
    # the entry point: a per-worker step in, the compiled data-parallel step out
    "data_parallel",
    "DataParallel",
    # the transform, and reading its metrics
    "compress",
    "CompressState",
    "skip_by_path",
    "path_str",
    "metrics",
    "Count",
    # optax wrappers around a compressed chain
    "multi_steps",
    "apply_if_finite",
    "ApplyIfFiniteState",
    # model-sharded parameters: compress each device's shard
    "per_shard",
    "PerShardState",
    # optimizer states sharded over the workers (ZeRO-1/2): each updates its shard
    "shard_optimizer",
    "ShardedOptimizerState",
    "clip_by_global_norm",
    "global_norm",
    # the compressors: optax transform factories ...
    "terngrad",
    "qsgd",
    "threelc",
    "int8",
    "stochastic_ternary",
    "signsgd",
    "ef_signsgd",
    "onebit",
    "topk",
    "powersgd",
    "threshold",
    "adaptive",
    "signum",
    "dgc",
    "dgc_warmup_schedule",
    "half",
    "randomk",
    "natural",
    "fp4",
    "blockint",
    "local_steps",
    "diloco",
    "local_params",
    "DiLoCoState",
    "onebit_adam",
    "demo",
    # ... and their per-tensor compressors (jaxcomp.core.Compressor subclasses)
    "TernGrad",
    "QSGD",
    "ThreeLC",
    "Int8",
    "StochasticTernary",
    "SignSGD",
    "EFSignSGD",
    "OneBit",
    "TopK",
    "PowerSGD",
    "Threshold",
    "Adaptive",
    "OneBitAdamSign",
    "Signum",
    "DGC",
    "Half",
    "RandomK",
    "Natural",
    "FP4",
    "BlockInt",
    "DCTTopK",
    # the registry experiment configs pick compressors from
    "REGISTRY",
    "get_transform",
    "make_optimizer",
    "names",
    # modules
    "core",
    "parallel",
    "hierarchy",
    "sharded",
    "rng",
    "codecs",
    "models",
    "flax_nnx",
]
