"""Lossless wire codecs: packing quantized codes into bytes.

Pure functions with exact round trips (see ``docs/benchmarks.md`` for speed):

* :mod:`~jaxcomp.codecs.twobit` — TernGrad's 2-bit packing, four ternary
  values per byte (JAX, jit-able).
* :mod:`~jaxcomp.codecs.base243` — 3LC's base-3^5 encoding, five ternary
  values per byte (3LC §3.2; JAX, jit-able).
* :mod:`~jaxcomp.codecs.zerorun` — 3LC's zero-run encoding of base-3^5 bytes
  (3LC §3.3; JAX, jit-able with static shapes, plus host wrappers, the
  partitioned form and a capacity-bounded wire format).
* :mod:`~jaxcomp.codecs.elias` — recursive Elias (omega) coding and QSGD's
  message format (QSGD §3.1; host, NumPy).
* :mod:`~jaxcomp.codecs.sparse` — one 32-bit word per sent value, and delta +
  Golomb-Rice index coding (Dryden et al. §3.2; words in JAX, Rice on host).

Accounting: ``bytes_on_wire`` is the static size of the arrays a collective
moves (``packed_2bit_size``, ``base243_size``, ``sparse_words_bytes``, a
zero-run ``capacity``); ``encoded_bytes`` is the exact size of a
variable-length encoding (``zero_run_length``, ``bits_to_bytes`` of
``qsgd_message_bits`` / ``sparse_rice_bits``).

Host-side ``*_checked`` variants validate their input and raise ``ValueError``
with a precise message on truncated or corrupted streams.
"""

from jaxcomp.codecs.base243 import (ZERO_GROUP_BYTE, base243_decode,
                                    base243_decode_checked, base243_encode,
                                    base243_encode_checked, base243_size)
from jaxcomp.codecs.elias import (EliasMessage, bits_to_bytes,
                                  elias_omega_bits, elias_omega_decode,
                                  elias_omega_encode, elias_omega_lengths,
                                  qsgd_decode, qsgd_encode, qsgd_message_bits)
from jaxcomp.codecs.sparse import (MAX_INDEX, RiceMessage, rice_parameter,
                                   sparse_rice_bits, sparse_rice_decode,
                                   sparse_rice_encode, sparse_words_bytes,
                                   sparse_words_decode,
                                   sparse_words_decode_checked,
                                   sparse_words_encode,
                                   sparse_words_encode_checked)
from jaxcomp.codecs.twobit import (pack_2bit, pack_2bit_checked,
                                   packed_2bit_size, unpack_2bit,
                                   unpack_2bit_checked)
from jaxcomp.codecs.zerorun import (MAX_RUN, RUN_BYTE, ZeroRunPacked,
                                    zero_run_capacity, zero_run_decode,
                                    zero_run_decode_checked,
                                    zero_run_decode_jax, zero_run_encode,
                                    zero_run_encode_checked,
                                    zero_run_encode_jax,
                                    zero_run_encode_partitioned,
                                    zero_run_expanded_length, zero_run_length,
                                    zero_run_pack_fixed, zero_run_unpack_fixed)
from jaxcomp.codecs._common import check_ternary

__all__ = [
    "EliasMessage", "MAX_INDEX", "MAX_RUN", "RUN_BYTE", "RiceMessage",
    "ZERO_GROUP_BYTE", "ZeroRunPacked", "base243_decode",
    "base243_decode_checked", "base243_encode", "base243_encode_checked",
    "base243_size", "bits_to_bytes", "check_ternary", "elias_omega_bits",
    "elias_omega_decode", "elias_omega_encode", "elias_omega_lengths",
    "pack_2bit", "pack_2bit_checked", "packed_2bit_size", "qsgd_decode",
    "qsgd_encode", "qsgd_message_bits", "rice_parameter", "sparse_rice_bits",
    "sparse_rice_decode", "sparse_rice_encode", "sparse_words_bytes",
    "sparse_words_decode", "sparse_words_decode_checked",
    "sparse_words_encode", "sparse_words_encode_checked", "unpack_2bit",
    "unpack_2bit_checked", "zero_run_capacity", "zero_run_decode",
    "zero_run_decode_checked", "zero_run_decode_jax", "zero_run_encode",
    "zero_run_encode_checked", "zero_run_encode_jax",
    "zero_run_encode_partitioned", "zero_run_expanded_length",
    "zero_run_length", "zero_run_pack_fixed", "zero_run_unpack_fixed",
]
