"""jaxcomp.codecs.twobit: TernGrad's 2-bit wire, byte for byte and round trips."""

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxcomp.codecs import twobit

from _codec_helpers import jit_vmap_round_trip, ternary

pytestmark = pytest.mark.accelerator

# A fixed menu of lengths keeps the number of jit compilations small.
LENGTHS = [0, 1, 2, 3, 4, 5, 6, 7, 8, 13, 14, 15, 16, 17, 63, 64, 65, 1001]


def _reference_pack(t: np.ndarray) -> np.ndarray:
  """Independent statement of the documented layout, one element at a time."""
  m = -(-t.size // 4)
  out = np.full((m,), 0b01010101, np.uint8)  # padding: code 1
  for i, v in enumerate(t.reshape(-1)):
    j, byte = divmod(i, m)  # plane j, byte within the plane
    out[byte] &= ~np.uint8(3 << (2 * j))
    out[byte] |= np.uint8((int(v) + 1) << (2 * j))
  return out


def test_hand_written_bytes():
  # Planar: m = ceil(n/4) bytes; element i in bits 2j..2j+1 of byte k, (j, k) = divmod(i, m);
  # code = t + 1, padded with code 1.
  b = twobit.pack_2bit(jnp.array([-1, 0, 1, -1, 1], jnp.int8))
  # codes 0,1,2,0,2 + pad 1,1,1 -> planes [0,1] [2,0] [2,1] [1,1]:
  # byte 0 = 0 | 2<<2 | 2<<4 | 1<<6; byte 1 = 1 | 0<<2 | 1<<4 | 1<<6.
  np.testing.assert_array_equal(np.asarray(b), [0b01101000, 0b01010001])
  assert b.dtype == jnp.uint8
  np.testing.assert_array_equal(np.asarray(twobit.pack_2bit(jnp.array([1]))), [0x56])
  np.testing.assert_array_equal(np.asarray(twobit.pack_2bit(jnp.zeros(4, jnp.int8))), [0x55])


@settings(max_examples=50, deadline=None)
@given(n=st.sampled_from(LENGTHS), p_zero=st.floats(0.0, 1.0), seed=st.integers(0, 2**31 - 1))
def test_matches_reference_and_round_trips(n, p_zero, seed):
  t = ternary(seed, n, p_zero)
  b = twobit.pack_2bit(t)
  assert b.shape == (twobit.packed_2bit_size(n),) == (-(-n // 4),)
  np.testing.assert_array_equal(np.asarray(b), _reference_pack(t))
  u = twobit.unpack_2bit(b, n)
  assert u.dtype == jnp.int8 and u.shape == (n,)
  np.testing.assert_array_equal(np.asarray(u), t)
  np.testing.assert_array_equal(np.asarray(twobit.unpack_2bit_checked(np.asarray(b), n)), t)


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32, np.int64])
def test_any_integer_dtype_and_shape(dtype):
  t = ternary(3, 2 * 3 * 7, 0.5, dtype).reshape(2, 3, 7)
  b = twobit.pack_2bit(t)
  np.testing.assert_array_equal(np.asarray(b), _reference_pack(t.reshape(-1).astype(np.int8)))
  np.testing.assert_array_equal(np.asarray(twobit.unpack_2bit(b, t.size)), t.reshape(-1))


def test_jit_and_vmap():
  t = jnp.asarray(ternary(1, 4 * 37, 0.3).reshape(4, 37))
  packed, back = jit_vmap_round_trip(twobit.pack_2bit, twobit.unpack_2bit, t)
  assert packed.shape == (4, 10)
  np.testing.assert_array_equal(np.asarray(back), np.asarray(t))


def test_bad_inputs_raise():
  with pytest.raises(TypeError, match="integer"):
    twobit.pack_2bit(jnp.zeros(4, jnp.float32))
  with pytest.raises(ValueError, match=">= 0"):
    twobit.unpack_2bit(jnp.zeros(1, jnp.uint8), -1)
  with pytest.raises(ValueError, match="need 2 bytes"):
    twobit.unpack_2bit(jnp.zeros(1, jnp.uint8), 5)
  with pytest.raises(TypeError, match="uint8"):
    twobit.unpack_2bit(jnp.zeros(2, jnp.int32), 5)
  with pytest.raises(ValueError, match=r"found 2 at flat index 3"):
    twobit.pack_2bit_checked(np.array([0, 1, -1, 2], np.int8))


def test_checked_decoder_rejects_corruption():
  b = np.asarray(twobit.pack_2bit(np.array([1, 0, -1, 0, 1, 1], np.int8)))
  ok = twobit.unpack_2bit_checked(b, 6)
  np.testing.assert_array_equal(np.asarray(ok), [1, 0, -1, 0, 1, 1])
  bad = b.copy()
  bad[0] |= 0b11 << 4  # plane 2, byte 0: element 4 becomes the unused code 0b11
  with pytest.raises(ValueError, match="invalid 2-bit code 0b11 for element 4"):
    twobit.unpack_2bit_checked(bad, 6)
  bad = b.copy()
  bad[1] ^= 0b11 << 6  # a padding code (element 7) is no longer code 1
  with pytest.raises(ValueError, match="padding code of element 7"):
    twobit.unpack_2bit_checked(bad, 6)
  with pytest.raises(ValueError, match="truncated"):
    twobit.unpack_2bit_checked(b[:1], 6)
