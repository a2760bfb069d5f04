r"""QSGD-B: bits per iteration of QSGD's Elias-coded message on real gradients, vs the theory.

QSGD (Alistarh et al., NeurIPS 2017, arXiv:1610.02132, §3.1) quantizes a vector ``v ∈ R^n`` with ``s`` levels,
``Q_s(v_i) = ‖v‖₂ · sgn(v_i) · ξ_i`` (Eq. 4), and codes it as 32 bits of
``‖v‖₂`` followed, per nonzero, by the Elias-coded gap to it, a sign bit and
the Elias-coded level. Theorem 3.2 bounds the expected length for ``s ≥ 2``:

    (3 + (3/2 + o(1)) · log2(2(s² + n) / (s(s + √n)))) · s(s + √n) + 32  bits,

and Corollary 3.3 gives ``2.8n + 32`` for ``s = √n`` (here ``s = ⌊√n⌋``).
Lemma 3.1 (iii) bounds the expected number of nonzeros by ``s(s + √n)``.

This script measures the message on real gradients: LeNet (431,080
parameters) on a real offline dataset (Debian's Fashion-MNIST, else
MNIST-5k; ``benchmarks/_lenet.py``) trained with float32 momentum SGD
(0.9, LR 0.01, batch 64, TG-F3's settings without weight decay); at each
snapshot step the gradient of the next batch is quantized with jaxcomp's QSGD
compressor (``norm="l2"``, one bucket: Eq. 4 exactly) for each ``s`` and
``--draws`` independent random draws, and the exact message length is taken
from the codec (:func:`jaxcomp.codecs.qsgd_message_bits`; one message per
snapshot is also encoded and decoded to check the round trip). Two scopes:

* ``model``: the whole flattened gradient is one vector (``n`` = 431,080);
* ``per_tensor``: each of LeNet's 8 tensors is its own vector (as QSGD is
  applied per layer); bits, bounds and nonzeros are summed over tensors, and
  ``s = √n`` means each tensor's own ``⌊√n_t⌋``.

The ``o(1)`` of Theorem 3.2 is dropped (set to 0), so the "bound" is the
theorem's leading expression; ``s = 1`` lies outside the theorem (it needs
``s ≥ 2``) and is shown for the sparse regime only.

Usage::

  python -m benchmarks.qsgd_bits --out runs/QSGD-B

writes ``<out>/<dataset>/lenet/{results.json, config.json, command.txt}``
(read by ``experiments/reports/qsgd.py``) and prints a table.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from benchmarks import _results
from benchmarks._lenet import RealLeNet
from jaxcomp import codecs
from jaxcomp.compressors.qsgd import QSGD

SQRT_N = "sqrt_n"


def theorem_3_2_bits(n: int, s: int) -> float:
  """Theorem 3.2's bound on the expected message length, with ``o(1) = 0``."""
  k = s * (s + math.sqrt(n))
  return (3 + 1.5 * math.log2(2 * (s * s + n) / k)) * k + 32


def corollary_3_3_bits(n: int) -> float:
  """Corollary 3.3: ``2.8n + 32`` bits for ``s = √n``."""
  return 2.8 * n + 32


def quantize_levels(v: np.ndarray, s: int, key: jax.Array) -> np.ndarray:
  """Signed integer levels ``sgn(v_i)·s·ξ_i`` of Eq. 4 (L2 norm, one bucket), from jaxcomp's QSGD."""
  comp = QSGD(levels=s, bucket_size=None, norm="l2")
  x = jnp.asarray(v, jnp.float32)
  payload = comp.encode(x, key, None)
  decoded = np.asarray(comp.decode(payload, x.shape), np.float64)
  norm = float(payload.norms[0])
  if norm == 0.0:
    return np.zeros(v.shape, np.int64)
  q = np.rint(decoded * s / norm).astype(np.int64)
  assert np.all(np.abs(q) <= s)
  return q


def measure_vector(v: np.ndarray, s: int, keys: list[jax.Array], check: bool) -> dict[str, Any]:
  bits, nnz = [], []
  for i, key in enumerate(keys):
    q = quantize_levels(v, s, key)
    b = codecs.qsgd_message_bits(q)
    if check and i == 0:
      msg = codecs.qsgd_encode(float(np.linalg.norm(v)), q)
      assert msg.num_bits == b
      _, back = codecs.qsgd_decode(msg.data, msg.num_bits, q.size)
      assert np.array_equal(back, q), "QSGD Elias round trip failed"
    bits.append(b)
    nnz.append(int(np.count_nonzero(q)))
  return {"bits": bits, "nonzeros": nnz}


