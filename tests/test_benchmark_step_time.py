"""benchmarks/step_time.py: the side-by-side step timing runs the trainer's real step and reports ratios."""

import json

import pytest

from benchmarks import step_time


def _tiny_group():
  """TG-F3's LeNet step at 2 workers, float and TernGrad: the benchmark's code path, small."""
  return step_time.Group("tiny", step_time._lenet(2),
                         {"float": step_time.LENET_METHODS["float"],
                          "terngrad": step_time.LENET_METHODS["terngrad"]},
                         steps=1, targets={"terngrad": 1e9})


def test_main_times_float_and_compressor_side_by_side(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(step_time, "groups", lambda quick=False: {"tiny": _tiny_group()})
  out = tmp_path / "steps.json"
  doc = step_time.main(["--only", "tiny", "--repeats", "2", "--json", str(out)])
  assert json.loads(out.read_text()) == json.loads(json.dumps(doc, default=float))
  table = capsys.readouterr().out
  assert "tiny" in table and "terngrad" in table
  rows = {r["method"]: r for r in doc["results"]}
  assert list(rows) == ["float", "terngrad"]
  assert rows["float"]["ratios"] == [1.0, 1.0]
  t = rows["terngrad"]
  assert len(t["times_s"]) == len(t["ratios"]) == 2 and all(x > 0 for x in t["times_s"] + t["ratios"])
  # The ratio is the median of per-repeat ratios, not a ratio of medians.
  assert t["ratio_to_float"] == pytest.approx(sum(t["ratios"]) / 2)
  assert t["minor_faults_per_step"] >= 0 and "glibc_tunables" in doc
  assert t["workers"] == 2 and t["meets_target"] is True and rows["float"]["target"] is None


def test_groups_and_bad_arguments():
  full, quick = step_time.groups(), step_time.groups(quick=True)
  assert list(full) == ["lenet8", "lenet64", "resnet", "mlp"]
  assert set(full["lenet64"].targets) == {"terngrad", "threelc", "qsgd"}
  assert set(full["mlp"].targets) == {"onebit", "threshold", "adaptive"}
  assert set(quick["resnet"].methods) == set(step_time.QUICK_RESNET) < set(full["resnet"].methods)
  with pytest.raises(SystemExit):
    step_time.main(["--only", "nope"])
