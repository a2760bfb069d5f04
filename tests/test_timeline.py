"""benchmarks.timeline: a traced call split into lead, collectives, gaps between them and tail."""

import jax
import jax.numpy as jnp
import pytest

from benchmarks import timeline

E = timeline.Event
MS = 1_000_000  # ns


def test_a_call_is_split_into_lead_collectives_between_and_tail():
  events = [
      E(0, 100 * MS, "PjitFunction(jit(step))", True),
      E(0, 100 * MS, "PjitFunction(jit(step))", True),  # nested twin: one call
      E(1 * MS, 95 * MS, "ThunkExecutor::Execute", False),  # a runtime wrapper, not a kernel
      E(2 * MS, 9 * MS, "add_fusion.3", False),
      E(10 * MS, 30 * MS, "pmax.7", False),
      E(20 * MS, 40 * MS, "all-to-all.2", False),  # overlaps the pmax: counted once
      E(40 * MS, 45 * MS, "fusion.9", False),
      E(45 * MS, 60 * MS, "all_gather_invariant.29", False),
      E(60 * MS, 72 * MS, "slice_add_fusion.17", False),
      # The next call: its own spans.
      E(200 * MS, 210 * MS, "PjitFunction(jit(step))", True),
      E(201 * MS, 205 * MS, "add_fusion.3", False),
  ]
  first, second = timeline.spans(events)
  assert first.total == pytest.approx(0.072)
  assert first.lead == pytest.approx(0.010)
  assert first.collectives == pytest.approx(0.045)  # 10..40 and 45..60
  assert first.between == pytest.approx(0.005)  # 40..45
  assert first.tail == pytest.approx(0.012)
  assert first.count == 3
  assert first.lead + first.collectives + first.between + first.tail == pytest.approx(first.total)
  assert second == timeline.Spans(total=pytest.approx(0.005), lead=None, collectives=0.0, between=None, tail=None,
                                  count=0)


def test_overlapped_counts_kernels_beside_a_collective_and_call_keeps_one_function():
  events = [
      E(0, 1, "PjitFunction(step)", True),
      E(1 * MS, 30 * MS, "conditional.3", False),  # runs the psum: a wrapper, not compute beside it
      E(2 * MS, 12 * MS, "psum.4", False),
      E(5 * MS, 8 * MS, "fusion.1", False),  # on another thread, during the psum: 3 ms hidden
      E(10 * MS, 20 * MS, "fusion.2", False),  # 2 ms of it within the psum
      E(20 * MS, 22 * MS, "all-reduce.9", False),  # the metrics' mean: not the exchange
      E(40 * MS, 41 * MS, "PjitFunction(_threefry_fold_in)", True),  # another function: ends the step
      E(40 * MS, 41 * MS, "fusion.7", False),
      E(50 * MS, 51 * MS, "PjitFunction(step)", True),  # a silent step
      E(50 * MS, 60 * MS, "fusion.1", False),
  ]
  exchanging, silent = timeline.spans(events, call="step", collective=timeline.re.compile("psum"))
  assert exchanging.count == 1 and exchanging.collectives == pytest.approx(0.010)
  assert exchanging.overlapped == pytest.approx(0.005)
  assert exchanging.total == pytest.approx(0.030) and exchanging.lead == pytest.approx(0.002)
  assert silent.count == 0 and silent.total == pytest.approx(0.010)
  assert len(timeline.spans(events)) == 3  # every function's calls
  (psum,) = timeline.beside(events, timeline.re.compile("psum"))  # over the whole trace
  assert psum == (pytest.approx(0.010), pytest.approx(0.005))


@pytest.mark.parametrize("name,collective", [("all-to-all.3", True), ("all_gather_invariant.2", True),
                                             ("pmax.7", True), ("all-reduce.1", True), ("psum", True),
                                             ("reduce-scatter", True), ("bitcast_concatenate_fusion.1", False),
                                             ("pad_reduce_fusion.17", False)])
def test_collectives_are_told_by_their_xla_names(name, collective):
  assert bool(timeline.COLLECTIVE.match(name)) == collective


def test_reads_a_real_trace_and_reports_it(tmp_path, capsys):
  f = jax.jit(lambda x: jnp.sin(x) @ x)
  x = jnp.ones((64, 64))
  jax.block_until_ready(f(x))
  with jax.profiler.trace(str(tmp_path / "tiny")):
    for _ in range(2):
      jax.block_until_ready(f(x))
  assert timeline.main([str(tmp_path / "tiny")]) == 0
  out = capsys.readouterr().out
  row = [line for line in out.splitlines() if line.startswith("| tiny |")]
  assert len(row) == 1 and row[0].split("|")[2].strip() == "2", out  # two calls, no collective
  with pytest.raises(SystemExit, match="no .xplane.pb"):
    timeline.main([str(tmp_path / "absent")])
