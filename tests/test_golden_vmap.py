"""The golden numbers under vmap-simulated workers (tests/_golden.py): every registered compressor
with the default buckets, without buckets, ``exchange="two_phase"`` and ``"auto"``, and every wrapper."""

import pytest

import _golden as golden

STORE = {}
CASES = [(name, layout) for name in golden.names() for layout in golden.VMAP_LAYOUTS
         if golden.accepts(name, layout)]


@pytest.fixture(scope="module", autouse=True)
def _write():
  yield
  golden.write(STORE)


@pytest.mark.parametrize("name, layout", CASES, ids=[f"{n}-{l}" for n, l in CASES])
def test_compressor_keeps_its_golden_numbers(name, layout):
  golden.check(f"{name}/{layout}", golden.record(*golden.run_vmap(golden.compressor_case(name, layout))), STORE)


@pytest.mark.parametrize("name", sorted(golden.WRAPPERS))
def test_wrapper_keeps_its_golden_numbers(name):
  golden.check(f"{name}/vmap", golden.record(*golden.run_vmap(golden.WRAPPERS[name])), STORE)
