"""jaxcomp.codecs.bits: dense 1-bit and w-bit packing, byte for byte against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxcomp.codecs import bits

pytestmark = pytest.mark.accelerator


def _stream(codes: np.ndarray, width: int) -> np.ndarray:
  """Codes as one little-endian bit stream, LSB-first bytes (np.packbits little)."""
  bits_ = ((codes.astype(np.uint64)[:, None] >> np.arange(width, dtype=np.uint64)) & 1).astype(np.uint8)
  return np.packbits(bits_.reshape(-1), bitorder="little")


def _reference(codes: np.ndarray, width: int) -> np.ndarray:
  """The documented layout, written independently: planes of eight partitions, then a dense tail."""
  n = len(codes)
  g, r = divmod(n, 8)
  groups = codes[: 8 * g].reshape(8, g).T  # row i: (P_0[i], ..., P_7[i])
  streams = np.stack([_stream(row, width) for row in groups]) if g else np.zeros((0, width), np.uint8)
  bulk = streams.T.reshape(-1)  # plane k = byte k of every group's stream
  return np.concatenate([bulk, _stream(codes[8 * g:], width)]).astype(np.uint8)


@pytest.mark.parametrize("width", [1, 2, 3, 5, 8, 12, 24])
@pytest.mark.parametrize("n", [0, 5, 8, 1001])
def test_pack_uint_matches_numpy_and_roundtrips(width, n):
  rs = np.random.RandomState(width * 1000 + n)
  c = rs.randint(0, 2**width, size=n, dtype=np.int64).astype(np.uint32)
  p = bits.pack_uint(jnp.asarray(c), width)
  assert p.dtype == jnp.uint8 and p.shape == (bits.packed_size(n, width),)
  assert bits.packed_size(n, width) == -(-n * width // 8)
  np.testing.assert_array_equal(np.asarray(p), _reference(c, width))
  u = bits.unpack_uint(p, width, n)
  assert u.dtype == (jnp.uint8 if width <= 8 else jnp.uint32)
  np.testing.assert_array_equal(np.asarray(u, np.uint32), c)


def test_pack_bits_layout():
  """w = 1: bit j of bulk byte g is element j*G + g; the tail is np.packbits(little)."""
  rs = np.random.RandomState(0)
  b = rs.rand(3, 13) > 0.5  # n = 39 = 8*4 + 7
  p = jax.jit(bits.pack_bits)(b)
  flat = b.reshape(-1)
  assert p.shape == (5,)
  expect_bulk = [sum(int(flat[j * 4 + g]) << j for j in range(8)) for g in range(4)]
  np.testing.assert_array_equal(np.asarray(p)[:4], expect_bulk)
  np.testing.assert_array_equal(np.asarray(p)[4:], np.packbits(flat[32:], bitorder="little"))
  out = jax.jit(bits.unpack_bits, static_argnums=1)(p, 39)
  assert out.dtype == jnp.bool_
  np.testing.assert_array_equal(np.asarray(out), flat)
  # Pad bits are zero: a single True is the byte 1.
  assert np.asarray(bits.pack_bits(jnp.array([True]))).tolist() == [1]
  # Integer 0/1 input is accepted (nonzero means True); 8 elements: one group, G = 1.
  np.testing.assert_array_equal(np.asarray(bits.pack_bits(jnp.array([0, 2, 0, 1, 0, 0, 0, 0], jnp.int32))), [0b1010])


def test_under_vmap_and_errors():
  c = jnp.arange(24, dtype=jnp.uint8).reshape(3, 8) % 8
  packed = jax.vmap(lambda r: bits.pack_uint(r, 3))(c)
  assert packed.shape == (3, 3)
  np.testing.assert_array_equal(jax.vmap(lambda p: bits.unpack_uint(p, 3, 8))(packed), c)
  with pytest.raises(ValueError, match="width"):
    bits.pack_uint(c, 0)
  with pytest.raises(ValueError, match="width"):
    bits.pack_uint(c, 25)
  with pytest.raises(ValueError, match="bytes"):
    bits.unpack_uint(jnp.zeros((2,), jnp.uint8), 3, 8)
  with pytest.raises(TypeError):
    bits.pack_uint(jnp.zeros((4,), jnp.float32), 3)
