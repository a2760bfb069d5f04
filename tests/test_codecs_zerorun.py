"""jaxcomp.codecs.zerorun: 3LC §3.3 zero-run encoding, serial, jitted and partitioned."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcomp.codecs import base243, zerorun

pytestmark = pytest.mark.accelerator


def _reference_encode(b: np.ndarray) -> np.ndarray:
  """The serial algorithm, byte by byte: greedy runs of at most 14 from the start."""
  out, i, n = [], 0, len(b)
  while i < n:
    if b[i] != 121:
      out.append(int(b[i]))
      i += 1
      continue
    j = i
    while j < n and b[j] == 121:
      j += 1
    run = j - i
    while run > 0:
      k = min(run, 14)
      out.append(121 if k == 1 else 243 + k - 2)
      run -= k
    i = j
  return np.array(out, np.uint8)


def _runny_bytes(seed: int, n: int, p_run: float, max_run: int = 40) -> np.ndarray:
  """Base-3^5 bytes made of runs of 121 (lengths 1..max_run) and literals."""
  rs = np.random.RandomState(seed)
  out = []
  while len(out) < n:
    if rs.random_sample() < p_run:
      out.extend([121] * int(rs.randint(1, max_run + 1)))
    else:
      out.append(int(rs.choice([v for v in range(243) if v != 121])))
  return np.array(out[:n], np.uint8)


byte_streams = st.builds(
    _runny_bytes,
    seed=st.integers(0, 2**31 - 1),
    n=st.one_of(st.sampled_from([0, 1, 2, 4, 5, 6, 13, 14, 15, 16, 28, 29]), st.integers(0, 400)),
    p_run=st.floats(0.0, 1.0),
)


def test_hand_written_examples():
  enc = lambda b: list(zerorun.zero_run_encode(np.array(b, np.uint8)))
  assert enc([]) == []
  assert enc([121]) == [121]
  assert enc([121] * 2) == [243]
  assert enc([121] * 14) == [255]
  assert enc([121] * 15) == [255, 121]
  assert enc([121] * 16) == [255, 243]
  assert enc([121] * 28) == [255, 255]
  assert enc([121] * 31) == [255, 255, 244]
  assert enc([5, 121, 121, 121, 7, 121]) == [5, 244, 7, 121]
  assert enc([0, 242, 120, 122]) == [0, 242, 120, 122]
  dec = lambda z: list(zerorun.zero_run_decode(np.array(z, np.uint8)))
  assert dec([255, 121]) == [121] * 15
  assert dec([5, 244, 7, 121]) == [5, 121, 121, 121, 7, 121]


@settings(max_examples=60, deadline=None)
@given(b=byte_streams)
def test_host_codec_matches_serial_reference_and_round_trips(b):
  z = zerorun.zero_run_encode(b)
  np.testing.assert_array_equal(z, _reference_encode(b))
  assert z.dtype == np.uint8 and len(z) <= len(b)
  np.testing.assert_array_equal(zerorun.zero_run_decode(z), b)
  np.testing.assert_array_equal(zerorun.zero_run_decode_checked(z, len(b)), b)
  assert zerorun.zero_run_expanded_length(z) == len(b)


@pytest.mark.parametrize("n", [0, 1, 14, 15, 100, 1000])
@pytest.mark.parametrize("p_run", [0.0, 0.3, 0.9, 1.0])
def test_jitted_codec_static_shapes(n, p_run):
  b = _runny_bytes(n * 7 + int(10 * p_run), n, p_run)
  buf, length = zerorun.zero_run_encode_jax(jnp.asarray(b))
  ref = _reference_encode(b)
  assert buf.shape == (n,) and buf.dtype == jnp.uint8 and length.dtype == jnp.int32
  assert int(length) == len(ref) == int(zerorun.zero_run_length(jnp.asarray(b)))
  np.testing.assert_array_equal(np.asarray(buf[: len(ref)]), ref)
  assert not np.asarray(buf[len(ref):]).any()  # the unused tail is zero
  out, ok = zerorun.zero_run_decode_jax(buf, length, n)
  assert bool(ok)
  np.testing.assert_array_equal(np.asarray(out), b)


def test_jitted_decoder_flags_wrong_length():
  b = np.array([121] * 20 + [3], np.uint8)
  buf, length = zerorun.zero_run_encode_jax(b)
  _, ok = zerorun.zero_run_decode_jax(buf, length, 20)
  assert not bool(ok)
  _, ok = zerorun.zero_run_decode_jax(buf, length - 1, 21)  # truncated
  assert not bool(ok)
  _, ok = zerorun.zero_run_decode_jax(buf, 99, 21)  # length beyond the buffer
  assert not bool(ok)


def test_everything_inside_jit_and_vmap():
  b = jnp.asarray(np.stack([_runny_bytes(s, 300, 0.8) for s in range(3)]))

  @jax.jit
  def f(x):
    buf, length = jax.vmap(zerorun.zero_run_encode_jax)(x)
    out, ok = jax.vmap(lambda z, l: zerorun.zero_run_decode_jax(z, l, 300))(buf, length)
    return length, out, ok

  length, out, ok = f(b)
  for i in range(3):
    assert int(length[i]) == len(_reference_encode(np.asarray(b[i])))
  assert bool(ok.all())
  np.testing.assert_array_equal(np.asarray(out), np.asarray(b))


# ---------------------------------------------------------------------------
# Partitioned (parallel) form
# ---------------------------------------------------------------------------


@settings(max_examples=40, deadline=None)
@given(b=byte_streams, parts=st.sampled_from([1, 2, 3, 5, 7, 16, 1000]))
def test_partitioned_equals_serial(b, parts):
  np.testing.assert_array_equal(zerorun.zero_run_encode_partitioned(b, parts), _reference_encode(b))


def test_partitioned_recuts_runs_across_boundaries():
  # Two partitions of 14: [7, 121 x 13] | [121 x 13, 8]. Each encodes to
  # [7, 254] and [254, 8]; merging only when the sum is <= 14 would keep
  # 254, 254, but the greedy serial result of the run of 26 is 255, 253.
  b = np.array([7] + [121] * 26 + [8], np.uint8)
  assert list(zerorun.zero_run_encode_partitioned(b, 2)) == [7, 255, 253, 8]
  # A run that spans whole partitions: 4 partitions of 7, all 121 but one.
  b = np.array([121] * 27 + [9], np.uint8)
  assert list(zerorun.zero_run_encode_partitioned(b, 4)) == [255, 254, 9]
  # Three partitions of 7 encode to [7, 247] | [248] | [243, 8, 0, 0, 0, 0]:
  # one run of 6 + 7 + 2 = 15, which the serial encoder writes as 255, 121.
  b = np.array([7] + [121] * 15 + [8] + [0] * 4, np.uint8)
  expected = [7, 255, 121, 8, 0, 0, 0, 0]
  assert list(zerorun.zero_run_encode_partitioned(b, 3)) == list(_reference_encode(b)) == expected


# ---------------------------------------------------------------------------
# Capacity-bounded wire format
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("p_zero", [0.0, 0.9, 0.999, 1.0])
@pytest.mark.parametrize("fraction", [0.05, 0.5, 1.0])
def test_pack_fixed_round_trip_and_fallback_flag(p_zero, fraction):
  n_values = 997
  rs = np.random.RandomState(int(p_zero * 1000) + int(fraction * 10))
  t = rs.choice([-1, 1], size=n_values).astype(np.int8)
  t[rs.random_sample(n_values) < p_zero] = 0
  b = base243.base243_encode(t)
  capacity = zerorun.zero_run_capacity(n_values, fraction)
  assert capacity == max(1, int(np.ceil(fraction * 200)))
  packed = jax.jit(zerorun.zero_run_pack_fixed, static_argnums=1)(b, capacity)
  assert packed.buffer.shape == (capacity,) and packed.buffer.dtype == jnp.uint8
  ref = _reference_encode(np.asarray(b))
  assert int(packed.length) == len(ref)
  assert bool(packed.fits) == (len(ref) <= capacity)
  if bool(packed.fits):
    np.testing.assert_array_equal(np.asarray(packed.buffer[: len(ref)]), ref)
    back = jax.jit(zerorun.zero_run_unpack_fixed, static_argnums=2)(packed.buffer, packed.length, 200)
    np.testing.assert_array_equal(np.asarray(back), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(base243.base243_decode(back, n_values)), t)
  else:
    assert not np.asarray(packed.buffer).any()  # nothing usable: the caller falls back


def test_pack_fixed_all_zero_fits_in_a_few_bytes():
  b = base243.base243_encode(jnp.zeros(100_000, jnp.int8))  # 20000 bytes of 121
  packed = zerorun.zero_run_pack_fixed(b, 2000)
  assert bool(packed.fits) and int(packed.length) == -(-20000 // 14)
  back = zerorun.zero_run_unpack_fixed(packed.buffer, packed.length, 20000)
  np.testing.assert_array_equal(np.asarray(back), np.asarray(b))


def test_pack_fixed_vmapped_over_workers():
  t = np.zeros((4, 500), np.int8)
  t[1, ::3] = 1  # one worker is dense and will not fit
  b = jax.vmap(base243.base243_encode)(jnp.asarray(t))
  packed = jax.jit(jax.vmap(lambda x: zerorun.zero_run_pack_fixed(x, 20)))(b)
  assert packed.buffer.shape == (4, 20)
  np.testing.assert_array_equal(np.asarray(packed.fits), [True, False, True, True])
  back = jax.vmap(lambda z, l: zerorun.zero_run_unpack_fixed(z, l, 100))(packed.buffer, packed.length)
  for w in (0, 2, 3):
    np.testing.assert_array_equal(np.asarray(back[w]), np.asarray(b[w]))


def test_capacity_arguments():
  assert zerorun.zero_run_capacity(0, 0.5) == 0
  assert zerorun.zero_run_capacity(1, 0.01) == 1
  with pytest.raises(ValueError, match="fraction"):
    zerorun.zero_run_capacity(10, 0.0)
  with pytest.raises(ValueError, match=">= 0"):
    zerorun.zero_run_pack_fixed(jnp.zeros(3, jnp.uint8), -1)


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_corrupted_streams_raise():
  b = np.array([3] + [121] * 20 + [4], np.uint8)
  z = zerorun.zero_run_encode(b)  # [3, 255, 247, 4]
  with pytest.raises(ValueError, match="expands to 21 bytes, expected 22"):
    zerorun.zero_run_decode_checked(z[:3], 22)
  bad = z.copy()
  bad[2] = 250
  with pytest.raises(ValueError, match="expands to 25 bytes, expected 22"):
    zerorun.zero_run_decode_checked(bad, 22)
  with pytest.raises(ValueError, match="byte 1 is 250 >= 243"):
    zerorun.zero_run_encode_checked(np.array([1, 250], np.uint8))
  with pytest.raises(TypeError, match="uint8"):
    zerorun.zero_run_encode(np.zeros(3, np.int32))
  with pytest.raises(TypeError, match="uint8"):
    zerorun.zero_run_encode_jax(jnp.zeros(3, jnp.int8))
  with pytest.raises(ValueError, match="num_partitions"):
    zerorun.zero_run_encode_partitioned(b, 0)


def test_end_to_end_with_base243_on_sparse_ternary():
  rs = np.random.RandomState(0)
  x = rs.standard_normal(50_000).astype(np.float32)
  t = np.round(x / np.abs(x).max()).astype(np.int8)  # 3LC's quantizer at s = 1
  b = np.asarray(base243.base243_encode(t))
  z = zerorun.zero_run_encode(b)
  assert len(z) < len(b) / 2  # mostly zero groups: runs shrink the stream
  back = base243.base243_decode_checked(zerorun.zero_run_decode_checked(z, len(b)), t.size)
  np.testing.assert_array_equal(np.asarray(back), t)


# ---------------------------------------------------------------------------
# Large inputs: the multi-level scans over rows (more than 1024 rows of 32)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 1024, 1025, 40_000, 600_000])
def test_row_scan_helper_matches_numpy(n):
  from jax import lax

  from jaxcomp.codecs import _common

  x = np.random.RandomState(n).randint(0, 50, size=n).astype(np.int32)
  got = jax.jit(lambda v: _common.scan_1d(v, lax.add, 0))(x)
  np.testing.assert_array_equal(np.asarray(got), np.cumsum(x))
  got = jax.jit(lambda v: _common.scan_1d(v, lax.max, 0))(x)
  np.testing.assert_array_equal(np.asarray(got), np.maximum.accumulate(x))
  got = jax.jit(lambda v: _common.scan_1d(v, lax.max, 0, exclusive=True))(x)
  np.testing.assert_array_equal(np.asarray(got), np.maximum.accumulate(np.r_[0, x[:-1]]))
  got = jax.jit(_common.exclusive_cumsum_i32)(x)
  np.testing.assert_array_equal(np.asarray(got), np.cumsum(x) - x)


def test_large_stream_matches_reference():
  b = _runny_bytes(11, 300_001, 0.7, max_run=100)  # 9376 rows: two scan levels
  z = zerorun.zero_run_encode(b)
  np.testing.assert_array_equal(z, _reference_encode(b))
  np.testing.assert_array_equal(zerorun.zero_run_decode(z), b)
  buf, length = zerorun.zero_run_encode_jax(b)
  assert int(length) == len(z) == int(zerorun.zero_run_length(b))


def _segment_starts(seed: int, n: int) -> np.ndarray:
  """Segment starts from 0: row edges (32), multiples of 14, empty and one-byte segments, random cuts."""
  rs = np.random.RandomState(seed)
  special = [s for s in (1, 2, 14, 15, 28, 31, 32, 33, 64, 96) if s <= n]
  cuts = rs.choice(special, size=min(len(special), rs.randint(0, 4)), replace=False) if special else []
  random = rs.randint(0, n + 1, size=rs.randint(0, 6))
  starts = np.sort(np.concatenate([[0], cuts, random, random[:1]]).astype(np.int64))  # a repeat: an empty segment
  return starts


@pytest.mark.parametrize("config", range(24))
def test_segment_lengths_equal_each_segment_encoded_alone(config):
  """A bucket's per-tensor zero-run sizes in one pass: runs never cross a segment's start (4,800 streams)."""
  n = [1, 5, 31, 32, 33, 64, 100, 200, 257, 400, 1000, 1500][config % 12]
  starts = _segment_starts(config, n)
  p_runs = np.linspace(0.0, 1.0, 200)
  streams = np.stack([_runny_bytes(1000 * config + i, n, p, max_run=60) for i, p in enumerate(p_runs)])
  got = np.asarray(jax.jit(jax.vmap(lambda b: zerorun.zero_run_lengths(b, starts)))(jnp.asarray(streams)))
  ends = list(starts[1:]) + [n]
  want = np.array([[len(_reference_encode(b[s:e])) for s, e in zip(starts, ends)] for b in streams])
  np.testing.assert_array_equal(got, want)
  assert all(g.sum() >= len(_reference_encode(b)) for g, b in zip(got, streams))  # cutting a run never saves


def test_segment_lengths_of_a_run_across_every_boundary():
  """All 121s cut at every row edge: each piece is coded alone (ceil(k / 14) bytes), not as one run."""
  b = np.full((32 * 20,), 121, np.uint8)
  starts = np.arange(0, 32 * 20, 32)
  np.testing.assert_array_equal(np.asarray(zerorun.zero_run_lengths(b, starts)), np.full(20, 3))  # 14 + 14 + 4
  assert int(zerorun.zero_run_lengths(b, [0])[0]) == len(_reference_encode(b)) == 46


def test_segment_lengths_refuse_bad_starts():
  b = jnp.zeros((10,), jnp.uint8)
  for bad in ([1, 4], [0, 5, 3], [0, 11], []):
    with pytest.raises(ValueError, match="starts"):
      zerorun.zero_run_lengths(b, bad)
