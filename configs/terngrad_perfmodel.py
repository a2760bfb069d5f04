r"""TG-F5: TernGrad's performance model, throughput vs GPUs (TernGrad §5, Fig. 5, Appendix B).

Paper: training throughput of AlexNet, GoogLeNet and VggNet-A, floating vs
TernGrad, up to 512 GPUs, from the performance model of Appendix B, on two
128-node clusters: (a) 1 Gbps Ethernet, 4 GTX 1080 per node behind one PCI
switch; (b) 100 Gbps InfiniBand, 4 Tesla P100 per node connected by NVLink.
Mini-batch per GPU 128 (AlexNet), 64 (GoogLeNet), 32 (VggNet-A), so the
figure scales weakly (Eq. 29-30). Stated results: "TernGrad can have 3.04x
training speedup for AlexNet on 8 GPUs" on cluster (a), and TernGrad "is
still able to double the training speed of VggNet-A on 128 nodes" on (b).

Everything below marked ASSUMPTION is ours: we have no GPU and no cluster, so
the single-GPU time T(1,1,K) is built from the models' FLOPs (XLA's cost
analysis of our Flax AlexNet and GoogLeNet, and of a VGG-A defined in
``jaxcomp/perfmodel.py``) and an assumed sustained fraction of the GPUs' peak;
bandwidths and latencies are typical figures of that hardware, not
measurements. The output is a performance-model ESTIMATE; the report calls it
so. Gradient sizes are computed: float32 parameters, and for TernGrad the
bytes of the real payload (2-bit codes + scalar + agreement) with the last
layer in float32 (§4.2).

Run::

  python -m experiments.perfmodel_estimates --config configs/terngrad_perfmodel.py --root runs

(writes ``runs/TG-F5/perfmodel/fig5/``: ``config.json`` with these
assumptions, ``summary.json`` with the estimates; a few seconds on a CPU).
"""

from __future__ import annotations

import ml_collections

PAPER = {
    "source": "TernGrad §5, Figure 5 (performance model, Appendix B)",
    "alexnet_ethernet_8gpu_speedup": 3.04,
    "vgg_a_infiniband_512gpu": "TernGrad \"is still able to double the training speed of VggNet-A on 128 nodes\"",
}

GB = 1e9

# ASSUMPTIONS, all in one place. Bandwidths in bytes/s, latencies in s, FLOP/s.
CLUSTERS = {
    "ethernet": {
        "label": "(a) 1 Gbps Ethernet, 4x GTX 1080 per node, PCI switch",
        "gpus_per_machine": 4,
        # ASSUMPTION: PCIe 3.0 x16 through one PCI switch, ~12 GB/s effective of
        # its 15.75 GB/s theoretical, for GPU-GPU and GPU-CPU copies alike.
        "gpu_bandwidth": 12 * GB,
        "cpu_bandwidth": 12 * GB,
        "network_bandwidth": 1e9 / 8,  # 1 Gbit/s line rate
        "network_latency": 50e-6,  # ASSUMPTION: TCP over 1 GbE
        "gpu": "GTX 1080",
        "peak_flops": 8.87e12,  # NVIDIA spec: 2560 cores x 1733 MHz boost x 2 (FP32)
    },
    "infiniband": {
        "label": "(b) 100 Gbps InfiniBand, 4x Tesla P100 per node, NVLink",
        "gpus_per_machine": 4,
        # ASSUMPTION: two NVLink 1.0 links between a pair of P100s, 20 GB/s each
        # per direction; GPU-CPU over PCIe 3.0 x16 (~12 GB/s effective).
        "gpu_bandwidth": 40 * GB,
        "cpu_bandwidth": 12 * GB,
        "network_bandwidth": 100e9 / 8,  # 100 Gbit/s EDR line rate
        "network_latency": 2e-6,  # ASSUMPTION: InfiniBand verbs/MPI small-message latency
        "gpu": "Tesla P100 (NVLink)",
        "peak_flops": 10.6e12,  # NVIDIA spec, FP32, SXM2
    },
}

MODELS = {  # per-GPU mini-batch K (Fig. 5 caption)
    "alexnet": 128,
    "googlenet": 64,
    "vgg_a": 32,
}

# ASSUMPTION: a training step costs 3x the forward FLOPs (backward ~2x forward)
# and sustains 40% of the GPU's FP32 peak.
TRAIN_FLOPS_FACTOR = 3.0
SUSTAINED_FRACTION = 0.4

GPUS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)

# The break-even table: N at which a compressed all-gather receives more bytes
# per worker than a float32 ring all-reduce, for one tensor of each model's
# parameter count. 3LC is its fixed wire (base-3^5 codes, no zero-run coding:
# the zero-run stream's size depends on the data). QSGD 4-bit as QSGD-T1 runs it.
BREAK_EVEN = {
    "terngrad": {"label": "TernGrad", "compressor": "terngrad", "kwargs": {"clip_sigma": 2.5}},
    "qsgd_4bit": {"label": "QSGD 4-bit (s = 7, d = 512)", "compressor": "qsgd",
                  "kwargs": {"bits_per_value": 4, "bucket_size": 512}},
    "threelc": {"label": "3LC (s = 1.00, fixed base-3^5 wire, no zero-run)", "compressor": "threelc",
                "kwargs": {"sparsity": 1.0, "zero_run": False}},
}
# The two-phase exchange is checked against the float ring at these N.
TWO_PHASE_WORKERS_CHECKED = tuple(2 ** k for k in range(1, 17))


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  del arg
  c = ml_collections.ConfigDict()
  c.experiment = "TG-F5"
  c.dataset = "perfmodel"  # no data: the run directory is runs/TG-F5/perfmodel/fig5
  c.name = "fig5"
  c.scaling = "weak"  # Fig. 5: fixed mini-batch per GPU (Eq. 29-30)
  c.clusters = CLUSTERS
  c.models = MODELS
  c.image_size = 224
  c.train_flops_factor = TRAIN_FLOPS_FACTOR
  c.sustained_fraction = SUSTAINED_FRACTION
  c.gpus = GPUS
  c.terngrad_float_last_layer = True  # §4.2
  c.terngrad_clip_sigma = 2.5
  c.break_even = BREAK_EVEN
  c.two_phase_workers_checked = TWO_PHASE_WORKERS_CHECKED
  return c
