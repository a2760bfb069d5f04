"""Local steps: exchange every ``k`` steps (3LC §4.2, "2 local steps").

3LC's "2 local steps" "transmits state changes every 2 local steps. Unsent
updates are accumulated locally and sent at the next training step. It
reduces the traffic almost by half and effectively doubles the global batch
size of distributed training."

In a gradient-exchange framework with replicated parameters the optimizer
must not step between exchanges: a zero averaged gradient would still move
the weights through momentum or Adam's moments, and workers would step on
different local gradients otherwise. So this is an **optimizer wrapper** (in
the spirit of ``optax.MultiSteps``), registered in
``jaxcomp.compressors.WRAPPERS``:

* steps ``1 … k−1`` of every window: the worker adds its gradient to a local
  float32 accumulator; the update is zero; the optimizer state and the
  exchange's state (e.g. an error-feedback residual) are untouched; nothing
  crosses the wire;
* step ``k``: the accumulated **mean** ``(g_1 + … + g_k) / k`` is exchanged
  (a float ``pmean`` by default, or any registered compressor), the optimizer
  is applied to the exchanged average, and the accumulator is reset.

Decisions (tested in ``tests/test_local_steps.py``):

* **Mean, not sum**: 3LC says the scheme "effectively doubles the global batch
  size"; the gradient of a batch twice as large is the mean of the two
  halves' gradients, so the learning rate keeps its meaning.
* The exchange happens on the ``k``-th, ``2k``-th … call; a window that has not
  ended keeps its gradients in the accumulator (the "analogous accounting":
  ``k · Σ exchanged means + mean_w(accumulator_w) = mean_w(Σ_t g_w,t)`` for a
  float exchange).
* The branch is a ``lax.cond`` on the replicated step counter, so the
  collectives run only on exchange steps, on every worker alike (this works
  under ``vmap``, ``pmap``, ``shard_map`` and their combinations).
* **Metrics** (:func:`jaxcomp.metrics` finds them in the exchange's state): on
  an exchange step, everything the exchange reports; on the other steps every
  wire counter (``bytes_on_wire``, ``encoded_bytes``, compressor counters …)
  is 0, while the reference sizes ``float32_bytes`` and
  ``compressed_float32_bytes`` keep their per-step values, so sums and
  averages over steps come out right (e.g. ``Σ float32_bytes /
  Σ bytes_on_wire`` is twice the exchange's own ratio for ``k = 2``; the
  per-step ``compression_ratio`` of a non-exchange step is meaningless).
* The accumulator is kept in float32 whatever the gradients' dtype; the
  exchanged mean is cast back to the gradients' dtype.

References:
  Lim, Andersen, Kaminsky. *3LC: Lightweight and Effective Traffic
  Compression for Distributed Machine Learning*. MLSys 2019 (arXiv:1802.07389), §4.2.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Union

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import parallel
from jaxcomp import transforms
from jaxcomp.exchange import plan

# Per-step reference sizes, reported on every step (the rest are zeroed between exchanges).
REFERENCE_METRICS = ("float32_bytes", "compressed_float32_bytes")

# jaxcomp.compress's own arguments, which every registered transform accepts: the float
# exchange takes them too (they change nothing there), so callers that pass them to any
# compressor (experiments.optimizers.make_tx, through make_optimizer) can build local steps.
FLOAT_EXCHANGE_KWARGS = ("seed", "skip", "min_size", "nonfinite", "bucket_bytes", "within")


class LocalStepsState(NamedTuple):
  """State of :func:`local_steps`."""

  mini_step: jax.Array  # int32 in [0, k): steps since the last exchange, identical on every worker
  local: core.WorkerLocal  # residual: the float32 sum of this worker's gradients since the last exchange
  exchange: Any  # the exchange transform's state
  inner: Any  # the wrapped optimizer's state


def _is_local(x: Any) -> bool:
  return isinstance(x, core.WorkerLocal)


def _wire_counts(state: Any, fn) -> Any:
  """``state`` with ``fn`` applied to every wire counter (all but the reference sizes)."""

  def fix(x):
    if not _is_local(x):
      return x
    return x._replace(metrics={k: (v if k in REFERENCE_METRICS else fn(v)) for k, v in x.metrics.items()})

  return jax.tree.map(fix, state, is_leaf=_is_local)


def silence_wire(state: Any) -> Any:
  """``state`` with every wire counter of every compression transform set to 0.

  A wire counter is static in an exchange's own state (a payload's size) but
  0 on the steps without an exchange, so both branches of the ``lax.cond``
  carry it in its traced form (:meth:`jaxcomp.count.Count.traced`).
  """
  return _wire_counts(state, lambda c: c.zeros_like())


def traced_wire(state: Any) -> Any:
  """``state`` with every wire counter in its traced form (same values)."""
  return _wire_counts(state, lambda c: c.traced())


def on_step(pred: Any, step, operands: tuple[Any, Any, Any]) -> tuple[Any, ...]:
  """``step(*operands)`` where ``pred`` holds (always if ``None``), else the operands as they are.

  ``operands`` are ``(carried, exchange state, carried)``; ``step`` returns
  ``(updates, *operands)``. Where ``pred`` fails the updates are zeros of
  ``step``'s types and the exchange state's wire counters are 0
  (:func:`silence_wire`). ``pred`` is replicated (a function of replicated
  counters), so the collectives run only where it holds, on every worker alike
  (:func:`jaxcomp.parallel.replicated_cond`).
  """
  if pred is None:
    return step(*operands)
  update_types = jax.eval_shape(step, *operands)[0]

  def wait(first, ex_state, last):
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), update_types)
    return zeros, first, silence_wire(ex_state), last

  return parallel.replicated_cond(pred, step, wait, *operands)


def on_last_step(k: int, mini_step: jax.Array, step, operands: tuple[Any, Any, Any]) -> tuple[Any, ...]:
  """``step(*operands)`` on the last of every ``k`` steps (``mini_step == k − 1``): :func:`on_step`."""
  return on_step(None if k == 1 else mini_step == k - 1, step, operands)


def make_exchange(exchange: Union[None, str, optax.GradientTransformation], axis_name: parallel.AxisName,
                  exchange_kwargs: dict[str, Any], owner: str, what: str) -> optax.GradientTransformationExtraArgs:
  """The exchange of a wrapper (``owner``, which exchanges ``what``): see :func:`local_steps`' ``exchange``."""
  if isinstance(exchange, str) and exchange in plan.EXCHANGES:
    raise ValueError(
        f"{owner}'s `exchange` says what exchanges {what} (a compressor's name or a "
        f"transform), not how a compressor's payloads travel; for the {exchange!r} exchange of a "
        f"compressor pass its transform, e.g. exchange=jaxcomp.terngrad(axis_name=..., exchange={exchange!r}).")
  if exchange is None:
    unexpected = sorted(set(exchange_kwargs) - set(FLOAT_EXCHANGE_KWARGS))
    if unexpected:
      raise TypeError(f"Unexpected arguments {unexpected} for the float exchange; name a compressor with `exchange=`.")
    ex = transforms.compress(None, axis_name=axis_name, **exchange_kwargs)
  elif isinstance(exchange, str):
    from jaxcomp.compressors import get_transform  # the registry imports this module

    ex = get_transform(exchange, axis_name=axis_name, **exchange_kwargs)
  else:
    if exchange_kwargs:
      raise TypeError("Keyword arguments go with a compressor's name, not with a transform.")
    ex = exchange
  return optax.with_extra_args_support(ex)


