"""The tools around emulated links: benchmarks.link's method grammar, report and model, sweeps
in several processes, the train clock, and the configs that use them."""

import json

import pytest

from benchmarks import link
from experiments import loop
from experiments import sweep
from jaxcomp import perfmodel


def test_method_spec_parses_arguments_and_rejects_bad_ones():
  assert link.method_spec("terngrad") == ("terngrad", {})
  assert link.method_spec("threelc:sparsity=1.75:capacity=0.5") == ("threelc", {"sparsity": 1.75, "capacity": 0.5})
  assert link.method_spec("qsgd:exchange=two_phase") == ("qsgd", {"exchange": "two_phase"})
  with pytest.raises(ValueError, match="unknown method 'nope'"):
    link.method_spec("nope")
  with pytest.raises(ValueError, match="key=value expected"):
    link.method_spec("terngrad:clip")
  with pytest.raises(SystemExit):  # argparse's error for a bad --methods, before anything starts
    link.main(["--methods", "terngrad,nope"])


def test_rates_parse_in_tc_units():
  assert link.rate_bits_per_second("100mbit") == 1e8
  assert link.rate_bits_per_second("1gbit,5ms") == 1e9
  assert link.rate_bits_per_second("10mbps") == 8e7  # tc's bps: bytes per second
  assert link.rate_bits_per_second("loopback (not shaped)") == 0.0


def _doc(processes, link_name, results, latency=2e-4):
  return {"benchmark": "link", "processes": processes, "link": link_name, "latency_s": latency,
          "results": [dict(zip(("method", "n", "median_s", "bytes_on_wire"), r)) for r in results]}


def test_table_rows_give_speedups_wire_ratios_and_the_model():
  doc = _doc(2, "100mbit", [("none", 8_000_000, 2.7, 32_000_000), ("terngrad", 8_000_000, 0.2, 2_000_009)])
  (none, tern) = link.table_rows([doc])
  assert none[6] == 1.0 and none[7] == 1.0
  assert tern[6] == pytest.approx(13.5) and tern[7] == pytest.approx(32_000_000 / 2_000_009)
  # float at 2 processes: a ring all-reduce moves 2(N-1)/N * 4n bytes in 2(N-1) steps
  assert none[8] == pytest.approx(2 * 2e-4 + 32_000_000 / (1e8 / 8))
  expected = perfmodel.all_gather_cost(link.bench_compressor("terngrad", {}), 8_000_000, 2, 1e8 / 8, 2e-4)
  assert tern[8] == pytest.approx(expected.seconds)
  assert link.table_rows([_doc(2, "loopback (not shaped)", [("none", 10, 1.0, 40)])])[0][8] is None


def _model_doc(processes, link_name, results):
  return {"benchmark": "link", "processes": processes, "link": link_name, "latency_s": 1e-3,
          "results": [dict(method=m, model="resnet20", tensors=59, median_s=t, bytes_on_wire=b, link_tx_bytes=tx,
                           collectives={"all-gather": 1}, **({"received_bytes": rx} if rx else {}))
                      for m, t, b, tx, rx in results]}


