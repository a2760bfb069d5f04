"""benchmarks/compressors.py's --combine table (the multi-run table in docs/benchmarks.md)."""

import json

import pytest

from benchmarks import compressors
from experiments import throughput


def _doc(ratios):
  rows = []
  for (name, size, target), ratio in zip([("terngrad", 2**20, 0.25), ("topk", 4 * 2**20 + 3, 0.10)], ratios):
    rows.append({"compressor": name, "size": size, "encode_s": 0.001 * ratio * 10, "decode_s": 0.0005,
                 "vs_copy": ratio, "melem_per_s": 500.0, "copy_melem_per_s": 2000.0, "target": target})
  return {"results": rows}


def test_combine_lists_every_run_and_judges_the_median(tmp_path, capsys):
  docs = [_doc([0.30, 0.09]), _doc([0.20, 0.12]), _doc([0.26, 0.08])]
  table = compressors.combine(docs)
  lines = table.splitlines()
  assert "vs copy, runs 1–3" in lines[0]
  assert lines[2] == ("| `terngrad` | 1M | 2.60 | 0.50 | 500 | 2000 | 30.0 / 20.0 / 26.0 | 26.0% | met (25%) |")
  assert lines[3].startswith("| `topk` | 4M + 3 | 0.90 | 0.50 |")
  assert lines[3].endswith("| 9.0 / 12.0 / 8.0 | 9.0% | **missed** (10%) |")
  paths = []
  for i, d in enumerate(docs):
    paths.append(str(tmp_path / f"r{i}.json"))
    with open(paths[-1], "w") as f:
      json.dump(d, f)
  compressors.main(["--combine", *paths])
  assert capsys.readouterr().out.strip() == table


def test_combine_rejects_one_run_and_mismatched_runs():
  with pytest.raises(ValueError, match="at least two"):
    compressors.combine([_doc([0.3, 0.1])])
  other = _doc([0.3, 0.1])
  other["results"] = other["results"][:1]
  with pytest.raises(ValueError, match="different rows"):
    compressors.combine([_doc([0.3, 0.1]), other])


def test_size_labels():
  assert [throughput.size_label(n) for n in (2**20, 4 * 2**20 + 3, 1000)] == ["1M", "4M + 3", "1,000"]
