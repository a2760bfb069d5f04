"""benchmarks/terngrad_variance.py: the shared scalar's ratio by hand, and a tiny real run."""

import json

import numpy as np
import pytest

from benchmarks import terngrad_variance as tv


def test_scalar_over_sigma_by_hand():
  # Tensor a: worker 0 has σ = 1 and max|g| = 1, worker 1 σ = 4 and max|g| = 4 (both under 2.5σ),
  # so s = 4. Tensor b: one large value (σ = 43.3, max 100 < 2.5σ) sets s = 100 for worker 1 too.
  w0 = np.array([1.0, -1.0, 1.0, -1.0])
  w1 = np.array([4.0, -4.0, 4.0, -4.0])
  big = np.array([0.0, 0.0, 0.0, 100.0])
  gs = {"a": np.stack([w0, w1]), "b": np.stack([big, w0])}
  r = tv.scalar_over_sigma(gs)
  sigma_big = big.std()
  s_b = max(min(100.0, 2.5 * sigma_big), 1.0)
  np.testing.assert_allclose(r, [4.0 / 1.0, 4.0 / 4.0, s_b / sigma_big, s_b / 1.0])
  # Clipping: a single spike is cut to 2.5σ before it can set s.
  spike = np.zeros(100)
  spike[0] = 1.0
  r = tv.scalar_over_sigma({"c": np.stack([spike, spike])})
  np.testing.assert_allclose(r, [min(1.0, 2.5 * spike.std()) / spike.std()] * 2)


@pytest.mark.slow
def test_tiny_real_run_writes_what_the_report_reads(tmp_path):
  res = tv.main(["--train_steps", "2", "--batches", "1", "--keys", "1", "--workers", "2",
                 "--dataset", "mnist5k", "--out", str(tmp_path)])
  d = tmp_path / "mnist5k" / tv.RESULT_NAME
  on_disk = json.loads((d / "results.json").read_text())
  assert json.loads((d / "config.json").read_text())["experiment"] == "TG-F3"
  assert (d / "command.txt").read_text().startswith("python -m benchmarks.terngrad_variance")
  assert on_disk["workers"] == [2] and set(on_disk["points"]) == {"init", "after 2 steps"}
  assert on_disk["reference_batch"] == 4000  # mnist5k's whole training split (< 4096)
  for point in on_disk["points"].values():
    for key in ("terngrad_added", "terngrad_added_float_logits", "scalar_over_sigma_median"):
      assert set(point[key]) == {"2"} and all(v > 0 for v in point[key].values())
  assert res["points"]["init"]["terngrad_added"][2] == on_disk["points"]["init"]["terngrad_added"]["2"]


def test_lenet_batches_larger_than_the_split_fail_clearly():
  import pytest  # pylint: disable=g-import-not-at-top
  from benchmarks._lenet import RealLeNet  # pylint: disable=g-import-not-at-top
  net = RealLeNet("mnist5k")
  with pytest.raises(ValueError, match="must be in"):
    next(net.batches(net.num_train + 1))
