"""The language-model zoo (configs/zoo_gpt.py): its rows, its link timing and its report section."""

import inspect
import json
import os

import optax
import pytest

import jaxcomp
from _report_tables import number, row, table
from benchmarks import link
from configs import zoo as vision_config
from configs import zoo_gpt
from experiments import zoo, zoo_report, zoo_studies, zoo_table


def test_every_registered_compressor_has_a_row_and_diloco_its_four():
  rows = zoo_gpt.registered()
  assert {zoo_gpt.compressor_of(n) for n in rows} == set(jaxcomp.names())
  diloco = {n: zoo_gpt.SETTINGS[n]["kwargs"] for n in rows if zoo_gpt.compressor_of(n) == "diloco"}
  plain = {n: k for n, k in diloco.items() if "fragments" not in k}
  assert sorted((k["inner_steps"], k.get("exchange", "float32")) for k in plain.values()) == [
      (10, "float32"), (10, "int8"), (50, "float32"), (50, "int8")]
  streaming = sorted((k["inner_steps"], str(k["fragments"]), k["delay"], k.get("exchange", "float32"))
                     for n, k in diloco.items() if n not in plain)
  # one factor at a time around H = 50, 4 fragments, τ = 1, float32; and that base at H = 10
  base = (50, "4", 1, "float32")
  grid = sorted([base, (50, "1", 1, "float32"), (50, "tensors", 1, "float32"), (50, "4", 0, "float32"),
                 (50, "4", 5, "float32"), (50, "4", 1, "fp4"), (10, "4", 1, "float32"), (10, "4", 1, "fp4")])
  assert streaming == grid  # F = 1, τ = 0, float32 is the plain row
  assert {n: zoo_gpt.SETTINGS[n]["kwargs"] for n in rows if zoo_gpt.compressor_of(n) == "demo"} == {
      "demo": {}, "demo.k8": {"k": 8}}
  assert len(zoo_gpt.get_sweep()) == len(rows) * len(zoo_gpt.SEEDS) and len(zoo_gpt.SEEDS) == 3


def test_zero3_rows_shard_the_recipe_with_the_zoos_gradient_rows():
  c = zoo_gpt.get_config("zero3")
  assert c.shard_params and c.experiment == "zoo_gpt_zero3" and c.num_train_steps == zoo_gpt.STEPS
  sweep = dict(zoo_gpt.get_sweep("zero3"))
  assert len(sweep) == 3 * len(zoo_gpt.ZERO3) + len(zoo_gpt.ZERO3_PARTS)
  qwz = {"param_gather": "blockint", "param_gather_kwargs": {"bits": 8}}
  assert sweep["qwz_qgz/seed1"] == {"compressor": "blockint", "seed": 1, "compressor_kwargs": {"bits": 4}, **qwz}
  assert sweep["terngrad_qwz/seed2"] == {**zoo_gpt.overrides("terngrad", 2), **qwz}
  assert sweep["none/seed0"] == zoo_gpt.overrides("none", 0) and "qgz/seed1" not in sweep
  assert all(key in c for o in sweep.values() for key in o)


def test_adamw_after_every_exchange_but_one_bit_adams():
  """One optimizer rule: the recipe's AdamW, except 1-bit Adam (Adam's own eps, no clip after it) and
  DeMo (plain SGD after it, no clip), which are the optimizer."""
  base = zoo_gpt.get_config()
  assert (base.optimizer, base.dataset, base.model) == ("adamw", "gcide", "gpt")
  for name in zoo_gpt.registered():
    o = zoo_gpt.overrides(name, 0)
    if name == "onebit_adam":
      assert (o["optimizer"], o["grad_clip_norm"]) == ("sgd", 0.0)
      assert o["compressor_kwargs"]["eps"] == inspect.signature(optax.adam).parameters["eps"].default
      assert o["compressor_kwargs"]["b2"] == base.adam_b2
      continue
    if zoo_gpt.compressor_of(name) == "demo":  # DeMo is the optimizer too: SGD applies the schedule
      assert (o["optimizer"], o["grad_clip_norm"]) == ("sgd", 0.0) and "learning_rate" not in o
      continue
    assert "optimizer" not in o, name
    if "diagnosis" in zoo_gpt.SETTINGS[name]:  # a labelled row: its diagnosis run's one change
      owner, label = zoo_gpt.SETTINGS[name]["diagnosis"].split("/")
      change = zoo_gpt.DIAGNOSES[owner][label]
      expected = {**zoo_gpt.overrides(owner, 0), **change.get("config", {})}
      kwargs = {**expected.pop("compressor_kwargs", {}), **change.get("kwargs", {})}
      assert o == {**expected, **({"compressor_kwargs": kwargs} if kwargs else {})}, name
      continue
    assert "learning_rate" not in o, name
    if name in vision_config.SETTINGS and "compressor" not in vision_config.SETTINGS[name]:
      assert o.get("compressor_kwargs", {}).keys() == vision_config.SETTINGS[name]["kwargs"].keys(), name
    assert "AdaGrad" not in zoo_gpt.SETTINGS[name]["paper"] and "TG-F3" not in zoo_gpt.SETTINGS[name]["paper"]