def test_model_rows_hold_a_routed_exchange_against_the_all_gather_payload(tmp_path, capsys):
  two_phase, big = "terngrad:exchange='two_phase'", "qsgd:exchange='two_phase':bucket_bytes=8388608"
  fast = _model_doc(4, "100mbit", [("none", 1.0, 1600, 2400, None), ("terngrad", 0.2, 100, 300, None),
                                   (two_phase, 0.1, 120, 160, 150)])
  slow = _model_doc(4, "10mbit", [("none", 10.0, 1600, 2400, None), ("qsgd", 4.0, 200, 600, None),
                                  (big, 2.0, 240, 330, 300)])
  rows = {(r.link, r.method): r for r in link.model_rows([fast, slow])}
  tp = rows["100mbit", two_phase]
  assert (tp.speedup, tp.wire_ratio) == (10.0, 16.0)  # float's bytes over the all-gather payload's, not its own
  assert tp.bound == 2400 / 160 and tp.link_over_plan == 160 / 150
  # The payload is found in another document, whatever the route and buckets.
  assert rows["10mbit", big].wire_ratio == 8.0 and rows["10mbit", big].link_over_plan == 1.1
  assert rows["100mbit", "terngrad"].link_over_plan is None and rows["100mbit", "none"].bound == 1.0
  alone = link.model_rows([_model_doc(4, "10mbit", [("none", 10.0, 1600, 2400, None),
                                                    (big, 2.0, 240, 330, 300)])])
  assert alone[1].wire_ratio is None  # no all-gather of it anywhere: no ratio rather than a wrong one
  # A method launched alone is held against the float run of the same processes, link and model.
  (single,) = link.model_rows([_model_doc(4, "10mbit", [(big, 2.5, 240, 330, 300)]), slow])[:1]
  assert (single.speedup, single.wire_ratio, single.bound) == (4.0, 8.0, 2400 / 330)
  for i, doc in enumerate((fast, slow)):
    (tmp_path / f"{i}.json").write_text(json.dumps(doc))
  assert link.main(["--report", str(tmp_path / "0.json"), str(tmp_path / "1.json")]) == 0
  out = capsys.readouterr().out
  assert "| P = 4, 10mbit: s | ÷ bound | ÷ wire | P = 4, 100mbit: s | ÷ bound | ÷ wire |" in out
  assert f"| resnet20 (59) | `{two_phase}` |  |  |  | 0.100 | 0.67 | 0.62 |" in out
  assert "P = 4, 100mbit: link ÷ plan" in out and "| 1.067 |" in out


def test_hosts_report_sets_each_method_against_its_hierarchical_run(tmp_path, capsys):
  results = [dict(method=m, model="resnet110", median_s=t, bytes_on_wire=b, process_bytes_on_wire=4 * b,
                  link_tx_bytes=tx) for m, t, b, tx in
             [("none", 2.5, 100, 410), ("none:within=local", 0.5, 25, 104), ("terngrad", 0.8, 8, 130),
              ("terngrad:within=local", 0.2, 2, 10)]]
  doc = {"benchmark": "link", "processes": 2, "link": "100mbit", "latency_s": 1e-3, "results": results}
  assert link.hosts_rows(doc) == [("none", 2.5, 0.5, 5.0, (400, 100), (410, 104)),
                                  ("terngrad", 0.8, 0.2, 4.0, (32, 8), (130, 10))]
  path = tmp_path / "hosts.json"
  path.write_text(json.dumps(doc))
  assert link.main(["--report", str(path)]) == 0
  out = capsys.readouterr().out
  assert "2 processes x 4 devices, 100mbit, resnet110" in out
  assert "| `terngrad` | 0.800 | 0.200 | 4.00 | 32 | 8 | 4.00 | 130 | 10 | 13.00 |" in out


def test_report_prints_a_table_and_draws(tmp_path, capsys):
  doc = _doc(4, "10mbit", [("none", 431_000, 1.4, 1_724_000), ("terngrad", 431_000, 0.2, 107_759),
                           ("terngrad:exchange=two_phase", 431_000, 0.15, 161_661)])
  path = tmp_path / "doc.json"
  path.write_text(json.dumps(doc))
  assert link.main(["--report", str(path), "--plot", str(tmp_path / "p.png")]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0].startswith("| processes | link | n | method | median s")
  assert "| 4 | 10mbit | 431,000 | `terngrad` | 0.200 | 107,759 | 7.00 | 16.0 | 0.44 |" in out[3]
  assert (tmp_path / "p.png").stat().st_size > 10_000


