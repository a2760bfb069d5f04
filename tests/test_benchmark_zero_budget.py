"""benchmarks/zero_budget.py: a budget between the replicated and the sharded step's peaks is met by ZeRO-3 (qwZ + qgZ),
which then trains on real text; a budget under the sharded peak is refused (a tiny GPT, 4 devices)."""

import math

import pytest

from benchmarks import zero_budget
from jaxcomp.data import text

TINY = ["--width", "64", "--depth", "1", "--context", "8", "--batch", "1", "--devices", "4"]


@pytest.fixture(scope="module")
def peaks():
  """Both layouts' compiled peaks, from the script's own report (nothing trained: --steps 0)."""
  doc = zero_budget.main(TINY + ["--budget-mb", "1000", "--steps", "0"])
  assert doc["training"] is None
  return {layout: r["peak_bytes"] for layout, r in doc["layouts"].items()}


@pytest.mark.skipif(not text.gcide_available(), reason="Debian package dict-gcide not installed (make setup as root)")
def test_budget_between_the_peaks_trains_sharded(peaks):
  assert peaks["zero3"] < peaks["replicated"]
  budget_mb = (peaks["zero3"] + peaks["replicated"]) / 2 / zero_budget.MB
  doc = zero_budget.main(TINY + ["--budget-mb", str(budget_mb), "--steps", "2"])
  zero3, replicated = doc["layouts"]["zero3"], doc["layouts"]["replicated"]
  assert (zero3["peak_vs_budget"], replicated["peak_vs_budget"]) == ("fits", "exceeds")
  assert zero3["state_bytes"] < replicated["state_bytes"] / 2  # the parameters and AdamW's moments cut over 4
  training = doc["training"]
  assert len(training["losses"]) == len(training["seconds"]) == 2
  assert all(math.isfinite(loss) for loss in training["losses"])
  assert training["peak_rss_bytes"] > 0


def test_a_budget_under_the_sharded_peak_is_refused(peaks):
  budget_mb = peaks["zero3"] / 2 / zero_budget.MB
  with pytest.raises(SystemExit, match=r"refused: the sharded step .* over the budget of .* nothing trained"):
    zero_budget.main(TINY + ["--budget-mb", str(budget_mb), "--steps", "2"])
