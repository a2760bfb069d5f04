r"""3LC-T1's speedup columns: time to accuracy over emulated links (3LC Table 1, reduced).

Paper (Lim, Andersen, Kaminsky, MLSys 2019, arXiv:1802.07389, §4.3-4.4,
Table 1): ResNet-110 on CIFAR-10, 10 workers x 32, over 10 Mbps, 100 Mbps and
1 Gbps; the speedup of each design over 32-bit float in training time.
The paper measured per-step times on its cluster and extrapolated the slow
links' times from them (§4.3); here every run is measured whole, over real
(emulated) links: one process per worker, each in its own Linux network
namespace, joined by a bridge, its link shaped to the rate with ``tc``
(``python -m experiments.launch --processes 4 --link RATE``; root needed).

The designs: 32-bit float, 3LC with s = 1.00 and s = 1.75 with the zero-run
stream on the wire, 8-bit int and TernGrad; the same steps and seed for every
design and link. A collective moves fixed shapes, so the zero-run stream goes
in a buffer of a fixed fraction of the base-3^5 size (``capacity``), with a
counted plain base-3^5 round for a tensor whose stream did not fit on some
worker. :data:`CAPACITY` was chosen before the runs from 60-step probes of this
config (one process; fallback rounds per step): at s = 1.00 the early
gradients' streams fill about half of the base-3^5 size on average and some
tensors' far more (capacity 0.5: 7.2 in a 20-step run, 0.7: 4.7, 0.9: 2.0); at
s = 1.75 they are much shorter (0.5: 1.2, 0.6: 0.2).

Time to accuracy: the training time (``train_time`` in ``metrics.csv``:
evaluations and the compiling first step excluded) at the first evaluation
whose test accuracy reaches :data:`TARGET_ACCURACY`. The target was chosen
before the runs, from 3LC-T1's first reduced runs (10 workers x 32 reached
71-79 % after 200 steps; 4 workers see 2.5 times fewer examples).

REDUCED, as 3LC-T1's committed runs are (``configs/threelc_resnet110.py``):
real Fashion-MNIST padded to 32x32x3 instead of CIFAR-10, ResNet-8 (75,290
parameters) instead of ResNet-110, :data:`STEPS` steps, and 4 workers (one per
process) instead of 10, because the 4 processes share this machine's 2 CPU
cores: a step of ResNet-8 takes a few tenths of a second of compute here, and
the 15 runs (5 designs x 3 links) took 55 minutes of wall time. At 10mbit the
four compressed designs run once more with ``exchange="two_phase"``
(:data:`TWO_PHASE`), as the paper's pushes and pulls are both compressed. The paper's GPUs
compute a step far faster than these CPUs, so its communication share, and
with it the speedups, are larger at every rate.

Run (as root)::

  python -m experiments.sweep --config configs/threelc_link.py --root runs --checkpoint_every 0
  python -m experiments.report --root runs --out docs/results.md
"""

from __future__ import annotations

import ml_collections

from configs import resnet_cifar
from configs import threelc_resnet110

PROCESSES = 4  # one worker per process
LINKS = ("10mbit", "100mbit", "1gbit")
STEPS = 200
EVAL_EVERY = 20
TARGET_ACCURACY = 0.65  # chosen before the runs (see the module docstring)
CAPACITY = {1.00: 0.9, 1.75: 0.6}  # zero-run buffer / base-3^5 size, per sparsity s
# The tbf bucket (bytes) of the committed runs, per link: the launcher's
# experiments.netns.tbf_burst (a test keeps the two equal: change the launcher's
# and these runs must be made again). After each idle spell that much passes at
# once; the report says what it is worth.
RUNS_TBF_BURST = {"10mbit": 96 * 1024, "100mbit": 96 * 1024, "1gbit": 125_000}

DESIGNS = {
    "float32": ("32-bit float", resnet_cifar.design("none")),
    "3lc_s1.00_zre": ("3LC (s=1.00), zero-run wire",
                      resnet_cifar.design("threelc", sparsity=1.0, capacity=CAPACITY[1.00])),
    "3lc_s1.75_zre": ("3LC (s=1.75), zero-run wire",
                      resnet_cifar.design("threelc", sparsity=1.75, capacity=CAPACITY[1.75])),
    "int8": ("8-bit int", resnet_cifar.design("int8")),
    "terngrad": ("TernGrad", resnet_cifar.design("terngrad")),
}

# Past two workers the all-gather's P - 1 payloads a worker receives outgrow the
# two-phase exchange's 2(P - 1)/P (compressed reduce-scatter, re-encode,
# all-gather; the paper's pushes and pulls, §3): at the slowest link every
# compressed design runs with it too.
TWO_PHASE_LINKS = ("10mbit",)


def _two_phase(overrides: dict) -> dict:
  return {**overrides, "compressor_kwargs": {**overrides["compressor_kwargs"], "exchange": "two_phase"}}


TWO_PHASE = {f"{name}_two_phase": (f"{label}, two-phase", _two_phase(overrides))
             for name, (label, overrides) in DESIGNS.items() if name != "float32"}


def designs(link: str) -> dict[str, tuple[str, dict]]:
  """The designs run over ``link``: every one of :data:`DESIGNS`, and the two-phase ones at the slowest."""
  return {**DESIGNS, **(TWO_PHASE if link in TWO_PHASE_LINKS else {})}


# Table 1's speedups over 32-bit float at 10 Mbps / 100 Mbps / 1 Gbps. The
# paper's zero-run row is its 3LC (zero-run is part of 3LC); it has no TernGrad
# row (its "Stoch 3-value b-3-5" is TernGrad without clipping: 12.3 / 7.51 / 1.53).
PAPER = {
    "source": "3LC §4.4 Table 1 (ResNet-110, CIFAR-10, 10 workers x 32; slow links extrapolated, §4.3)",
    "speedup": {
        "float32": (1.0, 1.0, 1.0),
        "3lc_s1.00_zre": threelc_resnet110.PAPER["speedup"]["3lc_s1.00"],
        "3lc_s1.75_zre": threelc_resnet110.PAPER["speedup"]["3lc_s1.75"],
        "int8": threelc_resnet110.PAPER["speedup"]["int8"],
        "terngrad": None,
    },
}


def run_name(link: str, design: str) -> str:
  return f"{link}_{design}"


def get_sweep(arg: str | None = None) -> list[tuple]:
  """Every design over every link, 4 processes each: ``(name, overrides, None, launch)``."""
  del arg
  return [(run_name(link, name), dict(overrides), None, {"processes": PROCESSES, "link": link})
          for link in LINKS for name, (_, overrides) in designs(link).items()]


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = threelc_resnet110.get_config("runlocal" if not arg else f"runlocal,{arg}")
  c.experiment = "3LC-T1-link"
  c.workers = PROCESSES
  c.max_devices = 1  # one device, one worker, per process
  c.batch_size = PROCESSES * threelc_resnet110.PER_WORKER_BATCH
  c.lr_end = 0.001 * PROCESSES  # the cosine's end, scaled by the workers as its start is
  c.num_train_steps = STEPS
  c.eval_every = EVAL_EVERY
  c.log_every = EVAL_EVERY
  c.target_accuracy = TARGET_ACCURACY
  return c
