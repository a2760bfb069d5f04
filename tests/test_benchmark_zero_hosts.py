"""benchmarks/zero_hosts.py: what crosses hosts in a ZeRO-3 step falls from flat to two hops to one copy a host
(a tiny GPT on 2 hosts of 2 devices; the counts are the transport's, each layout's own step)."""

from benchmarks import zero_hosts


def test_each_layout_moves_less_between_hosts():
  doc = zero_hosts.main(["--width", "64", "--depth", "1", "--context", "8", "--hosts", "2", "--local", "2"])
  r = {x["layout"]: x for x in doc["results"]}
  between = [r[k]["bytes_on_wire"] for k in zero_hosts.LAYOUTS]
  assert between == sorted(between, reverse=True) and len(set(between)) == 4, between
  assert r["flat"]["local_bytes"] == 0 < r["two hops"]["local_bytes"]  # the first hop stays inside the host
  # One copy a host: the weights' gather inside the host too; between hosts only the compressed gradient.
  assert r["one copy a host"]["local_bytes"] > r["two hops"]["local_bytes"]
  assert r["one copy a host"]["gather_bytes"] > 0
  assert r["float"]["held_bytes"] < r["one copy a host"]["held_bytes"]  # a host's share, and the residuals
