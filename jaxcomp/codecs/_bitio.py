"""Vectorized host-side bit streams (NumPy) for the Elias and Rice codecs.

Bits are written most-significant first: bit ``k`` of a stream is bit
``7 - k % 8`` of byte ``k // 8`` (``np.packbits``' default order), and the
last byte is padded with zero bits.

Nothing here loops over bits or over codes in Python:

* :func:`write_fields` places ``(value, width)`` fields with ``width <= 64``
  into big-endian 64-bit words: each field lands in one word or straddles
  two, so a ``bitwise_or.reduceat`` over the fields of each word plus one
  OR for the straddling tails builds the stream.
* :class:`BitReader` reads a 64-bit window at any set of bit positions.
* :func:`follow_chain` finds the start of every code in a stream of
  variable-length codes, given the end of a code that would start at *each*
  bit position (computed speculatively and vectorized), by pointer doubling
  (``log2(#codes)`` rounds of ``next = next[next]``).
"""

from __future__ import annotations

import numpy as np

_U64 = np.uint64


def bit_length(v: np.ndarray) -> np.ndarray:
  """Vectorized ``int.bit_length`` for non-negative integers (< 2**64)."""
  v = np.asarray(v).astype(_U64)
  n = np.zeros(v.shape, np.int64)
  for s in (32, 16, 8, 4, 2, 1):
    big = v >= (_U64(1) << _U64(s))
    n += s * big
    v = np.where(big, v >> _U64(s), v)
  return n + (v > 0)


def write_fields(values: np.ndarray, widths: np.ndarray) -> tuple[np.ndarray, int]:
  """Concatenates bit fields into a byte stream.

  Args:
    values: unsigned integers; only the low ``width`` bits are written.
    widths: field widths in bits, ``0 <= width <= 64``; zero-width fields
      are skipped.

  Returns:
    ``(data, num_bits)``: ``uint8[ceil(num_bits / 8)]`` and the exact number
    of meaningful bits.
  """
  widths = np.asarray(widths, np.int64).reshape(-1)
  values = np.asarray(values).astype(_U64).reshape(-1)
  keep = widths > 0
  widths, values = widths[keep], values[keep]
  if widths.size and widths.max() > 64:
    raise ValueError("a bit field is wider than 64 bits")
  num_bits = int(widths.sum())
  if num_bits == 0:
    return np.zeros((0,), np.uint8), 0
  # Mask off bits above the width (so callers may pass e.g. all-ones).
  full = widths == 64
  mask = np.where(full, ~_U64(0),
                  (_U64(1) << np.where(full, 0, widths).astype(_U64)) - _U64(1))
  values = values & mask
  end = np.cumsum(widths)
  start = end - widths
  word = start >> 6
  off = start & 63
  stop = off + widths  # bit offset of the field's end within its word, <= 127
  fits = stop <= 64
  head = np.where(
      fits, values << np.where(fits, 64 - stop, 0).astype(_U64),
      values >> np.where(fits, 0, stop - 64).astype(_U64))
  spill = np.where(fits, 0, stop - 64)
  tail = np.where(fits, _U64(0),
                  values << np.where(fits, 0, 64 - spill).astype(_U64))
  n_words = (num_bits + 63) // 64 + 1
  words = np.zeros((n_words,), _U64)
  first = np.flatnonzero(np.r_[True, word[1:] != word[:-1]])
  words[word[first]] = np.bitwise_or.reduceat(head, first)
  straddle = ~fits
  words[word[straddle] + 1] |= tail[straddle]
  data = words.astype(">u8").view(np.uint8)
  return data[:(num_bits + 7) // 8].copy(), num_bits


class BitReader:
  """Random access to 64-bit windows of a byte stream (MSB-first)."""

  def __init__(self, data: np.ndarray):
    data = np.asarray(data, np.uint8).reshape(-1)
    n_words = (data.shape[0] + 7) // 8 + 1
    padded = np.zeros((n_words * 8,), np.uint8)
    padded[:data.shape[0]] = data
    self.words = padded.view(">u8").astype(_U64)
    self.num_bits = 8 * data.shape[0]

  def window(self, pos: np.ndarray) -> np.ndarray:
    """The 64 bits starting at each bit position (zeros past the end)."""
    pos = np.asarray(pos, np.int64)
    w = pos >> 6
    o = (pos & 63).astype(_U64)
    hi = self.words[w] << o
    lo = np.where(o == 0, _U64(0),
                  self.words[np.minimum(w + 1, self.words.shape[0] - 1)]
                  >> ((_U64(64) - o) & _U64(63)))
    return hi | lo

  def read(self, pos: np.ndarray, width: np.ndarray | int) -> np.ndarray:
    """``width``-bit unsigned values (1 <= width <= 64) at ``pos``."""
    width = np.asarray(width, np.int64)
    shift = (64 - np.clip(width, 1, 64)).astype(_U64)
    out = self.window(pos) >> shift
    return np.where(width <= 0, _U64(0), out)

  def bits(self, pos: np.ndarray) -> np.ndarray:
    """Single bits at ``pos`` as uint8."""
    pos = np.asarray(pos, np.int64)
    w = pos >> 6
    return ((self.words[w] >> (_U64(63) - (pos & 63).astype(_U64)))
            & _U64(1)).astype(np.uint8)


def follow_chain(nxt: np.ndarray, start: int, end: int,
                 max_codes: int | None = None) -> tuple[np.ndarray, int]:
  """Positions of consecutive codes, found by pointer doubling.

  Args:
    nxt: int64 array of length ``end + 2``. ``nxt[p]`` is the bit position
      right after a code that starts at ``p`` (``p < end``), ``end`` if that
      code ends exactly at the end of the stream, and ``end + 1`` if it would
      run past the end or is invalid. ``nxt[end] = end`` and
      ``nxt[end + 1] = end + 1`` (absorbing). ``nxt[p] > p`` for ``p < end``.
    start: position of the first code.
    end: number of meaningful bits.
    max_codes: stop once this many codes are found (then the terminal state
      is the end of the last of them).

  Returns:
    ``(starts, stop)``: the increasing start positions of the codes in the
    chain from ``start`` (at most ``max_codes``), and where the last one ends
    (``end + 1`` means the stream ended in the middle of a code).
  """
  if start >= end:
    return np.zeros((0,), np.int64), start if start == end else end + 1
  found = np.array([start], np.int64)
  jump = nxt
  while True:
    if max_codes is not None and found.size >= max_codes:
      break
    new = jump[found]
    new = new[new < end]
    found = np.concatenate([found, new])
    if new.size < found.size - new.size:  # the chain ended in this round
      break
    jump = jump[jump]
  found.sort()
  if max_codes is not None:
    found = found[:max_codes]
  return found, int(nxt[found[-1]])
