r"""TG-F5: performance-model ESTIMATES of throughput vs GPUs (TernGrad Fig. 5, Appendix B).

Usage::

  python -m experiments.perfmodel_estimates --config configs/terngrad_perfmodel.py --root runs

Computes each model's gradient bytes (float32, and TernGrad's real payload)
and forward FLOPs from the Flax models, turns the config's ASSUMED GPU speed
into T(1,1,K), and evaluates Eq. 29-30 (weak scaling, Fig. 5) or Eq. 27-28
for every GPU count on every cluster. TernGrad is charged three ways: the
paper's own charge (every hop moves the payload ``P``), and the two exchanges
jaxcomp runs, the compressed all-gather and the two-phase exchange
(:mod:`jaxcomp.exchange.two_phase`), each as the float ``|g|`` scaled by the bytes a
worker receives in that exchange over the bytes it receives in a float ring
all-reduce (:func:`charged_bytes`). It also solves, from the same byte
functions, the worker count at which the compressed all-gather starts to
receive more bytes than a float32 ring all-reduce (:func:`break_even_workers`).
Writes ``ROOT/TG-F5/<dataset>/<name>/``:
``config.json`` (the assumptions), ``summary.json`` (the estimates) and
``command.txt``. Nothing is measured: see :mod:`jaxcomp.perfmodel`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import sys
from typing import Optional

from absl import app
from absl import flags

from jaxcomp import core
from jaxcomp import models as models_lib
from jaxcomp import perfmodel as pm
from jaxcomp.exchange import plan
from jaxcomp.exchange import transport
from jaxcomp.exchange import two_phase
from jaxcomp.compressors.qsgd import QSGD
from jaxcomp.compressors.qsgd import levels_for_bits
from jaxcomp.compressors.terngrad import TernGrad
from jaxcomp.compressors.threelc import ThreeLC

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command-line flags; defined when run as a script, so the estimate helpers import
  cleanly beside other modules with flags (``experiments.train`` also has ``--config``)."""
  flags.DEFINE_string("config", "configs/terngrad_perfmodel.py", "The TG-F5 config file.")
  flags.DEFINE_string("root", "runs", "Root directory of the runs.")