def test_model_report_pivots_the_grid_by_processes_and_link(tmp_path, capsys):
  def doc(p, rate, none_s, tern_s):
    results = [dict(method=m, model="resnet20", tensors=59, median_s=t, bytes_on_wire=b, collectives={"all-gather": k})
               for m, t, b, k in (("none", none_s, 1_600, 0), ("terngrad", tern_s, 100, 3))]
    return {"benchmark": "link", "processes": p, "link": rate, "results": results}
  paths = []
  for k, d in enumerate([doc(2, "1gbit", 0.02, 0.004), doc(2, "10mbit", 2.0, 0.25), doc(4, "10mbit", 3.0, 0.5)]):
    paths.append(tmp_path / f"{k}.json")
    paths[-1].write_text(json.dumps(d))
  assert link.main(["--report"] + [str(p) for p in paths] + ["--plot", str(tmp_path / "m.png")]) == 0
  out = capsys.readouterr().out.splitlines()
  assert out[0] == ("| model (tensors) | method | P = 2, 10mbit: s | ÷ bound | ÷ wire | P = 2, 1gbit: s | ÷ bound "
                    "| ÷ wire | P = 4, 10mbit: s | ÷ bound | ÷ wire |")
  assert out[2] == "| resnet20 (59) | `none` | 2.000 | |  | 0.020 | |  | 3.000 | |  |"
  # speedup / wire ratio 16; no link bytes measured, so no bound
  assert out[3] == "| resnet20 (59) | `terngrad` | 0.250 |  | 0.50 | 0.004 |  | 0.31 | 0.500 |  | 0.38 |"
  assert (tmp_path / "m.png").stat().st_size > 10_000


def test_sweep_runs_an_entry_under_the_launcher():
  assert sweep.launcher(None) == []
  assert sweep.launcher({"processes": 4, "link": "10mbit"}) == [
      "-m", "experiments.launch", "--processes", "4", "--link", "10mbit", "--"]
  assert sweep.launcher({"processes": 2}) == ["-m", "experiments.launch", "--processes", "2", "--"]
  with pytest.raises(ValueError, match="launch"):
    sweep.launcher({"procs": 2})


def test_link_sweep_plans_every_design_over_every_link(tmp_path):
  from configs import threelc_link as cfg
  runs = sweep.plan("configs/threelc_link.py", str(tmp_path))
  assert len(runs) == len(cfg.LINKS) * len(cfg.DESIGNS) + len(cfg.TWO_PHASE) == 19
  two = [r for r in runs if r["name"].endswith("_two_phase")]
  assert {r["name"].split("_")[0] for r in two} == set(cfg.TWO_PHASE_LINKS)
  assert all(r["overrides"]["compressor_kwargs"]["exchange"] == "two_phase" for r in two)
  assert {r["name"].removesuffix("_two_phase") for r in two} == {
      f"10mbit_{d}" for d in cfg.DESIGNS if d != "float32"}
  for r in runs:
    link_rate = r["name"].split("_")[0]
    assert link_rate in cfg.LINKS
    i = r["cmd"].index("--")
    assert r["cmd"][1:i] == ["-m", "experiments.launch", "--processes", "4", "--link", link_rate]
    assert r["cmd"][i + 1:i + 3] == ["-m", "experiments.train"]
  c = cfg.get_config()
  assert (c.workers, c.max_devices, c.batch_size) == (4, 1, 128)
  assert 0 < c.target_accuracy < 1 and c.num_train_steps % c.eval_every == 0
  # The committed runs' bucket is the launcher's: change one and the runs must be made again.
  from experiments import netns
  assert cfg.RUNS_TBF_BURST == {link: netns.tbf_burst(link) for link in cfg.LINKS}


