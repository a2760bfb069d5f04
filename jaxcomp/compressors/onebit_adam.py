"""1-bit Adam: Adam whose momentum crosses the wire as 1-bit codes (Tang et al., ICML 2021).

Adam's variance ``v`` becomes stable early in training (§3, Fig. 1); once it
is frozen, Adam is momentum SGD with a fixed per-coordinate preconditioner,
and the momentum can be exchanged with error-compensated 1-bit compression
(§3–4, Algorithm 1). Two stages, switched at ``freeze_step`` inside ``jit``
(the step count is traced):

* **warm-up** (steps ``1 … freeze_step``): the gradients are averaged in float
  (``jaxcomp.compress(None)``, a ``pmean``) and the update is Adam's:
  ``m ← β1·m + (1−β1)·ḡ``, ``v ← β2·v + (1−β2)·ḡ²`` with ``ḡ`` the mean
  gradient: the same numbers as ``optax.adam`` applied to ``ḡ``;
* **compression** (from step ``freeze_step + 1`` on): ``v`` is frozen; worker
  ``i`` updates the momentum with its own gradient,
  ``m_i = β1·m + (1−β1)·g_i`` (Algorithm 1, line 6), and the ``m_i`` are
  averaged by jaxcomp's two-phase exchange (:mod:`jaxcomp.exchange.two_phase`) with
  error feedback in both phases: the worker compresses ``m_i + δ_i`` and
  keeps the **worker error** ``δ_i`` (line 7, the shared residual of
  :func:`jaxcomp.compress`); the worker that reduces shard ``j`` compresses
  the shard's mean plus its **server error** ``δ̄_j`` and keeps ``δ̄_j``
  (line 10, the two-phase shard residual); every worker decodes all shards:
  the new ``m``, identical on every worker (line 13).

The update is ``x ← x − lr·m̂/(√v̂ + ε)`` in both stages, with Adam's bias
corrections ``m̂ = m/(1 − β1^t)`` and ``v̂ = v/(1 − β2^min(t, freeze_step))``:
after the freeze ``v̂`` is the bias-corrected variance of the last warm-up
step, so the step size does not jump at the switch.

**The conservation identity.** Write ``M_t = mean_i m_i,t`` for what is fed
to step ``t``'s exchange and ``m_t`` for what it delivers. Phase 1 delivers,
per shard, ``mean_i(m_i + δ_i,old − δ_i,new)``; phase 2 adds the server error
and keeps the new one: ``m_t = M_t + mean_i(δ_i,old − δ_i,new) + Σ_j(δ̄_j,old −
δ̄_j,new)``. Errors start at zero, so after any number of compressed steps::

  Σ_t m_t + mean_i(δ_i) + Σ_j δ̄_j = Σ_t M_t

exactly up to float rounding (``δ̄_j`` lives on the worker that reduces shard
``j``, in a full-size buffer zero outside that shard, so ``Σ_j δ̄_j`` is the
sum over workers of their server-error buffers). Tested in
``tests/test_onebit_adam.py``.

**The 1-bit code** (:class:`OneBitAdamSign`): ``C(x) = s·sign(x)`` with
``sign(0) = +1`` and ``s = ‖x‖₂/√d`` (the root mean square), as in the
authors' implementation (DeepSpeed, ``deepspeed/runtime/comm/nccl.py``,
``NcclBackend.compressed_allreduce``: ``worker_scale = torch.norm(buffer_m) /
np.sqrt(torch.numel(buffer_m))``, the same for ``server_scale``), not the
``‖x‖₁/d`` of EF-SignSGD (:class:`~jaxcomp.EFSignSGD`, whose wire it shares:
``ceil(d/8)`` bytes of signs and a float32 scale).

Decisions (tested in ``tests/test_onebit_adam.py``):

* **Scales per chunk.** jaxcomp's phase 1 encodes each of the ``N`` chunks of
  a tensor on its own, so a worker sends ``N`` scales per tensor where
  DeepSpeed sends one per tensor; the server scales are per shard in both.
  Error feedback makes any scale exact in the long run; ``N − 1`` more
  float32 per tensor and worker are counted in the bytes.
* **Small tensors**: a tensor of fewer than ``N·40`` values is too small to
  split over ``N`` workers and takes the all-gather of the 1-bit payloads
  (:func:`jaxcomp.exchange.plan.choose`): it has a worker error and no server
  error (its mean is not re-compressed), and the identity holds with
  ``δ̄ = 0``. ``exchange="all_gather"`` does that for every tensor;
  ``skip``/``min_size`` keep tensors in float (their momentum is averaged in
  float after the freeze).
* **Bias correction**: the warm-up is ``optax.adam`` (Kingma & Ba's bias
  corrections; the paper's Algorithm 1 runs "the original Adam" during the
  warm-up). DeepSpeed's ``OnebitAdam`` applies no bias correction in either
  stage; for ``freeze_step ≫ 1/(1 − β2)`` the two agree to within
  ``β2^freeze_step``.
* ``freeze_step >= 1``: the frozen variance must have been estimated; with
  ``v = 0`` the update would be ``m/ε``.
* **ε after the freeze.** The 1-bit code gives every coordinate of a tensor
  the same magnitude (its root mean square), so a coordinate whose frozen
  variance is near 0 moves by about ``lr·rms/ε``. With Adam's ``ε = 1e-8``,
  LeNet on Fashion-MNIST diverged within 20 steps of the freeze; with
  ``ε = 1e-4`` it trains (``configs/zoo.py``). Raise ``ε`` for models with
  coordinates whose gradients are (nearly) always zero.
* **Bytes** (:func:`jaxcomp.metrics`): during the warm-up those of the float
  exchange of the gradients (``bytes_on_wire = float32_bytes`` for float32
  gradients; with ``exchange`` other than ``"all_gather"``,
  ``received_bytes`` is a ring all-reduce's ``2(N−1)/N`` of them); after the
  freeze those of the 1-bit exchange of the momentum. The exchange that did
  not run reports zero: the two exchanges' counters are switched inside the
  same ``lax.cond`` as the collectives. Before the first update the state
  reports the warm-up's per-step sizes (``received_bytes`` 0: the number of
  workers is known only in the update).
* The momentum and variance are float32 (replicated: identical on every
  worker); the worker and server errors are worker-local
  (:class:`~jaxcomp.core.WorkerLocal`, so ``vmap``/``pmap``/``shard_map``
  give them a worker axis). The errors start at zero at the freeze (they are
  untouched during the warm-up).

**How the learning rate reaches it.** :func:`onebit_adam` takes
``learning_rate`` (a float or an optax schedule), like ``optax.adam``. From an
experiment config (``config.compressor = "onebit_adam"``) it is an optimizer
wrapper (``jaxcomp.compressors.WRAPPERS``, :func:`wrap_optimizer`): the
config's optimizer is applied to 1-bit Adam's direction ``m̂/(√v̂ + ε)`` and
so must only scale by the learning rate: ``config.optimizer = "sgd"`` (its
schedule, warm-up and decoupled weight decay apply as they do to any
optimizer). An optimizer with moments of its own (momentum, Adam, AdaGrad)
is refused: 1-bit Adam *is* the optimizer.

References:
  Tang, Gan, Awan, Rajbhandari, Li, Lian, Liu, Zhang, He. *1-bit Adam:
  Communication Efficient Large-Scale Training with Adam's Convergence
  Speed*. ICML 2021 (arXiv:2102.02888), §3–4, Algorithm 1.
  Kingma, Ba. *Adam: A Method for Stochastic Optimization*. ICLR 2015,
  Algorithm 1 (bias correction).
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import parallel
from jaxcomp import transforms
from jaxcomp.compressors import _direction
from jaxcomp.compressors.ef_signsgd import EFSignSGD, ScaledSignPayload
from jaxcomp.compressors.signsgd import sign_bits
from jaxcomp.exchange import plan


@dataclasses.dataclass(frozen=True)
class OneBitAdamSign(EFSignSGD):
  """1-bit Adam's compressor: ``(‖x‖₂/√d)·sign(x)``, ``sign(0) = +1`` (EF-SignSGD's wire).

  The root-mean-square scale of the authors' ``compressed_allreduce`` (see
  the module docstring); decoding is :class:`~jaxcomp.EFSignSGD`'s.
  """

  def encode(self, x, key, agreed):
    del key, agreed
    x = x.reshape(-1).astype(jnp.float32)
    scale = jnp.sqrt(jnp.mean(jnp.square(x))) if x.size else jnp.float32(0)
    return ScaledSignPayload(signs=sign_bits(x), scale=scale.astype(jnp.float32))


class OneBitAdamState(NamedTuple):
  """State of :func:`scale_by_onebit_adam`."""

  count: jax.Array  # int32: updates so far, identical on every worker
  mu: Any  # float32, params-shaped: the averaged momentum m, identical on every worker
  nu: Any  # float32: the variance v, frozen from freeze_step on
  warmup: Any  # the float exchange's state (jaxcomp.compress(None)); counters zero after the freeze
  # The 1-bit exchange's state (jaxcomp.compress(OneBitAdamSign(), error_feedback=True)): the
  # worker errors in .local.residual, the server errors in .shard.residual; counters zero before.
  compressed: Any


def _counters(state: Any, fn) -> Any:
  """``state`` with ``fn`` applied to every counter of every compression transform in it."""

  def fix(x):
    if not isinstance(x, core.WorkerLocal):
      return x
    return x._replace(metrics={k: fn(k, v) for k, v in x.metrics.items()})

  return jax.tree.map(fix, state, is_leaf=lambda x: isinstance(x, core.WorkerLocal))


def _silenced(state: Any) -> Any:
  """Every counter 0 (traced form): this exchange did not run."""
  return _counters(state, lambda k, c: c.zeros_like())


def _traced(state: Any) -> Any:
  """Every counter in its traced form (same values), so both branches of the switch match."""
  return _counters(state, lambda k, c: c.traced())


def _check(b1, b2, eps, freeze_step) -> None:
  for name, b in (("b1", b1), ("b2", b2)):
    hyperparams.check_number(b, name, lambda v: 0.0 <= v < 1.0, "a float in [0, 1)")
  hyperparams.check_number(eps, "eps", lambda v: v > 0.0, "a float > 0 (the update divides by sqrt(v) + eps)")
  if hyperparams.is_traced(freeze_step):  # injected: an integer scalar, compared with the step counter
    if not jnp.issubdtype(freeze_step.dtype, jnp.integer) or freeze_step.shape:
      raise ValueError(f"freeze_step must be an int >= 1; got {freeze_step!r}.")
  elif isinstance(freeze_step, bool) or not isinstance(freeze_step, (int, np.integer)) or freeze_step < 1:
    raise ValueError(
        f"freeze_step must be an int >= 1: the number of full-precision Adam steps that estimate the "
        f"variance before it is frozen (1-bit Adam, Algorithm 1); got {freeze_step!r}.")


def scale_by_onebit_adam(
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    freeze_step: int,
    axis_name: parallel.AxisName = None,
    exchange: plan.Exchange = "two_phase",
    **compress_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """1-bit Adam's exchange and preconditioning: updates are ``m̂/(√v̂ + ε)`` (no learning rate).

  :func:`onebit_adam` follows it with ``optax.scale_by_learning_rate``; see
  the module docstring for the algorithm.

  Args:
    b1: the momentum's decay ``β1``, in ``[0, 1)``.
    b2: the variance's decay ``β2``, in ``[0, 1)``.
    eps: added to ``√v̂``, ``> 0``.
    freeze_step: full-precision Adam steps before the variance is frozen and
      the momentum is exchanged in 1 bit (an int ``>= 1``).
    axis_name: the named worker axis (see :func:`jaxcomp.compress`).
    exchange: how the 1-bit momentum crosses the wire: ``"two_phase"``
      (default: the paper's compressed reduce-scatter and all-gather with a
      server error), ``"all_gather"`` (no server error) or ``"auto"``.
    **compress_kwargs: :func:`jaxcomp.compress`'s ``skip``, ``min_size``,
      ``seed``, ``nonfinite``, ``bucket_bytes``, ``within`` for the 1-bit exchange (``skip`` and
      ``min_size`` keep tensors in float after the freeze).

  Returns:
    An ``optax.GradientTransformationExtraArgs``.

  Raises:
    ValueError: for ``b1``, ``b2`` outside ``[0, 1)``, ``eps <= 0`` or
      ``freeze_step < 1``.
    TypeError: for other keyword arguments.
  """
  _check(b1, b2, eps, freeze_step)
  if compress_kwargs.get("error_feedback") is False:
    raise ValueError("1-bit Adam's compression is error-compensated: error_feedback cannot be False.")
  compress_kwargs.pop("error_feedback", None)
  unexpected = sorted(set(compress_kwargs) - {"skip", "min_size", "seed", "nonfinite", "bucket_bytes", "within"})
  if unexpected:
    raise TypeError(f"onebit_adam got unexpected keyword arguments {unexpected}.")
  warm_tx = transforms.compress(None, axis_name=axis_name, exchange=exchange, **{
      k: v for k, v in compress_kwargs.items() if k in ("bucket_bytes", "within")})
  onebit_tx = transforms.compress(OneBitAdamSign(), axis_name=axis_name, error_feedback=True,
                                  exchange=exchange, **compress_kwargs)

  def init_fn(params):
    zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params)
    return OneBitAdamState(
        count=jnp.zeros((), jnp.int32),
        mu=zeros,
        nu=zeros,
        warmup=_traced(warm_tx.init(params)),
        compressed=_silenced(onebit_tx.init(params)),
    )

  def update_fn(updates, state, params=None, **extra_args):
    del params, extra_args

    def warm(mu, nu, warm_state, onebit_state):
      mean, warm_state = warm_tx.update(updates, warm_state)
      mean = jax.tree.map(lambda g: g.astype(jnp.float32), mean)
      mu = optax.tree.update_moment(mean, mu, b1, 1)
      nu = optax.tree.update_moment_per_elem_norm(mean, nu, b2, 2)
      return mu, nu, _traced(warm_state), _silenced(onebit_state)

    def compressed(mu, nu, warm_state, onebit_state):
      local = jax.tree.map(lambda g, m: b1 * m + (1 - b1) * g.astype(jnp.float32), updates, mu)
      mu, onebit_state = onebit_tx.update(local, onebit_state)
      return mu, nu, _silenced(warm_state), _traced(onebit_state)

    operands = (state.mu, state.nu, state.warmup, state.compressed)
    mu, nu, warm_state, onebit_state = parallel.replicated_cond(
        state.count >= freeze_step, compressed, warm, *operands)
    count = optax.safe_increment(state.count)
    mu_hat = optax.tree.bias_correction(mu, b1, count)
    nu_hat = optax.tree.bias_correction(nu, b2, jnp.minimum(count, freeze_step))
    direction = jax.tree.map(lambda m, v, g: (m / (jnp.sqrt(v) + eps)).astype(g.dtype), mu_hat, nu_hat, updates)
    return direction, OneBitAdamState(count=count, mu=mu, nu=nu, warmup=warm_state, compressed=onebit_state)

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


@hyperparams.factory()
def onebit_adam(
    learning_rate: optax.ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    *,
    freeze_step: int,
    axis_name: parallel.AxisName = None,
    exchange: plan.Exchange = "two_phase",
    **compress_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """1-bit Adam as an optax optimizer, used like ``optax.adam`` (it averages over ``axis_name`` itself).

  Example::

    tx = jaxcomp.onebit_adam(1e-3, freeze_step=1000, axis_name="workers")
    # inside vmap/pmap/shard_map over "workers": no pmean, no other optimizer
    updates, opt_state = tx.update(grads, opt_state, params)

  Args:
    learning_rate: a float or an optax schedule (indexed by update).
    b1, b2, eps, freeze_step, axis_name, exchange, **compress_kwargs: see
      :func:`scale_by_onebit_adam`.

  Returns:
    An ``optax.GradientTransformationExtraArgs``: ``optax.chain`` of
    :func:`scale_by_onebit_adam` and ``optax.scale_by_learning_rate``.
  """
  return optax.with_extra_args_support(optax.chain(
      scale_by_onebit_adam(b1, b2, eps, freeze_step=freeze_step, axis_name=axis_name, exchange=exchange,
                           **compress_kwargs),
      optax.scale_by_learning_rate(learning_rate),
  ))


def wrap_optimizer(optimizer: optax.GradientTransformation, **kwargs: Any) -> optax.GradientTransformationExtraArgs:
  """1-bit Adam from a config: ``optimizer`` applies the learning rate to its direction.

  Registered as ``jaxcomp.compressors.WRAPPERS["onebit_adam"]``, so that
  ``jaxcomp.make_optimizer("onebit_adam", optax.sgd(schedule), freeze_step=..., axis_name=...)``
  (what ``experiments.train`` builds from ``config.compressor="onebit_adam"``,
  ``config.optimizer="sgd"``) is ``optax.chain(scale_by_onebit_adam(...), optimizer)``.

  Args:
    optimizer: an optimizer that only scales (``optax.sgd(learning_rate)``,
      possibly after ``optax.add_decayed_weights``): its state may hold step
      counters, no moments.
    **kwargs: :func:`scale_by_onebit_adam`'s arguments.

  Raises:
    ValueError: if ``optimizer`` keeps moments of its own (momentum, Adam, ...).
  """
  return _direction.optimizer_after(scale_by_onebit_adam(**kwargs), optimizer, "onebit_adam")
