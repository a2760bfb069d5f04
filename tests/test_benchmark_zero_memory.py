"""benchmarks/zero_memory.py: XLA's figures for a sharded optimizer state and sharded parameters add up (a tiny
GPT, 4 devices)."""

import jax

from benchmarks import zero_memory

# XLA's sizes against the arrays' own: counters a step overwrites without reading (metrics of
# the last update) are arguments jit drops, and buffers are padded to alignment.
SLACK = 1024


def test_sharded_state_is_what_shrinks():
  doc = zero_memory.main(["--width", "64", "--depth", "1", "--context", "8", "--batch", "1", "--devices", "4"])
  gradient, replicated, sharded, params = doc["results"]
  n = doc["model"]["parameters"]
  assert 0 <= gradient["output_bytes"] - 4 * n <= SLACK  # the float32 gradient
  assert replicated["params_bytes"] == sharded["params_bytes"] == 4 * n  # parameters stay whole
  # AdamW's two moments: whole on every device, or a quarter of the cut tensors (the small ones stay whole).
  assert replicated["opt_state_bytes"] >= 8 * n and sharded["opt_state_bytes"] < replicated["opt_state_bytes"] / 2
  # ZeRO-3: the parameters too are a quarter of the cut tensors' (and the state as sharded's).
  assert params["params_bytes"] < replicated["params_bytes"] / 2
  assert abs(params["opt_state_bytes"] - sharded["opt_state_bytes"]) <= SLACK
  for r in (replicated, sharded, params):
    own = r["params_bytes"] + r["opt_state_bytes"] + r["batch_bytes"]
    assert 0 <= own - r["argument_bytes"] <= SLACK
    assert 0 <= r["params_bytes"] + r["opt_state_bytes"] - r["alias_bytes"] <= SLACK  # donated: updated in place
    assert r["peak_bytes"] == r["argument_bytes"] + r["output_bytes"] + r["temp_bytes"] - r["alias_bytes"]
  assert sharded["peak_bytes"] < replicated["peak_bytes"]
  # ZeRO-3 holds less between steps; its step's scratch is larger (docs/zero.md says by how much and why).
  assert params["argument_bytes"] < sharded["argument_bytes"] and params["temp_bytes"] > sharded["temp_bytes"]


def test_align_cuts_without_padding_where_the_sizes_allow():
  # --align reaches the cut: 512 cuts this GPT's tensors into exact quarters, the default 2,560 pads them
  # (docs/zero.md: the padded rows are the second copy of the gathered weights). Shapes only.
  _, params = zero_memory.gpt(64, 1, 8)
  n = sum(leaf.size for leaf in jax.tree.leaves(params))
  held = {}
  for align in (512, 2560):
    sharded = jax.eval_shape(zero_memory.chain("none", 4, "params", align=align).shard_params, params)
    rows = jax.tree.leaves(sharded.local.residual)
    assert rows and all(r.shape[0] == 4 for r in rows)
    held[align] = sum(r.size for r in rows) + sum(leaf.size for leaf in jax.tree.leaves(sharded.whole))
  assert held[512] == n < held[2560]