@hyperparams.factory(k="the local steps per exchange, which the step's control flow is built from")
def local_steps(
    optimizer: optax.GradientTransformation,
    k: int = 2,
    *,
    axis_name: parallel.AxisName = None,
    exchange: Union[None, str, optax.GradientTransformation] = None,
    **exchange_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """Wraps ``optimizer`` so that workers exchange and step every ``k`` steps.

  Example::

    tx = jaxcomp.local_steps(optax.sgd(0.1, momentum=0.9), k=2, axis_name="workers")
    # or, from a config:
    tx = jaxcomp.make_optimizer("local_steps", optax.sgd(0.1), k=2, axis_name="workers")
    # with a compressed exchange of the accumulated mean:
    tx = jaxcomp.local_steps(optax.sgd(0.1), k=2, axis_name="workers", exchange="topk", fraction=0.05)

  Args:
    optimizer: the optax optimizer applied to the exchanged mean.
    k: local steps per exchange (3LC: 2). ``k = 1`` is an ordinary chain of
      the exchange and ``optimizer``.
    axis_name: the named worker axis (see :func:`jaxcomp.compress`).
    exchange: how the accumulated mean is exchanged: ``None`` (default) a float
      ``pmean`` (``jaxcomp.compress(None)``), a registered compressor's name (built
      with ``axis_name`` and ``**exchange_kwargs``), or an optax transform that
      averages over ``axis_name`` itself.
    **exchange_kwargs: keyword arguments of the named compressor; for the float
      exchange only :func:`jaxcomp.compress`'s ``seed``, ``skip``, ``min_size``
      and ``nonfinite`` (accepted for a uniform interface).

  Returns:
    An ``optax.GradientTransformationExtraArgs``; its updates are zero except
    on every ``k``-th step.
  """
  if isinstance(k, bool) or not isinstance(k, int) or k < 1:
    raise ValueError(f"k must be an int >= 1; got {k!r}.")
  ex = make_exchange(exchange, axis_name, exchange_kwargs, "local_steps", "the accumulated mean")
  opt = optax.with_extra_args_support(optimizer)

  def init_fn(params):
    acc = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params)
    return LocalStepsState(
        mini_step=jnp.zeros((), jnp.int32),
        local=core.WorkerLocal(residual=acc, metrics={}),
        exchange=silence_wire(ex.init(params)),
        inner=opt.init(params),
    )

  def update_fn(updates, state, params=None, **extra_args):
    acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), state.local.residual, updates)

    def step(acc, ex_state, opt_state):
      mean = jax.tree.map(lambda a, g: (a / k).astype(g.dtype), acc, updates)
      averaged, ex_state = ex.update(mean, ex_state, params, **extra_args)
      new_updates, opt_state = opt.update(averaged, opt_state, params, **extra_args)
      return new_updates, jax.tree.map(jnp.zeros_like, acc), traced_wire(ex_state), opt_state

    new_updates, acc, ex_state, opt_state = on_last_step(k, state.mini_step, step,
                                                         (acc, state.exchange, state.inner))
    new_state = LocalStepsState(
        mini_step=(state.mini_step + 1) % k,
        local=state.local._replace(residual=acc),  # keeps LaidOut
        exchange=ex_state,
        inner=opt_state,
    )
    return new_updates, new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
