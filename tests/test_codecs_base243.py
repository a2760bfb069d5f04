"""jaxcomp.codecs.base243: 3LC §3.2 base-3^5 encoding, byte for byte."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcomp.codecs import base243

from _codec_helpers import jit_vmap_round_trip, ternary

pytestmark = pytest.mark.accelerator

LENGTHS = [0, 1, 2, 4, 5, 6, 7, 9, 10, 11, 14, 15, 16, 24, 25, 26, 99, 1001]


def _reference(t: np.ndarray) -> np.ndarray:
  """The paper's five steps, written out with Python integers."""
  shifted = [int(v) + 1 for v in t.reshape(-1)]  # steps 1-3
  while len(shifted) % 5:
    shifted.append(0)  # step 4: pad with zeros in the shifted domain
  length = len(shifted) // 5
  p = [shifted[k * length:(k + 1) * length] for k in range(5)]  # step 5
  return np.array([p[0][j] * 81 + p[1][j] * 27 + p[2][j] * 9 + p[3][j] * 3 + p[4][j]
                   for j in range(length)], np.uint8)


def test_hand_written_bytes():
  enc = lambda t: np.asarray(base243.base243_encode(np.array(t, np.int8)))
  np.testing.assert_array_equal(enc([0] * 5), [121])  # five zeros -> 121
  np.testing.assert_array_equal(enc([1] * 5), [242])
  np.testing.assert_array_equal(enc([-1] * 5), [0])
  np.testing.assert_array_equal(enc([0] * 10), [121, 121])
  # n = 7: shifted 2,1,0,1,2,2,0 + pad 0,0,0 -> P0=[2,1] P1=[0,1] P2=[2,2] P3=[0,0] P4=[0,0]
  np.testing.assert_array_equal(enc([1, 0, -1, 0, 1, 1, -1]), [180, 126])
  # Padding is 0 in the shifted domain, so a zero tensor of 7 is not all 121.
  np.testing.assert_array_equal(enc([0] * 7), [120, 117])
  assert base243.ZERO_GROUP_BYTE == 121


@settings(max_examples=50, deadline=None)
@given(n=st.sampled_from(LENGTHS), p_zero=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1))
def test_matches_paper_and_round_trips(n, p_zero, seed):
  t = ternary(seed, n, p_zero)
  b = base243.base243_encode(t)
  assert b.dtype == jnp.uint8 and b.shape == (base243.base243_size(n),) == (-(-n // 5),)
  np.testing.assert_array_equal(np.asarray(b), _reference(t))
  assert int(np.max(np.asarray(b), initial=0)) <= 242
  d = base243.base243_decode(b, n)
  assert d.dtype == jnp.int8 and d.shape == (n,)
  np.testing.assert_array_equal(np.asarray(d), t)
  np.testing.assert_array_equal(np.asarray(base243.base243_decode_checked(np.asarray(b), n)), t)


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64])
def test_any_integer_dtype_and_shape(dtype):
  t = ternary(7, 3 * 11, 0.6, dtype).reshape(3, 11)
  b = base243.base243_encode(t)
  np.testing.assert_array_equal(np.asarray(b), _reference(t.astype(np.int8)))
  np.testing.assert_array_equal(np.asarray(base243.base243_decode(b, 33)), t.reshape(-1))


def test_jit_and_vmap():
  t = jnp.asarray(ternary(2, 3 * 23, 0.8).reshape(3, 23))
  b, back = jit_vmap_round_trip(base243.base243_encode, base243.base243_decode, t)
  assert b.shape == (3, 5)
  np.testing.assert_array_equal(np.asarray(back), np.asarray(t))


def test_bad_inputs_raise():
  with pytest.raises(TypeError, match="integer"):
    base243.base243_encode(jnp.zeros(5, jnp.float32))
  with pytest.raises(ValueError, match=">= 0"):
    base243.base243_decode(jnp.zeros(0, jnp.uint8), -3)
  with pytest.raises(ValueError, match="need 2 bytes"):
    base243.base243_decode(jnp.zeros(1, jnp.uint8), 6)
  with pytest.raises(ValueError, match=r"found -2 at flat index 1"):
    base243.base243_encode_checked(np.array([1, -2, 0], np.int32))


def test_checked_decoder_rejects_corruption():
  t = np.array([1, 0, -1, 0, 1, 1, -1], np.int8)
  b = np.asarray(base243.base243_encode(t))
  bad = b.copy()
  bad[1] = 243
  with pytest.raises(ValueError, match="byte 1 is 243 >= 243"):
    base243.base243_decode_checked(bad, 7)
  bad = b.copy()
  bad[1] += 3  # P3 digit of byte 1 is flat index 3*2+1 = 7, a padding position
  with pytest.raises(ValueError, match="padding digit at flat index 7"):
    base243.base243_decode_checked(bad, 7)
  with pytest.raises(ValueError, match="truncated"):
    base243.base243_decode_checked(b[:1], 7)
  # The unchecked decoder does not validate: a corrupted byte gives garbage.
  bad = b.copy()
  bad[0] = 250
  assert np.asarray(base243.base243_decode(bad, 7)).max() > 1