@pytest.mark.parametrize("name", zoo_gpt.registered())
def test_each_row_builds_its_chain(name):
  """The row's overrides on the zoo's config build the chain experiments.train builds."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from experiments import optimizers  # pylint: disable=g-import-not-at-top
  c = zoo_gpt.get_config()
  for key, value in zoo_gpt.overrides(name, 0).items():
    setattr(c, key, ml_collections.ConfigDict(value) if isinstance(value, dict) else value)
  tx = optimizers.make_tx(c, None)
  assert tx.init({k: jax_zeros((4, 3)) for k in "abcdef"}) is not None  # tensors enough for 4 fragments


def jax_zeros(shape):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return jnp.zeros(shape, jnp.float32)


def test_link_timing_of_the_language_model():
  """The link step times the zoo's own GPT, with the row's settings, over whole DiLoCo periods."""
  from benchmarks import train_step_link  # pylint: disable=g-import-not-at-top
  z = zoo.Zoo("configs/zoo_gpt.py", "runs")
  assert zoo_gpt.LINK_TIMED_STEPS % 50 == 0 and zoo_gpt.LINK_STATISTIC == "mean"
  assert link.method_spec(z.method("diloco.h10_int8")) == ("diloco", {"inner_steps": 10, "exchange": "int8"})
  overrides = z.link_overrides("onebit_adam")
  assert overrides == ("optimizer=sgd", "grad_clip_norm=0.0")
  c = train_step_link._config(zoo_gpt.LINK_CONFIG, z.method("onebit_adam"), 2, overrides)
  assert (c.model, c.optimizer, c.grad_clip_norm, c.workers, c.compressor) == ("gpt", "sgd", 0.0, 2, "onebit_adam")
  assert c.compressor_kwargs.freeze_step == 1  # the timed steps are the compressed stage's
  assert train_step_link.wire_bytes(zoo_gpt.LINK_CONFIG, "none", 2) == 4 * 120_576  # float32, every parameter
  times = [0.1] * 49 + [5.1]
  result = {"step_time_sec": 0.1, "times_s": times}
  assert zoo_table.link_seconds(z, result) == pytest.approx(0.2)  # the exchanging step counts once in 50
  assert zoo_table.link_seconds(zoo.Zoo("configs/zoo.py", "runs"), result) == 0.1


def test_wire_bytes_counts_the_wrappers():
  """local_steps and DiLoCo send their exchange's bytes on one step in k (H): the mean per step."""
  from benchmarks import train_step_link  # pylint: disable=g-import-not-at-top
  full = train_step_link.wire_bytes(zoo_gpt.LINK_CONFIG, "none", 2)
  int8 = train_step_link.wire_bytes(zoo_gpt.LINK_CONFIG, "int8", 2)
  assert (full, int8) == (4 * 120_576, 120_716)  # float32; 8-bit codes and each tensor's scale
  assert train_step_link.wire_bytes(zoo_gpt.LINK_CONFIG, "local_steps:k=2", 2) == full / 2
  assert train_step_link.wire_bytes(zoo_gpt.LINK_CONFIG, "diloco:inner_steps=10", 2) == full / 10
  assert train_step_link.wire_bytes(zoo_gpt.LINK_CONFIG, "diloco:inner_steps=3:exchange='int8'", 2) == int8 / 3
  # Streaming DiLoCo: the fragments' exchanges spread over the period, the model once in it.
  assert train_step_link.wire_bytes(zoo_gpt.LINK_CONFIG, "diloco:inner_steps=10:fragments=4:delay=1", 2) == full / 10
  assert train_step_link.period("diloco", {}) == 500 and train_step_link.period("terngrad", {"k": 2}) == 1