def test_two_phase_training_sweeps():
  lenet = sweep.plan("configs/two_phase_training.py", "/tmp/unused")
  assert [r["name"] for r in lenet] == [f"lenet/N{n:02d}/{d}" for n in (8, 64)
                                        for d in ("float", "terngrad", "terngrad_two_phase")]
  two = [r for r in lenet if r["name"].endswith("two_phase")]
  assert all(r["overrides"]["compressor_kwargs"] == {"clip_sigma": 2.5, "exchange": "two_phase"} for r in two)
  resnet = {r["name"]: r for r in sweep.plan("configs/two_phase_training.py:resnet", "/tmp/unused")}
  assert set(resnet) == {"3lc_s1.00_two_phase", "3lc_s1.00_two_phase.warmup15", "3lc_s1.00_two_phase.warmup30",
                         "3lc_s1.00.warmup30"}
  assert resnet["3lc_s1.00_two_phase"]["overrides"]["compressor_kwargs"]["exchange"] == "two_phase"
  assert all("configs/two_phase_training.py:resnet" in r["cmd"] for r in resnet.values())
  # The labelled rows: the paper-settings designs (the two-phase row, 3LC-T1's all-gather row)
  # with a warm-up and nothing else changed.
  from configs import threelc_resnet110  # pylint: disable=g-import-not-at-top
  plain = {"3lc_s1.00_two_phase": resnet["3lc_s1.00_two_phase"]["overrides"],
           "3lc_s1.00": threelc_resnet110.DESIGNS["3lc_s1.00"][1]}
  for name, run in resnet.items():
    if ".warmup" in name:
      base, w = name.split(".warmup")
      assert run["overrides"] == {**plain[base], "lr_warmup_steps": int(w)}, name


def test_threelc_labelled_sweep():
  """3LC-T1's labelled rows: MQE 1-bit with per-tensor means and/or a warm-up, float with the warm-up."""
  from configs import threelc_resnet110 as cfg  # pylint: disable=g-import-not-at-top
  runs = {r["name"]: r for r in sweep.plan("configs/threelc_resnet110.py:runlocal,labelled", "/tmp/unused")}
  assert set(runs) == {"mqe_1bit.per_tensor", "mqe_1bit.warmup30", "mqe_1bit.per_tensor.warmup30", "float32.warmup30"}
  for name, run in runs.items():
    base = cfg.DESIGNS[name.split(".")[0]][1]
    expected = {**base, "compressor_kwargs": {"per": "tensor"}} if ".per_tensor" in name else dict(base)
    if ".warmup" in name:
      expected["lr_warmup_steps"] = cfg.WARMUP
    assert run["overrides"] == expected, name
    assert run["workdir"].startswith("/tmp/unused/3LC-T1/") and "configs/threelc_resnet110.py:runlocal" in run["cmd"]
  # The paper's grid is unchanged by the word.
  assert [n for n, _ in cfg.get_sweep("runlocal")] == list(cfg.DESIGNS)
  assert cfg.get_config("runlocal,labelled").num_train_steps == cfg.REDUCED_STEPS


def test_train_clock_counts_only_training():
  t = [100.0]
  clock = loop.TrainClock(5.0, now=lambda: t[0])
  t[0] = 103.0  # the first step compiles
  clock.resume()  # drops the compile
  t[0] = 110.0
  assert clock.total() == 12.0
  clock.pause()  # an evaluation
  t[0] = 150.0
  assert clock.total() == 12.0
  clock.resume()
  t[0] = 151.5
  assert clock.total() == 13.5


