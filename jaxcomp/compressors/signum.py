"""Signum: signSGD with each worker's momentum and a majority vote (Bernstein et al., ICML 2018 / ICLR 2019).

Every worker keeps its own momentum of its gradients and votes with its sign;
the update is the majority vote (Bernstein et al. 2019, Algorithm 1, "Signum
with majority vote"; Bernstein et al. 2018, Algorithm 2, "Signum")::

    m_i ← β·m_i + (1 − β)·g_i           (on worker i)
    update = sign(Σ_i sign(m_i))

The momentum is worker-local optimizer state: it lives in a
:class:`jaxcomp.core.WorkerLocal` (:mod:`jaxcomp.compressors._momentum`), so
under ``vmap``/``pmap``/``shard_map`` every worker has its own and carries it
from step to step. The wire and the vote are signSGD's
(:class:`jaxcomp.SignSGD`, :mod:`jaxcomp.compressors.signsgd`): one sign bit
per element packed eight per byte, plus a one-byte "nonzero" flag per tensor,
``ceil(n/8) + 1`` bytes; ties of the vote give 0, ``sign(0) = +1`` per
element, an all-zero worker abstains. The update is not rescaled: the
learning rate of the optimizer that follows sets the step
(``optax.chain(jaxcomp.signum(...), optax.sgd(lr))``, which is the paper's
``x ← x − η·sign(...)``).

Decisions (tested in ``tests/test_zoo_signum_dgc.py``):

* ``β = 0`` is signSGD with majority vote exactly (``m = g``).
* The momentum is float32 whatever the gradients' dtype; the vote is on the
  momentum cast to the gradients' dtype, as signSGD votes on the gradient.
* Tensors kept in float (``skip``, ``min_size``) have no momentum: their
  gradient is averaged in float as it is, exactly as with signSGD (the
  momentum only feeds the votes).
* A worker whose momentum holds a NaN or Inf for a tensor keeps its previous
  momentum for that tensor (as the shared error feedback keeps its residual);
  the exchange's ``nonfinite`` policy decides the update.
* No error feedback by default (the paper uses none), as for signSGD.

References:
  Bernstein, Wang, Azizzadenesheli, Anandkumar. *signSGD: Compressed
  Optimisation for Non-Convex Problems*. ICML 2018 (arXiv:1802.04434),
  Algorithm 2 ("Signum"). Bernstein, Zhao, Azizzadenesheli, Anandkumar.
  *signSGD with Majority Vote is Communication Efficient and Fault Tolerant*.
  ICLR 2019 (arXiv:1810.05291), Algorithm 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import optax

from jaxcomp import hyperparams
from jaxcomp import transforms
from jaxcomp.compressors import _momentum
from jaxcomp.compressors.signsgd import SignSGD


@dataclasses.dataclass(frozen=True)
class Signum(SignSGD):
  """Signum's per-tensor compressor: signSGD's sign bits and majority vote.

  The momentum is not part of the compressor (it is worker-local state of
  :func:`signum`); this class names the compressor the transform uses.
  """


@hyperparams.factory()
def signum(beta: float = 0.9, **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """Signum with majority vote as an optax transform.

  Example::

    tx = optax.chain(jaxcomp.signum(0.9, axis_name="workers"), optax.sgd(1e-4))

  Args:
    beta: the momentum factor ``β`` in ``[0, 1)`` (the papers use 0.9);
      ``m ← β·m + (1 − β)·g`` on every worker.
    **kwargs: passed to :func:`jaxcomp.compress` (``axis_name``, ``skip``,
      ``min_size``, ``seed``, ``nonfinite``, ``error_feedback``: off).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose updates are the
    majority vote in {−1, 0, +1} of the workers' momenta.

  Raises:
    ValueError: if ``beta`` is not in ``[0, 1)``.
  """
  _momentum.check_momentum(beta, "beta")
  return _momentum.with_worker_momentum(
      transforms.compress(Signum(), **kwargs), momentum=beta, dampening=1.0 - beta,
      bypass=_momentum.exchange_skips(kwargs.get("skip"), kwargs.get("min_size", 0)))