def _fake_run(workdir, bits, unigram=4.876, peak=None):
  os.makedirs(workdir)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump({"test_bits_per_byte": bits, "test_accuracy": 0.3, "mean_bytes_on_wire": 1000.0,
               "float32_bytes": 482304.0, "steps": 1000, "seed": 0, "train_time_sec": 30.0,
               "wall_time_sec": 40.0, "final_train_loss": 2.0, "parameters": 120576, "corpus": "GCIDE",
               "corpus_license": "GPL-2.0-or-later", "train_bytes": 10, "test_bytes": 5,
               "unigram_held_out_bits_per_byte": unigram,
               **({"peak_bytes_on_wire": peak} if peak is not None else {})}, f)


def test_report_section_ranks_by_bits_per_byte(tmp_path):
  z = zoo.Zoo("configs/zoo_gpt.py", str(tmp_path))
  _fake_run(os.path.join(z.runs_dir, "none", "seed0"), 2.9, peak=482304.0)
  _fake_run(os.path.join(z.runs_dir, "none", "seed1"), 3.0, peak=482304.0)
  _fake_run(os.path.join(z.runs_dir, "onebit_adam", "seed0"), 5.2)
  out = tmp_path / "zoo.md"
  text = zoo_report.report([z], str(out), str(tmp_path / "zoo.png"))
  cells = table(text, "compressor", "held-out bits per byte")
  assert number(row(cells, compressor="`none`")["held-out bits per byte"]) == 2.95
  assert row(cells, compressor="`none`")["spread over seeds"] == "± 0.071 (2.900–3.000)"
  assert row(cells, compressor="`none`")["largest step / worker"] == "0.482 MB"  # the runs' peak_bytes_on_wire
  assert row(cells, compressor="`onebit_adam`")["largest step / worker"] == "not measured"  # a run without it
  assert row(cells, compressor="`diloco.h50`")["held-out bits per byte"] == "not measured"
  assert "encode+decode (vs float32 copy)" not in cells[0]  # no throughput column for this zoo
  assert "`onebit_adam` seed 0: 5.200 bits per byte (unigram 4.876)" in text
  assert "`none` seed" not in text.split("no better than the unigram entropy")[1]
  assert (tmp_path / "zoo.png").stat().st_size > 0


def _fake_study_run(workdir, bits, train_rows):
  """A finished study run: its summary and a metrics.csv of ``train_rows`` (dicts of columns)."""
  _fake_run(workdir, bits)
  columns = ["step", "split"] + sorted({k for r in train_rows for k in r})
  with open(os.path.join(workdir, "metrics.csv"), "w") as f:
    f.write(",".join(columns) + "\n")
    for step, r in enumerate(train_rows, 1):
      f.write(",".join(str({"step": step, "split": "train", **r}.get(c, "")) for c in columns) + "\n")


def test_diloco_study_table_and_outer_norms(tmp_path):
  """The H x outer-LR table marks each H's best; the finding's figures come from the runs' outer steps."""
  z = zoo.Zoo("configs/zoo_gpt.py", str(tmp_path))
  study = z.studies()["diloco"]
  silent = {"diloco_outer_grad_norm": 0.0, "diloco_outer_state_norm": 0.0, "diloco_outer_update_norm": 0.0}
  outer = lambda g, m, u: {"diloco_outer_grad_norm": g, "diloco_outer_state_norm": m, "diloco_outer_update_norm": u}
  for lr, bits in ((0.1, 3.5), (0.3, 3.2), (0.7, 3.9)):
    _fake_study_run(os.path.join(study.runs_dir, "h10", f"outer_lr={lr}"), bits,
                    [silent, outer(1.0, 2.0, 5.0), silent, outer(3.0, 8.0, 9.0)])
  text = "\n".join(zoo_studies.diloco_study(z, study, str(tmp_path / "zoo_gpt.png"), str(tmp_path / "zoo.md"),
                                            2.9, 4.876))
  h10 = row(table(text, "H", "outer LR 0.3"), H="10")
  assert (h10["outer LR 0.3"], h10["outer LR 0.1"], h10["outer LR 1"]) == ("**3.200** (14)", "3.500 (14)", "not measured")
  runs = zoo_studies._study_runs(study)
  assert zoo_studies.diloco_finding_text("{bpb:h10/outer_lr=0.7} {grad:h10/outer_lr=0.7} {mom:h10/outer_lr=0.7} "
                                         "{amp:h10/outer_lr=0.7} {path:h10/outer_lr=0.7} {bpb:h50/outer_lr=0.7}",
                                         runs) == \
      "3.900 2 5 3.5 14 not measured"
  assert (tmp_path / "zoo_gpt_diloco.png").stat().st_size > 0