def test_train_step_link_checks_arguments_and_reports(tmp_path, capsys):
  from benchmarks import train_step_link as tsl
  with pytest.raises(SystemExit):
    tsl.main(["--configs", "lenet,vgg"])
  with pytest.raises(SystemExit):
    tsl.main(["--methods", "none,nope"])
  c = tsl._config("resnet", "threelc:sparsity=1.75", 4)  # pylint: disable=protected-access
  assert (c.workers, c.max_devices, c.batch_size, c.compressor) == (4, 1, 128, "threelc")
  assert c.compressor_kwargs.to_dict() == {"sparsity": 1.75}
  c = tsl._config("gpt_zoo", "blockint:bits=4@param_gather=blockint", 4, ["shard_params=True"])  # pylint: disable=protected-access
  assert (c.compressor, c.compressor_kwargs.to_dict(), c.param_gather, c.shard_params) == (
      "blockint", {"bits": 4}, "blockint", True)  # a method's own overrides after --set's
  doc = {"processes": 4, "link": "100mbit", "results": [
      {"config": "lenet", "method": "none", "step_time_sec": 0.5},
      {"config": "lenet", "method": "terngrad", "step_time_sec": 0.1}]}
  (tmp_path / "d.json").write_text(json.dumps(doc))
  assert tsl.main(["--report", str(tmp_path / "d.json")]) == 0
  # LeNet's 8 tensors, each 2-bit codes, its scale, the agreed scale and a non-finite flag (TernGrad).
  import math
  import jax
  from jaxcomp import models
  params = jax.eval_shape(lambda: models.get_model("lenet", 10).init(
      jax.random.PRNGKey(0), jax.numpy.zeros((1, 28, 28, 1))))["params"]
  sizes = [math.prod(p.shape) for p in jax.tree.leaves(params)]
  wire, floats = sum(math.ceil(n / 4) + 9 for n in sizes), 4 * sum(sizes)
  assert len(sizes) == 8 and floats == 4 * 431_080
  out = capsys.readouterr().out
  assert f"| 4 | 100mbit | lenet | `none` | 0.500 | 1.00 | {floats:,} | 1.0 |  |" in out
  ratio = floats / wire
  assert (f"| 4 | 100mbit | lenet | `terngrad` | 0.100 | 5.00 | {wire:,} | {ratio:.1f} | "
          f"{5 / ratio:.2f} |") in out
  # The summary table first: float's step time, each method's speedup, one column per (P, link).
  assert "| config | method | wire ratio | P=4, 100mbit |" in out
  assert "| lenet | `none` | 1.0 | 0.500 s |" in out
  assert f"| lenet | `terngrad` | {ratio:.1f} | 5.00× |" in out


class _FakeRun:
  """What ``train_step_link.time_steps`` uses of a built run: a step sending 100 bytes on every third step."""

  def __init__(self):
    import jax  # pylint: disable=g-import-not-at-top
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    self.step_root = jax.random.PRNGKey(0)
    self.train_step = jax.jit(lambda s, x, y, k: (s + 1, {"bytes_on_wire": jnp.where(s % 3 == 2, 100, 0),
                                                          "received_bytes": s}))

  def train_pipeline(self, start_step):
    return iter(range(start_step, 1000))

  def shard_batch(self, batch):
    return batch, batch

  def init_state(self):
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    return jnp.zeros((), jnp.int32)


@pytest.mark.parametrize("pipelined", [False, True])
def test_train_step_link_times_each_step_and_reads_its_bytes(pipelined):
  from benchmarks import train_step_link as tsl
  times, sent, received = tsl.time_steps(_FakeRun(), 6, pipelined)
  assert len(times) == 6 and all(t > 0 for t in times)
  assert sent == [100, 0, 0, 100, 0, 0]  # steps 2..7, after the 2 warm-up steps
  assert received == 7  # the last step's
  args = tsl._parse(["--configs", "gpt_zoo", "--methods", "none", "--profile", "d"] + ["--pipelined"] * pipelined)  # pylint: disable=protected-access
  assert (args.pipelined, args.profile) == (pipelined, "d")


