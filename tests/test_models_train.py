"""Every model and every registered compressor trains a few steps through experiments.train.

8 workers (one per host device here), real offline data; CifarNet, the CIFAR
ResNets, AlexNet and GoogLeNet are exercised by their experiment configs' tests. The compressors train the
small MLP: what is checked is each one's way through experiments.train, and
compiling LeNet's convolutions for each of them took two to three times as
long (convolution kernels' shapes are the compressors' own tests').
"""

import json
import math

import pytest

import jaxcomp
from configs import common
from experiments import train


def _config(**overrides):
  c = common.base_config()
  c.dataset = "mnist5k"
  c.workers = 8
  c.batch_size = 16
  c.num_train_steps = 2
  c.log_every = 1
  c.eval_every = 0
  c.eval_batch_size = 500
  c.progress = False
  c.compressor = "terngrad"
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def _overrides(**overrides):
  """``overrides`` without those that leave ``_config()`` as it is (so equal configs share a key)."""
  base = _config().to_dict()
  return {k: v for k, v in overrides.items() if base.get(k) != v}


# The others train in tests/test_configs_terngrad.py (TG-T1's CifarNet, AlexNet, GoogLeNet) and
# tests/test_reports_threelc_qsgd.py (3LC-T1's and QSGD-T1's ResNets, batch norm from worker 0).
MODELS = {
    "lenet": {},
    "mlp": dict(model="mlp", model_kwargs={"hidden": (32,)}),
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """``run(**overrides)``: the summary of training ``_config(**overrides)``, each config once.

  The MLP with TernGrad is both the model test's ``mlp`` and the compressor
  test's ``terngrad``: one run (one compile) serves both.
  """
  done = {}

  def train_once(**overrides):
    key = json.dumps(overrides, sort_keys=True)
    if key not in done:
      done[key] = train.train_and_evaluate(_config(**overrides), str(tmp_path_factory.mktemp("run")))
    return done[key]

  return train_once


@pytest.mark.parametrize("model", sorted(MODELS))
def test_each_model_trains(run, model):
  s = run(**_overrides(**{"model": model, **MODELS[model]}))
  assert s["steps"] == 2 and s["workers"] == 8 and s["devices"] == 8
  assert math.isfinite(s["final_train_loss"]) and 0.0 <= s["test_accuracy"] <= 1.0
  assert s["compressed_ratio"] > 10  # TernGrad's 2-bit codes


COMPRESSOR_KWARGS = {"local_steps": {"k": 2}, "onebit_adam": {"freeze_step": 1}}
# 1-bit Adam is the optimizer: the config's optimizer only applies the learning rate.
CONFIG_OVERRIDES = {"onebit_adam": {"optimizer": "sgd"}, "demo": {"optimizer": "sgd"}}  # DeMo is one too


# DiLoCo trains through experiments.train in tests/test_train_lm.py (its own workload).
@pytest.mark.parametrize("name", [n for n in jaxcomp.names() if n != "diloco"])
def test_each_compressor_trains(run, name):
  s = run(**_overrides(compressor=name, compressor_kwargs=COMPRESSOR_KWARGS.get(name, {}),
                       **MODELS["mlp"], **CONFIG_OVERRIDES.get(name, {})))
  assert s["steps"] == 2 and s["compressor"] == name
  assert math.isfinite(s["final_train_loss"])
  assert s["bytes_on_wire"] is not None and s["float32_bytes"] == 4 * s["parameters"]