def test_weak_row_findings_take_their_figures_from_the_diagnosis(tmp_path):
  """A finding's {bpb:…}/{upd:…}/{res:…} come from the diagnosis runs, and a labelled row that does not
  take its row's best diagnosis run is flagged."""
  z = zoo.Zoo("configs/zoo_gpt.py", str(tmp_path))
  diag = z.studies()["diagnose"]
  norms = lambda u, r: {"update_norm": u, "residual_norm": r}
  _fake_study_run(os.path.join(diag.runs_dir, "none", "paper"), 2.9, [norms(1.0, 0.0), norms(3.0, 0.0)])
  labelled = {n: r["diagnosis"] for n, r in zoo_gpt.SETTINGS.items() if "diagnosis" in r}
  assert labelled, "the weak rows have labelled rows"
  name, taken = next(iter(labelled.items()))
  owner = taken.split("/")[0]
  other = next(label for label in zoo_gpt.DIAGNOSES[owner] if f"{owner}/{label}" != taken)
  _fake_study_run(os.path.join(diag.runs_dir, taken), 3.1, [norms(0.5, 2.0)])
  _fake_study_run(os.path.join(diag.runs_dir, owner, other), 3.0, [norms(0.5, 4.0)])
  runs = zoo_studies._study_runs(diag)
  assert zoo_studies.finding_text(f"{{bpb:{taken}}}, {{upd:none/paper}}, {{res:{owner}/{other}}}, {{bpb:x/y}}",
                                  runs) == \
      "3.100, 2, 4, not measured"
  text = "\n".join(zoo_studies.language_findings(z, diag, str(tmp_path / "zoo_gpt.png"), str(tmp_path / "zoo.md"),
                                                 2.9))
  assert f"the row's best diagnosis run is `{owner}/{other}`, not `{taken}`: update the row" in text
  cells = row(table(text, "run", "mean ‖update‖ (× float's)"), run=f"`{taken}`")
  assert cells["held-out bits per byte"] == "3.100" and cells["mean ‖update‖ (× float's)"] == "0.5 (0.25×)"


def test_labelled_rows_are_timed_as_their_rows():
  """A labelled row's link timing ends its row's warm-ups too (DGC's, timed at its final density)."""
  z = zoo.Zoo("configs/zoo_gpt.py", "runs")
  for name, row in zoo_gpt.SETTINGS.items():
    if "diagnosis" in row:
      owner = row["diagnosis"].split("/")[0]
      assert row.get("timing") == zoo_gpt.SETTINGS[owner].get("timing"), name
  assert z.timing_kwargs("dgc.density=0.1") == {"density": 0.1, "warmup_steps": 0}


def test_claims_name_rows_of_the_table_and_fill_their_figures():
  import re  # pylint: disable=g-import-not-at-top
  names = set(zoo_gpt.registered())
  for text in zoo_gpt.CLAIMS.values():
    for figure, row in re.findall(r"\{(\w+):([^}]+)\}", text):
      assert figure in ("bpb", "bytes", "peak", "ratio") and row in names, (figure, row)
  rs = [{"name": "none", "acc": {"mean": 2.9451, "bytes": 482304.0, "peak": 482304.0, "ratio": 1.0}},
        {"name": "demo", "acc": {"mean": 3.4412, "bytes": 10960.0, "peak": None, "ratio": 44.0}}]
  claims = "{bpb:demo} vs {bpb:none}, {ratio:demo}, {bytes:demo}, {peak:demo}, {bpb:topk}"
  assert zoo_studies.claim_text(claims, rs) == (
      "3.441 vs 2.945, 44×, 11.0 kB, not measured, not measured")