def load_config(path: str):
  spec = importlib.util.spec_from_file_location("perfmodel_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


def build_model(name: str):
  return pm.VGGA() if name == "vgg_a" else models_lib.get_model(name, 1000)


def cluster_of(c: dict) -> pm.Cluster:
  return pm.Cluster(c["label"], c["gpus_per_machine"], c["gpu_bandwidth"], c["cpu_bandwidth"],
                    c["network_bandwidth"], c["network_latency"])


# ---------------------------------------------------------------------------------------------
# The exchanges' bytes, from jaxcomp's static byte functions.

EXCHANGES = ("all_gather", "two_phase")


def make_compressor(name: str, kwargs: dict) -> core.Compressor:
  """The compressors of the break-even table, by the names the configs use."""
  kwargs = dict(kwargs)
  if name == "terngrad":
    return TernGrad(**kwargs)
  if name == "qsgd":
    if "bits_per_value" in kwargs:
      kwargs["levels"] = levels_for_bits(kwargs.pop("bits_per_value"))
    return QSGD(**kwargs)
  if name == "threelc":
    return ThreeLC(**kwargs)
  raise ValueError(f"unknown compressor {name!r}; expected terngrad, qsgd or threelc.")


def received_bytes(compressor: core.Compressor, n: int, workers: int, exchange: str) -> int:
  """Bytes one worker receives per step for one tensor of ``n`` values.

  ``exchange``: ``"float"`` (a float32 ring all-reduce), ``"all_gather"`` or
  ``"two_phase"`` (a tensor too small to split falls back to the all-gather,
  as :func:`jaxcomp.exchange.plan.choose` does).
  """
  if exchange == "float" or workers < 2:
    return transport.allreduce_received(4 * n, workers)
  return plan.traffic(compressor, n, workers, plan.choose(compressor, n, workers, exchange)).received


def tensor_sizes(params, keep_float) -> list[tuple[int, bool]]:
  """``(n, kept_float)`` per tensor, paths named as :func:`jaxcomp.perfmodel.gradient_bytes` names them."""
  import jax  # pylint: disable=g-import-not-at-top

  out = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    shape = tuple(leaf.shape)
    name = "/".join(str(getattr(p, "key", getattr(p, "name", p))) for p in path)
    out.append((core.size_of(shape), bool(keep_float(name, shape))))
  return out


def model_received_bytes(sizes: list[tuple[int, bool]], compressor: core.Compressor, workers: int,
                         exchange: str, cache: dict) -> int:
  """Sum of :func:`received_bytes` over a model's tensors ``(n, kept_float)``."""
  total = 0
  for n, kept_float in sizes:
    ex = "float" if kept_float else exchange
    key = (n, workers, ex)
    if key not in cache:
      cache[key] = received_bytes(compressor, n, workers, ex)
    total += cache[key]
  return total


def charged_bytes(g_float: float, received: int, received_float: int) -> float:
  """The ``|g|`` Appendix B charges an exchange: the float ``|g|`` scaled by its received bytes.

  Appendix B charges every hop of the all-reduce the same ``|g|``; for
  float32 that is ``4n`` per tensor. An exchange whose worker receives
  ``R`` bytes where the float ring all-reduce receives ``R_float`` is
  charged ``|g_float| · R / R_float`` on every hop, so the float case is
  unchanged and the two exchanges keep their ratio to it. (The two-phase
  exchange comes out close to the paper's own charge ``P``; the all-gather's
  grows as ``N·P/2``.)
  """
  return g_float * received / received_float


def break_even_workers(compressor: core.Compressor, n: int, limit: int = 1 << 24) -> Optional[int]:
  """Smallest ``N >= 2`` at which the compressed all-gather of ``n`` values receives more
  bytes per worker than a float32 ring all-reduce (``None``: not below ``limit``).

  The all-gather receives ``(N−1)·P`` (plus the agreed scalars' ring), the
  ring ``2(N−1)/N·4n``: their difference changes sign once, so an
  exponential search and a bisection find it.
  """
  def over(w: int) -> bool:
    return (received_bytes(compressor, n, w, "all_gather") > received_bytes(compressor, n, w, "float"))

  if over(2):
    return 2
  lo, hi = 2, 4
  while not over(hi):
    if hi >= limit:
      return None
    lo, hi = hi, hi * 2
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if over(mid) else (mid, hi)
  return hi


def two_phase_vs_float(compressor: core.Compressor, n: int, workers: list[int]) -> dict:
  """The two-phase exchange against the float ring at each of ``workers`` where it splits ``n``
  values (:func:`jaxcomp.exchange.two_phase.split`): the largest ratio of received bytes, and the first
  ``N`` (if any) at which two-phase receives more. Past ``n / alignment`` workers the tensor is
  too small to split and jaxcomp falls back to the all-gather; those ``N`` are listed apart."""
  split = [w for w in workers if two_phase.split(compressor, n, w) is not None]
  ratios = {w: received_bytes(compressor, n, w, "two_phase") / received_bytes(compressor, n, w, "float")
            for w in split}
  return {"max_ratio": max(ratios.values()) if ratios else None,
          "at_workers": max(ratios, key=ratios.get) if ratios else None,
          "first_crossing": next((w for w in sorted(ratios) if ratios[w] > 1), None),
          "workers_checked": sorted(ratios),
          "too_small_to_split": sorted(w for w in workers if w not in ratios)}


def break_even_table(config, models: dict) -> dict:
  """For each compressor and model size: the all-gather's break-even ``N`` and the two-phase check."""
  out = {}
  grid = list(config.two_phase_workers_checked)
  for key, spec in config.break_even.items():
    comp = make_compressor(spec["compressor"], spec["kwargs"])
    per_model = {}
    for name, m in models.items():
      n = m["param_count"]
      w = break_even_workers(comp, n)
      ratio = (lambda v: received_bytes(comp, n, v, "all_gather") / received_bytes(comp, n, v, "float"))
      per_model[name] = {"n": n, "all_gather_break_even_workers": w,
                         "all_gather_over_float_at_break_even": ratio(w) if w else None,
                         "all_gather_over_float_before": ratio(w - 1) if w and w > 2 else None,
                         "payload_bytes": plan.traffic(comp, n, 2, "all_gather").sent,
                         "two_phase": two_phase_vs_float(comp, n, grid)}
    out[key] = {"label": spec["label"], "compressor": spec["compressor"], "kwargs": dict(spec["kwargs"]),
                "models": per_model}
  return out


# ---------------------------------------------------------------------------------------------
# Appendix B's model.


def speedup_at(gpus: int, compute_sec: float, g_float: float, g_tern: float, cl: pm.Cluster,
               k: int, scaling: str) -> float:
  """TernGrad throughput / floating throughput at ``gpus`` GPUs."""
  i, j = pm.layout(gpus, cl.gpus_per_machine)
  tput = pm.weak_throughput if scaling == "weak" else pm.strong_throughput
  return (tput(k, i, j, pm.profiled_time(compute_sec, g_tern, cl), g_tern, cl)
          / tput(k, i, j, pm.profiled_time(compute_sec, g_float, cl), g_float, cl))


def compute_time_for_speedup(target: float, gpus: int, g_float: float, g_tern: float,
                             cl: pm.Cluster, k: int, scaling: str) -> float | None:
  """The single-GPU compute time at which the model gives ``target`` (bisection; None if out of range).

  The speedup falls as compute time grows (communication matters less).
  """
  lo, hi = 1e-6, 1e3
  f = lambda t: speedup_at(gpus, t, g_float, g_tern, cl, k, scaling) - target
  if f(lo) < 0 or f(hi) > 0:
    return None
  for _ in range(200):
    mid = (lo * hi) ** 0.5
    lo, hi = (mid, hi) if f(mid) > 0 else (lo, mid)
  return (lo * hi) ** 0.5


def estimate(config) -> dict:
  comp = TernGrad(clip_sigma=config.terngrad_clip_sigma)
  keep_last = (lambda path, shape: models_lib.is_last_layer(path)) if config.terngrad_float_last_layer \
      else (lambda path, shape: False)
  models, sizes = model_estimates(config, comp, keep_last)
  cache = {}
  for name, m in models.items():
    m["charged_bytes_terngrad"] = exchange_charges(config, comp, sizes[name], m["gradient_bytes_float32"], cache)
  out = {"kind": "performance-model estimates (TernGrad Appendix B); not measurements",
         "scaling": config.scaling, "models": models,
         "clusters": {cname: cluster_estimates(config, cdict, models)
                      for cname, cdict in config.clusters.items()}}
  out["break_even"] = break_even_table(config, models)
  out["alexnet_ethernet_8gpu"] = paper_headline(config, models, out["clusters"])
  return out


def model_estimates(config, comp: core.Compressor, keep_last) -> tuple[dict, dict]:
  """Each model's batch, parameters, forward FLOPs and gradient bytes; and its tensors' sizes."""
  models, sizes = {}, {}
  for name in config.models:
    st = pm.model_stats(build_model(name), config.image_size)
    sizes[name] = tensor_sizes(st["params"], keep_last)
    models[name] = {
        "per_gpu_batch": config.models[name],
        "param_count": st["param_count"],
        "forward_flops": st["forward_flops"],
        "gradient_bytes_float32": pm.gradient_bytes(st["params"]),
        "gradient_bytes_terngrad": pm.gradient_bytes(st["params"], comp, keep_last),
    }
    print(f"TG-F5: {name}: {st['param_count']:,} parameters", file=sys.stderr)
  return models, sizes


def exchange_charges(config, comp: core.Compressor, sizes: list[tuple[int, bool]], g_float: float,
                     cache: dict) -> dict:
  """``{exchange: {str(gpus): charged |g|}}`` of one model (:func:`charged_bytes`), for 2 GPUs and more."""
  out = {ex: {} for ex in EXCHANGES}
  for gpus in config.gpus:
    if gpus < 2:
      continue
    rf = model_received_bytes(sizes, comp, gpus, "float", cache)
    for ex in EXCHANGES:
      r = model_received_bytes(sizes, comp, gpus, ex, cache)
      out[ex][str(gpus)] = charged_bytes(g_float, r, rf)
  return out


def cluster_estimates(config, cdict: dict, models: dict) -> dict:
  """One cluster's assumed compute time and rows (:func:`gpu_row`) per model."""
  cl = cluster_of(cdict)
  per_model = {}
  for name, m in models.items():
    compute = pm.compute_time(config.train_flops_factor * m["forward_flops"], m["per_gpu_batch"],
                              cdict["peak_flops"], config.sustained_fraction)
    per_model[name] = {"assumed_compute_sec": compute,
                       "rows": [gpu_row(config, cl, m, compute, gpus) for gpus in config.gpus]}
  return {"label": cdict["label"], "models": per_model}


def _charges(m: dict, gpus: int) -> dict:
  """The ``|g|`` each exchange is charged at ``gpus`` GPUs: float, the paper's TernGrad charge, ours."""
  charges = {"float": m["gradient_bytes_float32"], "terngrad": m["gradient_bytes_terngrad"]}
  for ex in EXCHANGES:  # one GPU exchanges nothing: the payload's copy only
    charges[f"terngrad_{ex}"] = m["charged_bytes_terngrad"][ex].get(str(gpus), m["gradient_bytes_terngrad"])
  return charges


def gpu_row(config, cl: pm.Cluster, m: dict, compute: float, gpus: int) -> dict:
  """Step time, throughput and TernGrad's speedups of one model at ``gpus`` GPUs."""
  k = m["per_gpu_batch"]
  i, j = pm.layout(gpus, cl.gpus_per_machine)
  row = {"gpus": gpus, "i": i, "j": j}
  step_time, throughput = ((pm.weak_time, pm.weak_throughput) if config.scaling == "weak"
                           else (pm.strong_time, pm.strong_throughput))
  for label, g in _charges(m, gpus).items():
    # T(1,1,K) copies the worker's own gradient (float or payload) once, whatever the exchange.
    t1 = pm.profiled_time(compute, m["gradient_bytes_float32"] if label == "float"
                          else m["gradient_bytes_terngrad"], cl)
    row[f"{label}_time_sec"] = step_time(i, j, t1, g, cl)
    row[f"{label}_throughput"] = throughput(k, i, j, t1, g, cl)
  row["speedup"] = row["terngrad_throughput"] / row["float_throughput"]
  for ex in EXCHANGES:
    row[f"speedup_{ex}"] = row[f"terngrad_{ex}_throughput"] / row["float_throughput"]
  return row


def paper_headline(config, models: dict, clusters: dict) -> dict:
  """The paper's headline number (AlexNet, 8 GPUs, Ethernet) beside ours, and what our model
  would need to match it."""
  a = models["alexnet"]
  eth = clusters["ethernet"]["models"]["alexnet"]
  cl = cluster_of(config.clusters["ethernet"])
  return {
      "speedup": next(r["speedup"] for r in eth["rows"] if r["gpus"] == 8),
      "compute_sec_matching_paper": compute_time_for_speedup(
          3.04, 8, a["gradient_bytes_float32"], a["gradient_bytes_terngrad"], cl,
          a["per_gpu_batch"], config.scaling),
      "assumed_compute_sec": eth["assumed_compute_sec"],
  }


def main(argv):
  del argv
  config = load_config(FLAGS.config)
  workdir = os.path.join(FLAGS.root, config.experiment, config.dataset, config.name)
  os.makedirs(workdir, exist_ok=True)
  summary = estimate(config)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json(indent=2))
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  with open(os.path.join(workdir, "command.txt"), "w") as f:
    f.write(shlex.join(["python", "-m", "experiments.perfmodel_estimates", "--config", FLAGS.config,
                        "--root", FLAGS.root]) + "\n")
  s = summary["alexnet_ethernet_8gpu"]
  for key, b in summary["break_even"].items():
    a = b["models"]["alexnet"]
    print(f"{b['label']}: all-gather passes the float ring at N = {a['all_gather_break_even_workers']} "
          f"(AlexNet size); two-phase/float at most {a['two_phase']['max_ratio']:.3f}", file=sys.stderr)
  print(f"wrote {workdir}: AlexNet, 8 GPUs, 1 Gbps Ethernet: TernGrad/floating = {s['speedup']:.2f}x "
        f"(estimate; paper 3.04x)", file=sys.stderr)


if __name__ == "__main__":
  define_flags()
  app.run(main)