def snapshot_rows(grads: Any, step: int, levels: list, draws: int, key: jax.Array) -> list[dict[str, Any]]:
  tensors = [np.asarray(g, np.float64).reshape(-1) for g in jax.tree.leaves(grads)]
  scopes = {"model": [np.concatenate(tensors)], "per_tensor": tensors}
  rows = []
  for scope, vectors in scopes.items():
    n_total = sum(v.size for v in vectors)
    for s_spec in levels:
      per_draw_bits = np.zeros(draws)
      per_draw_nnz = np.zeros(draws)
      bound = nnz_bound = 0.0
      s_used = []
      for j, v in enumerate(vectors):
        n = v.size
        s = math.isqrt(n) if s_spec == SQRT_N else int(s_spec)
        s = max(s, 1)
        s_used.append(s)
        keys = [jax.random.fold_in(jax.random.fold_in(key, j), d) for d in range(draws)]
        m = measure_vector(v, s, keys, check=(scope == "model"))
        per_draw_bits += m["bits"]
        per_draw_nnz += m["nonzeros"]
        bound += theorem_3_2_bits(n, s)
        nnz_bound += s * (s + math.sqrt(n))
      row = {
          "step": step, "scope": scope, "vectors": len(vectors), "n": n_total,
          "s": s_spec if s_spec == SQRT_N else int(s_spec),
          "s_values": s_used if scope == "per_tensor" else s_used[0],
          "bits_mean": float(per_draw_bits.mean()), "bits_min": float(per_draw_bits.min()),
          "bits_max": float(per_draw_bits.max()), "draws": draws,
          "bits_per_value": float(per_draw_bits.mean() / n_total),
          "nonzeros_mean": float(per_draw_nnz.mean()), "nonzeros_bound": nnz_bound,
          "theorem_3_2_bits": bound,
          "theorem_applies": all(s >= 2 for s in s_used),
          "float32_bits": 32 * n_total,
      }
      if s_spec == SQRT_N:
        row["corollary_3_3_bits"] = sum(corollary_3_3_bits(v.size) for v in vectors)
      rows.append(row)
  return rows


def run(dataset: str | None, steps: list[int], levels: list, draws: int, batch: int, lr: float,
        seed: int) -> dict[str, Any]:
  net = RealLeNet(dataset, seed)
  opt = optax.sgd(lr, momentum=0.9)
  params, state = net.params, opt.init(net.params)
  grad_fn = jax.jit(jax.grad(net.loss))

  @jax.jit
  def train_step(params, state, x, y):
    g = jax.grad(net.loss)(params, x, y)
    upd, state = opt.update(g, state, params)
    return optax.apply_updates(params, upd), state

  stream = net.batches(batch)
  key = jax.random.PRNGKey(seed + 1)
  rows, t0, done = [], time.time(), 0
  for snap in sorted(steps):
    while done < snap:
      x, y = next(stream)
      params, state = train_step(params, state, jnp.asarray(x), jnp.asarray(y))
      done += 1
    x, y = next(stream)
    g = grad_fn(params, jnp.asarray(x), jnp.asarray(y))
    rows += snapshot_rows(g, snap, levels, draws, jax.random.fold_in(key, snap))
    print(f"  snapshot at step {snap}: done ({time.time() - t0:.0f} s)", file=sys.stderr)
  return {
      "benchmark": "QSGD-B",
      "dataset": net.dataset, "model": "lenet",
      "parameters": int(sum(np.size(p) for p in jax.tree.leaves(net.params))),
      "training": {"optimizer": "momentum 0.9", "learning_rate": lr, "batch": batch,
                   "snapshot_steps": sorted(steps), "seed": seed,
                   "test_accuracy_at_last_snapshot": net.accuracy(params)},
      "quantizer": "jaxcomp QSGD, norm='l2', one bucket per vector (QSGD Eq. 4)",
      "code": "jaxcomp.codecs.qsgd_message_bits (QSGD §3.1 Elias message), round trip checked",
      "bound_note": "Theorem 3.2 with o(1) = 0; s = sqrt_n is floor(sqrt(n)) per vector",
      "rows": rows,
      "wall_time_sec": time.time() - t0,
      "jax_version": jax.__version__,
  }


def table(res: dict[str, Any]) -> str:
  lines = [f"QSGD-B on {res['dataset']} / {res['model']} ({res['parameters']:,} parameters)",
           f"{'step':>5} {'scope':>10} {'s':>7} {'bits/iter':>12} {'Thm 3.2':>12} {'Cor 3.3':>12}"
           f" {'bits/value':>10} {'nnz':>10} {'nnz bound':>10}"]
  for r in res["rows"]:
    cor = f"{r['corollary_3_3_bits']:>12,.0f}" if "corollary_3_3_bits" in r else f"{'':>12}"
    lines.append(f"{r['step']:>5} {r['scope']:>10} {str(r['s']):>7} {r['bits_mean']:>12,.0f}"
                 f" {r['theorem_3_2_bits']:>12,.0f} {cor} {r['bits_per_value']:>10.4f}"
                 f" {r['nonzeros_mean']:>10,.0f} {r['nonzeros_bound']:>10,.0f}")
  return "\n".join(lines)


def parse_levels(text: str) -> list:
  return [SQRT_N if t.strip() == SQRT_N else int(t) for t in text.split(",") if t.strip()]


def main(argv=None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", default="runs/QSGD-B", help="root of the results (<out>/<dataset>/lenet/)")
  parser.add_argument("--dataset", default=None, help="default: fashion_mnist_debian if installed, else mnist5k")
  parser.add_argument("--steps", default="0,100,500", help="snapshot steps of float training")
  parser.add_argument("--levels", default=f"1,2,4,16,64,256,{SQRT_N}", help="s values (sqrt_n: floor(sqrt(n)))")
  parser.add_argument("--draws", type=int, default=3, help="random quantizations per (snapshot, s)")
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--lr", type=float, default=0.01)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  res = run(args.dataset, [int(t) for t in args.steps.split(",")], parse_levels(args.levels), args.draws,
            args.batch, args.lr, args.seed)
  _results.write_run_dir(args.out, "QSGD-B", "lenet", res, vars(args), "benchmarks.qsgd_bits", argv)
  print(table(res))
  return res


if __name__ == "__main__":
  main()