def test_train_step_link_reports_silent_and_exchanging_steps_apart(tmp_path, capsys):
  from benchmarks import train_step_link as tsl
  doc = {"processes": 2, "link": "10mbit", "pipelined": True, "load_average": [3.0, 2.5, 2.0], "results": [
      {"config": "lenet", "method": "none", "step_time_sec": 0.1, "times_s": [0.1, 0.5, 0.12, 0.1, 0.7],
       "bytes_on_wire": [0, 100, 0, 0, 100]},
      # every step exchanges (data-parallel): in the step table, not split into silent and exchanging
      {"config": "lenet", "method": "terngrad", "step_time_sec": 0.2, "times_s": [0.2, 0.2], "bytes_on_wire": [9, 9]}]}
  (tmp_path / "d.json").write_text(json.dumps(doc))
  assert tsl.main(["--report", str(tmp_path / "d.json")]) == 0
  # mean 304 ms; silent median 100; exchanging median 600 of 2; beyond silent (0.5 + 0.7) - 2 x 0.1 = 1000 ms
  assert "| 2 | 10mbit | lenet | `none` | pipelined | 304.0 | 100.0 | 600.0 (2) | 1000 | 3.0 / 2.5 / 2.0 |" in (
      capsys.readouterr().out)


def test_collectives_counts_combined_and_async_collectives():
  """One count per collective: plain, a combined one returning a tuple, and an async start/done pair."""
  text = "\n".join([
      "  %ag = u8[2,74096]{1,0} all-gather(%p), channel_id=2, dimensions={0}",
      "  %all-reduce.993 = (f32[22]{0}, f32[156]{0}, f32[59]{0}, f32[24]{0}, f32[24]{0}, /*index=5*/f32[24]{0}, "
      "f32[20]{0}) all-reduce(%a, %b, %c, %d, %e, /*index=5*/%f, %g), channel_id=3",
      "  %ars = f32[8]{0} all-reduce-start(%x), channel_id=4",
      "  %ard = f32[8]{0} all-reduce-done(%ars)",
  ])
  assert link.collectives(text) == {"all-gather": 1, "all-reduce": 2}


def test_the_timed_step_updates_each_residual_in_its_own_buffer():
  """benchmarks.link donates the state as a train step does: XLA copies no residual before the step.

  (A donated buffer goes to the first output of its size: were the updates returned before the
  state, each residual's buffer would go to an update, and XLA would copy every residual first.)
  """
  import jax
  mesh = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
  shapes, g = link._workload("lenet", mesh, 0)
  step, state = link._build("int8", shapes, mesh)
  entry = step.lower(g, state).compile().as_text().split("ENTRY", 1)[1]
  assert " copy(%param" not in entry


def test_link_bytes_less_tcps_retransmissions_are_held_against_the_plan(monkeypatch, capsys):
  """A segment dropped at a receiver's queue left its sender twice; the exchange sent it once."""
  import subprocess
  lines = ("ESTAB 0 0 10.0.0.1:4000 10.0.0.2:5000\n\t cubic wscale:7,7 rto:204 bytes_sent:9000 "
           "bytes_retrans:1448 bytes_acked:7553 segs_out:7\n"
           "ESTAB 0 0 10.0.0.1:4001 10.0.0.3:5000\n\t cubic bytes_sent:500 bytes_acked:501 segs_out:2\n"
           "ESTAB 0 0 10.0.0.1:4002 10.0.0.4:5000\n\t cubic bytes_sent:900 bytes_retrans:52 bytes_acked:849\n")
  monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout=lines))
  monkeypatch.delenv("JAXCOMP_LINK", raising=False)
  assert link.tcp_counters() is None  # unshaped: nothing is counted
  monkeypatch.setenv("JAXCOMP_LINK", "10mbit")
  assert link.tcp_counters() == (10400, 1500)
  doc = _model_doc(8, "10mbit", [("none", 10.0, 1600, 2400, None), ("int8:exchange='two_phase'", 2.0, 240, 330, 300)])
  doc["results"][1].update(link_retransmitted_bytes=24, tcp_payload_bytes=297)
  row = link.model_rows([doc])[1]
  assert row.link_over_plan == (330 - 24) / 300 and row.tcp_over_plan == 297 / 300
  link._bytes_pivot([row])
  assert "| `int8:exchange='two_phase'` | 1.020 | 0.990 |" in capsys.readouterr().out
