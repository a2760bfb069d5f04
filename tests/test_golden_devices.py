"""The golden numbers with one worker per device (tests/_golden.py): ``jit(shard_map)`` over 4 devices,
the hierarchy (2 hosts of 2 devices, ``within=``) and ``per_shard`` (2 data workers x 2 model shards)."""

import pytest

import _golden as golden

STORE = {}
NAMES = golden.names()
# The hierarchy takes the compressors; the wrappers that own their exchange take no `within`.
WRAPPED = sorted(golden.WRAPPERS)


@pytest.fixture(scope="module", autouse=True)
def _write():
  yield
  golden.write(STORE)


@pytest.mark.parametrize("name", NAMES)
def test_shard_map_keeps_the_golden_numbers(name):
  tx = golden.compressor_case(name, "vmap")("d")
  golden.check(f"{name}/shard_map", golden.record(*golden.run_mesh(tx, golden.device_mesh(), "d", golden.WORKERS)),
               STORE)


@pytest.mark.parametrize("name", WRAPPED)
def test_shard_map_wrapper_keeps_the_golden_numbers(name):
  tx = golden.WRAPPERS[name]("d")
  golden.check(f"{name}/shard_map", golden.record(*golden.run_mesh(tx, golden.device_mesh(), "d", golden.WORKERS)),
               STORE)


@pytest.mark.parametrize("name", NAMES)
def test_hierarchy_keeps_the_golden_numbers(name):
  tx = golden.compressor_case(name, "vmap")("hosts", within="local")
  golden.check(f"{name}/hierarchy",
               golden.record(*golden.run_mesh(tx, golden.host_mesh(), ("hosts", "local"), golden.WORKERS)), STORE)


@pytest.mark.parametrize("name", NAMES)
def test_per_shard_keeps_the_golden_numbers(name):
  golden.check(f"{name}/per_shard", golden.record(*golden.run_per_shard(name)), STORE)
