"""benchmarks/train_memory.py: the trainer's step really donates its state (XLA's alias bytes)."""

import json

from benchmarks import train_memory


def test_donated_step_aliases_the_state_and_undonated_none(tmp_path, capsys):
  out = tmp_path / "memory.json"
  doc = train_memory.main(["--configs", train_memory.SMALLEST, "--json", str(out)])
  assert json.loads(capsys.readouterr().out) == doc == json.loads(out.read_text())
  (r,) = doc["results"]
  state = r["state_bytes_per_device"]
  assert state["params"] > 0 and state["opt_state"] > 0
  donated, undonated = r["donated"], r["undonated"]
  # Every parameter and optimizer-state buffer is updated in place...
  assert donated["alias_bytes"] >= state["params"] + state["opt_state"]
  assert donated["alias_bytes"] <= donated["argument_bytes"]
  # ...and nothing is without donation; the arguments and outputs are the same either way.
  assert undonated["alias_bytes"] == 0
  assert donated["argument_bytes"] == undonated["argument_bytes"]
  assert donated["output_bytes"] == undonated["output_bytes"]
  for figures in (donated, undonated):
    assert figures["peak_bytes"] == (figures["argument_bytes"] + figures["output_bytes"]
                                     + figures["temp_bytes"] - figures["alias_bytes"])
  assert r["difference"]["peak_bytes"] == undonated["peak_bytes"] - donated["peak_bytes"]
