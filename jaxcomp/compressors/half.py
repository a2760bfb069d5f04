"""Half-precision all-reduce (after PyTorch DDP's ``fp16_compress_hook`` / ``bf16_compress_hook``).

Per tensor, on every worker ``w`` of ``N``:

1. ``h_w = cast(x_w / N)``: divide by the number of workers, then cast to
   ``bfloat16`` (default) or ``float16``;
2. ``s = psum(h_w)``: an **all-reduce** of the half-precision values (2 bytes
   a value), not an all-gather: the decode is linear, so the workers' halves
   can be summed on the wire;
3. ``mean = float32(s)``, the same on every worker.

The wire: ``n`` values of 2 bytes, ``2·n`` bytes handed to the all-reduce
(``bytes_on_wire``); a ring all-reduce makes each worker receive about
``2(N − 1)/N`` of that (``received_bytes``, as for PowerSGD). This is a
custom exchange (``custom_exchange = True``), like PowerSGD's: the shared
exchange of :mod:`jaxcomp.parallel` all-gathers payloads.

The order of the first step differs from the PyTorch hooks, which cast first
and divide the half-precision tensor by the world size. Dividing first, a
worker's ``float16`` value overflows only if ``|x_w|/N > 65504`` (not
already at ``|x_w| > 65504``), and the division is done in float32 (one
rounding, in the cast, instead of two); the price is that small values come
``N`` times closer to ``float16``'s underflow (``bfloat16`` has float32's
exponent range, so neither matters there). Either way the all-reduce sums
values already divided by ``N``: a partial sum overflows only if the mean
itself is out of range.

Decisions (tested in ``tests/test_zoo_sparse_half_natural.py``):

* **No error feedback by default** (DDP's hooks keep none). With
  ``error_feedback=True`` the worker's own message is what it handed to the
  all-reduce, scaled back: ``own = N·float32(h_w)``, so the residual keeps
  exactly the cast's rounding error ``x_w − N·float32(cast(x_w/N))``.
  Conservation then holds per worker (``Σ own + r = Σ x``) exactly, and for
  the mean up to the rounding of the half-precision sum itself
  (``mean − mean_w(own_w)``, at most about ``(N − 1)`` half-precision
  roundings of the partial sums per element), which no worker's residual can
  hold: it happens inside the collective.
* **Range**: ``bfloat16`` has float32's exponent range (only its precision is
  cut, to 8 significant bits); ``float16`` holds ``|v| ≤ 65504`` with 11
  significant bits and flushes magnitudes below about ``6·10⁻⁸`` to zero. An
  element with ``|x_w|/N > 65504`` becomes ``±inf`` in ``float16`` (the mean
  is then ``±inf``, as with DDP's hook; use ``bfloat16`` when gradients can
  be that large).
* **The summation** runs in the half dtype, as NCCL's half all-reduce does;
  its order (a ring, a tree, the pairwise halving of
  :func:`jaxcomp.parallel.psum` over simulated workers) can change the last
  bit of a half-precision sum. On CPU a ``bfloat16`` sum over devices is
  built from a reduce-scatter and an all-gather of the 16-bit values, each
  chunk summed in float32 and rounded once (XLA:CPU would otherwise promote
  the ``bfloat16`` all-reduce to float32 and move 4 bytes a value; see
  :func:`jaxcomp.parallel.psum`): the same bytes as a ring all-reduce.
* ``encode``/``decode`` are the plain cast of one message and its inverse
  (the protocol's per-message view); the exchange encodes ``x_w / N``.

References:
  PyTorch, ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks``:
  ``fp16_compress_hook`` and ``bf16_compress_hook`` (cast to half precision,
  divide by the world size, ``allreduce`` the half tensor, cast back).
  Micikevicius et al. *Mixed Precision Training*. ICLR 2018, §3.2 (float16's
  range and the underflow of small gradient values).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import parallel
from jaxcomp import transforms

DTYPES = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}


class HalfPayload(NamedTuple):
  values: jax.Array  # bfloat16[n] or float16[n]: this worker's x / N, before the all-reduce


@dataclasses.dataclass(frozen=True)
class Half(core.Compressor):
  """Half-precision all-reduce (see the module docstring).

  Attributes:
    dtype: ``"bfloat16"`` (default, ``bf16_compress_hook``) or ``"float16"``
      (``fp16_compress_hook``).
  """

  dtype: str = "bfloat16"

  custom_exchange = True

  def __post_init__(self):
    if self.dtype not in DTYPES:
      raise ValueError(f"dtype must be one of {', '.join(map(repr, DTYPES))}; got {self.dtype!r}.")

  def encode(self, x, key, agreed):
    del key, agreed
    return HalfPayload(values=x.reshape(-1).astype(DTYPES[self.dtype]))

  def decode(self, payload, shape):
    return payload.values.astype(jnp.float32).reshape(shape)

  def exchange(self, x, key, axis_name, state):
    workers = parallel.axis_size(axis_name)
    payload = self.encode(x / workers, key, None)
    total = yield core.Message("sum", payload)
    own = self.decode(payload, x.shape) * workers
    return core.Exchanged(mean=self.decode(total, x.shape), own=own, payload=payload, state=state)


@hyperparams.factory()
def half(dtype: str = "bfloat16", **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """Half-precision all-reduce (after PyTorch DDP's fp16/bf16 compress hooks) as an optax transform.

  Example::

    tx = optax.chain(jaxcomp.half("bfloat16", axis_name="workers"), optax.sgd(0.1, momentum=0.9))

  Args:
    dtype: ``"bfloat16"`` or ``"float16"``.
    **kwargs: passed to :func:`jaxcomp.compress` (``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback``: off by
      default, as in DDP).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.
  """
  return transforms.compress(Half(dtype=dtype), **kwargs)
