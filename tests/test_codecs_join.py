"""join_parts: the planar decoders' join from even-length pieces (2-bit, base-3^5)."""

import jax.numpy as jnp
import numpy as np
import pytest

from _codec_helpers import ternary
from jaxcomp.codecs import base243, bits, twobit
from jaxcomp.codecs._common import join_parts

pytestmark = pytest.mark.accelerator


@pytest.mark.parametrize("parts", [1, 2, 4, 5])
def test_join_parts_is_the_first_n_of_the_concatenated_parts(parts):
  # digit(b, k) = b + 1000 k marks every value with its part and byte, so a
  # misplaced, doubled or dropped value shows.
  digit = lambda x, k: x.astype(jnp.int32) + 1000 * k
  for length in range(0, 8):
    b = jnp.arange(length, dtype=jnp.uint8)
    full = np.concatenate([np.arange(length) + 1000 * k for k in range(parts)]).astype(np.int32)
    for n in range(0, parts * length + 1):
      out = np.asarray(join_parts(b, digit, n, parts))
      np.testing.assert_array_equal(out, full[:n], err_msg=f"length={length} n={n}")


@pytest.mark.parametrize("n", list(range(0, 45)) + [1_048_577, 1_048_579, 4_194_304, 4_194_307])
def test_codecs_round_trip_at_odd_part_lengths(n):
  # 1M + 1 and 1M + 3: 2-bit parts of 262,145; 4M: base-3^5 parts of 838,861.
  t = ternary(n, n, 0.3)
  np.testing.assert_array_equal(np.asarray(twobit.unpack_2bit(twobit.pack_2bit(t), n)), t)
  np.testing.assert_array_equal(np.asarray(base243.base243_decode(base243.base243_encode(t), n)), t)


@pytest.mark.parametrize("width", [1, 2, 3, 5, 12])
@pytest.mark.parametrize("n", [8 * 3, 8 * 3 + 5, 8 * 131_073, 8 * 131_073 + 3])
def test_bits_round_trip_at_odd_partition_lengths(width, n):
  # bits' bulk is eight partitions of g = n // 8 codes: odd here (3 and 131,073).
  codes = np.random.default_rng(n + width).integers(0, 2**width, n)
  out = np.asarray(bits.unpack_uint(bits.pack_uint(codes, width), width, n))
  np.testing.assert_array_equal(out, codes)
