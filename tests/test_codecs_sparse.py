"""jaxcomp.codecs.sparse: Dryden §3.2 index words and delta + Golomb-Rice coding."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcomp.codecs import sparse

pytestmark = pytest.mark.accelerator


def _rice_bits_reference(indices, signs, k):
  """The documented message as a '0'/'1' string, one entry at a time."""
  out = format(len(indices), "032b") + format(k, "05b")
  prev = -1
  for i, s in zip(indices, signs):
    d = int(i) - prev - 1
    prev = int(i)
    out += "1" * (d >> k) + "0" + (format(d & ((1 << k) - 1), f"0{k}b") if k else "") + ("1" if s > 0 else "0")
  return out


def _bitstring(data, num_bits):
  return "".join(format(int(x), "08b") for x in data)[:num_bits]


def _sparse_set(seed, n, p_keep):
  rs = np.random.RandomState(seed)
  idx = np.flatnonzero(rs.random_sample(n) < p_keep)
  return idx, rs.choice([-1, 1], size=idx.size)


# ---------------------------------------------------------------------------
# 32-bit words
# ---------------------------------------------------------------------------


def test_word_layout():
  w = sparse.sparse_words_encode(jnp.array([0, 5, 2**31 - 1]), jnp.array([1, -1, 1]))
  assert w.dtype == jnp.uint32
  np.testing.assert_array_equal(np.asarray(w), [0x80000000, 0x00000005, 0xFFFFFFFF])
  idx, sg = sparse.sparse_words_decode(w)
  np.testing.assert_array_equal(np.asarray(idx), [0, 5, 2**31 - 1])
  np.testing.assert_array_equal(np.asarray(sg), [1, -1, 1])
  assert sparse.sparse_words_bytes(3) == 12


@settings(max_examples=15, deadline=None)  # each new count of words compiles once
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([0, 1, 5, 100, 5000]), p_keep=st.floats(0.0, 1.0))
def test_words_round_trip(seed, n, p_keep):
  idx, sg = _sparse_set(seed, n, p_keep)
  w = sparse.sparse_words_encode_checked(idx, sg)
  assert w.shape == idx.shape
  back_idx, back_sg = sparse.sparse_words_decode_checked(np.asarray(w), n)
  np.testing.assert_array_equal(np.asarray(back_idx), idx)
  np.testing.assert_array_equal(np.asarray(back_sg), sg)


def test_words_top_k_inside_jit():
  x = jnp.asarray(np.random.RandomState(0).standard_normal(1000).astype(np.float32))

  @jax.jit
  def encode(x):
    _, idx = jax.lax.top_k(jnp.abs(x), 10)
    return sparse.sparse_words_encode(idx, x[idx])

  idx, sg = sparse.sparse_words_decode(encode(x))
  expect = np.argsort(-np.abs(np.asarray(x)))[:10]
  np.testing.assert_array_equal(np.sort(np.asarray(idx)), np.sort(expect))
  np.testing.assert_array_equal(np.asarray(sg), np.sign(np.asarray(x)[np.asarray(idx)]))


def test_words_errors():
  with pytest.raises(ValueError, match="does not fit in 31 bits"):
    sparse.sparse_words_encode_checked(np.array([2**31]), np.array([1]))
  with pytest.raises(ValueError, match="not -1 or \\+1"):
    sparse.sparse_words_encode_checked(np.array([3]), np.array([0]))
  with pytest.raises(ValueError, match="index 7 >= n = 5"):
    sparse.sparse_words_decode_checked(np.array([7], np.uint32), 5)
  with pytest.raises(TypeError, match="uint32"):
    sparse.sparse_words_decode(jnp.array([1], jnp.int32))
  with pytest.raises(ValueError, match="2 indices but 1 signs"):
    sparse.sparse_words_encode(jnp.array([1, 2]), jnp.array([1]))


# ---------------------------------------------------------------------------
# Delta + Golomb-Rice
# ---------------------------------------------------------------------------


def test_rice_hand_written_message():
  # indices 3, 4, 10 with k = 1: deltas 3, 0, 5 -> '1'+'0'+'1', '0'+'0', '11'+'0'+'1'
  m = sparse.sparse_rice_encode([3, 4, 10], [1, -1, 1], k=1)
  body = "1" "0" "1" "1" + "0" "0" "0" + "11" "0" "1" "1"
  assert _bitstring(m.data, m.num_bits) == format(3, "032b") + format(1, "05b") + body
  assert m.num_bits == 37 + len(body) == sparse.sparse_rice_bits([3, 4, 10], 1)
  idx, sg = sparse.sparse_rice_decode(m.data, 11)
  np.testing.assert_array_equal(idx, [3, 4, 10])
  np.testing.assert_array_equal(sg, [1, -1, 1])


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.sampled_from([0, 1, 2, 14, 15, 300, 4000]),
       p_keep=st.floats(0.0, 1.0), k=st.sampled_from([None, 0, 1, 4, 12]))
def test_rice_matches_reference_and_round_trips(seed, n, p_keep, k):
  idx, sg = _sparse_set(seed, n, p_keep)
  m = sparse.sparse_rice_encode(idx, sg, k=k)
  used_k = sparse.rice_parameter(np.diff(idx, prepend=-1) - 1) if k is None else k
  assert m.k == used_k
  ref = _rice_bits_reference(idx, sg, used_k)
  assert _bitstring(m.data, m.num_bits) == ref
  assert m.num_bits == len(ref) == sparse.sparse_rice_bits(idx, k)
  assert len(m.data) == math.ceil(len(ref) / 8)
  back_idx, back_sg = sparse.sparse_rice_decode(m.data, max(n, 1))
  np.testing.assert_array_equal(back_idx, idx)
  np.testing.assert_array_equal(back_sg, sg)


def test_rice_huge_delta_needs_more_than_64_unary_bits():
  m = sparse.sparse_rice_encode([1000, 1001], [1, 1], k=0)  # 1000 one-bits
  assert m.num_bits == 37 + 1000 + 2 + 0 + 2
  np.testing.assert_array_equal(sparse.sparse_rice_decode(m.data)[0], [1000, 1001])


@pytest.mark.parametrize("mean_gap", [0.5, 2.0, 5.0, 30.0, 300.0, 3000.0])
def test_rice_parameter_is_optimal_for_geometric_gaps(mean_gap):
  rs = np.random.RandomState(int(mean_gap))
  d = rs.geometric(1.0 / (mean_gap + 1.0), size=20_000) - 1
  idx = np.cumsum(d + 1) - 1
  k = sparse.rice_parameter(d)
  best = min(range(25), key=lambda kk: sparse.sparse_rice_bits(idx, kk))
  assert sparse.sparse_rice_bits(idx, k) <= 1.005 * sparse.sparse_rice_bits(idx, best)
  # and it beats one 32-bit word per value by a wide margin
  assert sparse.sparse_rice_bits(idx, k) < 0.6 * 32 * idx.size


def test_rice_errors():
  m = sparse.sparse_rice_encode([3, 9, 30, 31], [1, 1, -1, 1], k=2)
  with pytest.raises(ValueError, match="truncated"):
    sparse.sparse_rice_decode(m.data[:-2])
  with pytest.raises(ValueError, match="header"):
    sparse.sparse_rice_decode(m.data[:3])
  with pytest.raises(ValueError, match="trailing bytes or non-zero padding"):
    sparse.sparse_rice_decode(np.concatenate([m.data, [0]]).astype(np.uint8))
  with pytest.raises(ValueError, match="out of range"):
    sparse.sparse_rice_decode(m.data, 31)
  with pytest.raises(ValueError, match="strictly increasing"):
    sparse.sparse_rice_encode([3, 3], [1, 1])
  with pytest.raises(ValueError, match="\\[0, 32\\)"):
    sparse.sparse_rice_encode([3], [1], k=32)
  empty = sparse.sparse_rice_encode([], [])
  assert empty.num_bits == 37 and len(empty.data) == 5
  assert sparse.sparse_rice_decode(empty.data)[0].size == 0
