"""DiLoCo: local inner steps, an exchanged pseudo-gradient, an outer optimizer.

Douillard et al., *DiLoCo: Distributed Low-Communication Training of Language Models*
(arXiv:2311.08105), Alg. 1: every worker ``i`` starts an outer step from the shared parameters
``θ^(t−1)``, runs ``H`` steps of the inner optimizer (AdamW) on its own data without any
communication, giving ``θ_i^(t)``; the workers then average the *outer gradient* (pseudo-gradient)
``Δ_i = θ^(t−1) − θ_i^(t)``, and the outer optimizer (SGD with Nesterov momentum 0.9, lr 0.7 in
the paper, §3) applies the average to ``θ^(t−1)``. Streaming DiLoCo (Douillard et al.,
arXiv:2501.18512) synchronises fragments of the model on a staggered schedule, overlaps their
exchange with the next inner steps and sends them in 4-bit floats (below); here any jaxcomp
compressor can exchange the pseudo-gradients (float32 ``pmean`` by default).

In jaxcomp's layout the parameters ``θ`` passed to the train step are the shared (replicated)
ones; a worker's local parameters are ``θ + offset``, the ``offset`` (``Σ`` of its inner updates
since the last outer step, float32) and the inner optimizer's state being per worker
(:class:`~jaxcomp.core.WorkerLocal`, so :func:`jaxcomp.parallel.worker_axes` lays them over the
workers). **Take the gradient at** :func:`local_params` ``(opt_state, params)``, which is
``params`` on the first inner step of every outer step::

  tx = jaxcomp.diloco(optax.adamw(1e-3, weight_decay=0.1), inner_steps=8, axis_name="workers")

  def worker_step(params, opt_state, batch):
    grads = jax.grad(loss_fn)(jaxcomp.local_params(opt_state, params), batch)
    updates, opt_state = tx.update(grads, opt_state, params)   # zero but on every 8th step
    return optax.apply_updates(params, updates), opt_state

Decisions (tested in ``tests/test_diloco.py``):

* **Updates.** On inner steps ``1 … H−1`` of an outer step the update of the shared parameters
  is zero (they stay ``θ^(t−1)``, as in Alg. 1); on step ``H`` it is the outer optimizer's
  update. The inner optimizer receives the worker's gradient and its local parameters (for
  weight decay); its state persists across outer steps (Alg. 1 keeps it per worker).
* **The pseudo-gradient** ``Δ_i = −offset_i`` is cast to the gradients' dtype and exchanged by
  the exchange transform; with error feedback (e.g. ``exchange="int8"``) the residual is kept on
  the pseudo-gradient, so ``Σ`` over outer steps of the averaged ``Δ`` equals
  ``mean_i (Σ Δ_i − residual_i)``.
* **Bytes**: as :func:`jaxcomp.local_steps`: the exchange's counters on the outer step, 0 on
  the silent inner steps (the reference sizes ``float32_bytes`` stay per step), so sums over
  steps are the real traffic: ``H`` times less than a float all-reduce per step with a float
  exchange.
* **H = 1** with a float exchange and outer SGD at lr 1 applies the mean of the workers' inner
  updates: data-parallel training exactly when the inner optimizer is linear in the gradient
  (SGD), or when the workers' gradients agree; with AdamW and differing gradients the mean of
  normalised updates is not AdamW's update of the mean gradient.
* **Norms** (:func:`jaxcomp.metrics`, :data:`NORMS`): on the outer step, the global L2 norms
  of this worker's pseudo-gradient, of the averaged one, of the outer optimizer's state (its
  momentum) after the step, and of the outer update; 0 on the silent inner steps, as the wire
  counters are.
* The branch is a ``lax.cond`` on the replicated inner-step counter, so the collectives run only
  on outer steps, on every worker alike (``vmap``, ``pmap``, ``shard_map`` and their mixes).

**Streaming DiLoCo** (Douillard et al., arXiv:2501.18512, Alg. 2) is the same transform with
``fragments`` (``F``), ``delay`` (``τ``) and ``mix`` (``α``); ``F = 1, τ = 0`` is DiLoCo, bit for
bit (the state keeps DiLoCo's layout). Decisions (tested in ``tests/test_streaming_diloco.py``,
against a transcription of Alg. 2):

* **Fragments** are tensors, not parts of one (:func:`fragment_of_leaves`): consecutive in the
  tree's leaf order, balanced by size (``"sequential"``), or tensor ``i`` in fragment ``i mod F``
  (``"strided"``, §2.2's strided pattern by tensor); ``"tensors"`` makes one a tensor. Each
  fragment has its own exchange state (its error feedback) and outer optimizer state.
* **The schedule** (§2.2, Alg. 2's offsets ``t_p``): fragment ``p`` sends after inner step
  ``(p + 1)·H // F − 1`` of every window of ``H`` (:func:`send_step`), so the fragments' sends
  are spread evenly and the last is DiLoCo's; fragment ``p``'s first window is its first
  ``(p + 1)·H // F`` steps.
* **The delay** (§2.3): the outer step of a fragment comes ``τ`` inner steps after its send
  (``0 <= τ < H``). Its exchange runs then, on the pseudo-gradient kept since the send (so the
  collective's inputs do not depend on that step's gradients, and its bytes count on that step);
  the outer optimizer applies the average to the shared fragment ``θ_p``, and each worker's
  fragment, which took ``τ`` more inner steps meanwhile, is merged: ``θ_i,p ← α·θ_i,p + (1 − α)·θ_p``
  (Alg. 2's merge; ``α = 0`` takes the outer result, ``α = 1`` keeps the worker's own). Default
  ``α = 0.5`` (§2.3), where both ways of writing the merge agree. With ``τ = 0`` the fragment is
  replaced by the outer result, as in DiLoCo, whatever ``α``.
* **4-bit outer gradients** (§2.4): ``exchange="fp4"`` (:class:`~jaxcomp.FP4`, E3M0); any
  registered compressor works.
* **Bytes and norms**: a step's counters are those of the fragments exchanged on it (0 for the
  others); the norms combine them (``sqrt`` of the sum of squares). So the largest step moves
  about ``1/F`` of the model: Streaming DiLoCo's lower peak bandwidth.

References:
  Douillard, Feng, Rusu, Chhaparia, Donchev, Kuncoro, Ranzato, Szlam, Shen. *DiLoCo:
  Distributed Low-Communication Training of Language Models*. arXiv:2311.08105, Alg. 1, §3.
  Douillard, Donchev, Rush, et al. *Streaming DiLoCo with overlapping communication: Towards a
  Distributed Free Lunch*. arXiv:2501.18512, Alg. 2, §2.2 (fragments), §2.3 (overlap, the merge),
  §2.4 (quantized outer gradients).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import optax

from jaxcomp import core
from jaxcomp import hyperparams
from jaxcomp import parallel
from jaxcomp.compressors import local_steps as local_steps_lib


# The outer step's norms (jaxcomp.metrics; 0 on the silent steps), each a mean over workers.
NORMS = {
    "diloco_pseudo_grad_norm": "‖Δ_i‖ of a worker's pseudo-gradient θ^(t−1) − θ_i^(t)",
    "diloco_outer_grad_norm": "‖mean_i Δ_i‖ of the averaged pseudo-gradient the outer optimizer receives",
    "diloco_outer_state_norm": "‖outer optimizer state‖ after the step (Nesterov SGD: its momentum)",
    "diloco_outer_update_norm": "‖outer update‖ applied to the shared parameters",
}


def _norms(pseudo=None, averaged=None, outer_state=None, outer_updates=None) -> dict[str, jax.Array]:
  """:data:`NORMS` of an outer step; zeros (a silent step, or the initial state) without arguments."""
  trees = (pseudo, averaged, outer_state, outer_updates)
  if pseudo is None:
    return {k: jnp.zeros((), jnp.float32) for k in NORMS}
  floats = lambda t: [x for x in jax.tree.leaves(t) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
  return {k: optax.tree.norm(floats(t)).astype(jnp.float32) for k, t in zip(NORMS, trees)}


class Pending(NamedTuple):
  """Streaming DiLoCo's pseudo-gradients between their send and their outer step (``delay >= 1``)."""

  sent: jax.Array  # bool[F]: fragment p has sent: its outer steps are due from then on (the same on every worker)
  sent_offset: core.WorkerLocal  # residual: this worker's offsets at its fragments' sends, −Δ_i (float32)


class DiLoCoState(NamedTuple):
  """State of :func:`diloco`."""

  inner_step: jax.Array  # int32 in [0, H): inner steps since the last outer step, the same on every worker
  offset: core.WorkerLocal  # residual: this worker's local parameters minus the shared ones (float32)
  inner: core.WorkerLocal  # residual: this worker's inner optimizer state
  exchange: Any  # the pseudo-gradient exchange's state; with F > 1 fragments a tuple, one a fragment
  outer: Any  # the outer optimizer's state (shared); with F > 1 fragments a tuple, one a fragment
  pending: Optional[Pending] = None  # delay >= 1: the pseudo-gradients sent and not yet applied


def _is_state(x: Any) -> bool:
  return isinstance(x, DiLoCoState)


def local_params(opt_state: Any, params: Any) -> Any:
  """This worker's local parameters under DiLoCo (``params + offset``), else ``params`` itself.

  Call it inside the per-worker step, on this worker's ``opt_state``: take the gradient there.
  """
  states = [s for s in jax.tree.leaves(opt_state, is_leaf=_is_state) if _is_state(s)]
  if not states:
    return params
  if len(states) > 1:
    raise ValueError(f"opt_state holds {len(states)} DiLoCo states; a chain may hold one.")
  return jax.tree.map(lambda p, o: (p + o).astype(p.dtype), params, states[0].offset.residual)


def fragment_of_leaves(sizes: list[int], count: int, pattern: str = "sequential") -> list[int]:
  """Each leaf's fragment (leaves in tree order, ``sizes`` their elements), every fragment non-empty.

  ``"sequential"``: consecutive leaves, cut where a fragment has its share ``total/count`` of the
  elements (or where the leaves left are just enough for the fragments left). ``"strided"``:
  leaf ``i`` in fragment ``i mod count`` (Streaming DiLoCo §2.2's strided pattern, by leaf).
  """
  if not 1 <= count <= len(sizes):
    raise ValueError(f"fragments must be between 1 and the number of tensors ({len(sizes)}); got {count}.")
  if pattern == "strided":
    return [i % count for i in range(len(sizes))]
  if pattern != "sequential":
    raise ValueError(f"fragment_pattern must be 'sequential' or 'strided'; got {pattern!r}.")
  out, p, done, total = [], 0, 0, max(sum(sizes), 1)
  for i, n in enumerate(sizes):
    if out and out[-1] == p and p < count - 1 and (
        done >= (p + 1) * total / count or len(sizes) - i == count - 1 - p):
      p += 1
    out.append(p)
    done += n
  return out


class _Fragments:
  """The fragments of a tree (static): each leaf's fragment, and a fragment as a tree of its leaves."""

  def __init__(self, tree: Any, count: Union[int, str], pattern: str):
    leaves, self.treedef = jax.tree.flatten(tree)
    count = len(leaves) if count == "tensors" else count
    self.of = fragment_of_leaves([core.size_of(jnp.shape(x)) for x in leaves], count, pattern)
    self.count = count

  def part(self, tree: Any, p: int) -> Any:
    """``tree`` with only fragment ``p``'s leaves (the others ``None``): the whole tree for one fragment."""
    leaves = self.treedef.flatten_up_to(tree)
    return self.treedef.unflatten([x if f == p else None for x, f in zip(leaves, self.of)])

  def put(self, tree: Any, part: Any, p: int) -> Any:
    """``tree`` with fragment ``p``'s leaves taken from ``part`` (:meth:`part`'s layout)."""
    new = iter(jax.tree.leaves(part))
    return self.treedef.unflatten([next(new) if f == p else x
                                   for x, f in zip(self.treedef.flatten_up_to(tree), self.of)])


def send_step(p: int, fragments: int, h: int) -> int:
  """The inner step (in ``[0, H)``) after which fragment ``p`` sends: ``(p + 1)·H // F − 1``.

  One fragment sends after the ``H``-th inner step (DiLoCo); ``F`` fragments are staggered evenly
  over the ``H`` steps (Streaming DiLoCo §2.2, Alg. 2's offsets ``t_p``), the last at ``H − 1``.
  """
  return (p + 1) * h // fragments - 1


def _stored(states: list[Any]) -> Any:
  """Per-fragment states as :class:`DiLoCoState` holds them: one fragment's as it is (DiLoCo's layout)."""
  return states[0] if len(states) == 1 else tuple(states)


def _fragment(stored: Any, p: int, count: int) -> Any:
  """Fragment ``p``'s state (of ``count``) out of :func:`_stored`'s layout."""
  return stored[p] if count > 1 else stored


def _combined_norms(norms: list[dict[str, jax.Array]]) -> dict[str, jax.Array]:
  """:data:`NORMS` over the fragments: ``sqrt(Σ_p n_p²)`` (fragments silent this step give 0)."""
  if len(norms) == 1:
    return norms[0]
  return {k: jnp.sqrt(sum(jnp.square(n[k]) for n in norms)) for k in NORMS}


@hyperparams.factory(inner_steps="the inner steps per outer step, which the step's control flow is built from",
                     fragments="the fragments, which the step's control flow is built from",
                     delay="the inner steps between a fragment's send and its outer step")
def diloco(
    inner: optax.GradientTransformation,
    inner_steps: int = 500,
    *,
    outer: Optional[optax.GradientTransformation] = None,
    outer_learning_rate: float = 0.7,
    outer_momentum: float = 0.9,
    fragments: Union[int, str] = 1,
    fragment_pattern: str = "sequential",
    delay: int = 0,
    mix: float = 0.5,
    axis_name: parallel.AxisName = None,
    exchange: Union[None, str, optax.GradientTransformation] = None,
    **exchange_kwargs: Any,
) -> optax.GradientTransformationExtraArgs:
  """DiLoCo (arXiv:2311.08105, Alg. 1) around the inner optimizer ``inner``; Streaming DiLoCo with fragments.

  Example::

    tx = jaxcomp.diloco(optax.adamw(4e-4, weight_decay=0.1), inner_steps=500, axis_name="workers")
    # 8-bit pseudo-gradients with error feedback:
    tx = jaxcomp.diloco(optax.adamw(4e-4), 100, axis_name="workers", exchange="int8")
    # Streaming DiLoCo: 4 fragments, each applied 1 step after it was sent, 4-bit outer gradients:
    tx = jaxcomp.diloco(optax.adamw(4e-4), 100, fragments=4, delay=1, axis_name="workers", exchange="fp4")
    # from a config:
    tx = jaxcomp.make_optimizer("diloco", optax.adamw(4e-4), inner_steps=100, axis_name="workers")

  Args:
    inner: the inner optimizer (the paper: AdamW), run by every worker on its own gradients.
    inner_steps: ``H``, inner steps per outer step (the paper: 500). ``H = 1`` exchanges every step.
    outer: the outer optimizer; default SGD with Nesterov momentum (§3: lr 0.7, momentum 0.9).
    outer_learning_rate: the default outer optimizer's learning rate.
    outer_momentum: the default outer optimizer's Nesterov momentum (0: plain SGD).
    fragments: ``F``, the fragments the parameters are split into (``1``: DiLoCo), or
      ``"tensors"`` for one a tensor; at most ``H`` and the number of tensors.
    fragment_pattern: ``"sequential"`` (consecutive tensors in tree order, balanced by size) or
      ``"strided"`` (tensor ``i`` in fragment ``i mod F``); see :func:`fragment_of_leaves`.
    delay: ``τ``, inner steps between a fragment's send and its outer step, in ``[0, H)``
      (``0``: applied at once, DiLoCo).
    mix: ``α``, with ``τ >= 1`` the weight of a worker's own parameters when its fragment is merged
      with the outer step's result, in ``[0, 1]`` (Streaming DiLoCo §2.3: 0.5).
    axis_name: the named worker axis (see :func:`jaxcomp.compress`).
    exchange: how the pseudo-gradients are averaged: ``None`` (default) a float ``pmean``, a
      registered compressor's name (built with ``axis_name`` and ``**exchange_kwargs``), or an
      optax transform that averages over ``axis_name`` itself.
    **exchange_kwargs: keyword arguments of the named compressor; for the float exchange only
      :func:`jaxcomp.compress`'s ``seed``, ``skip``, ``min_size``, ``nonfinite``, ``bucket_bytes``,
      ``within``.

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose updates of the shared parameters are zero
    except on the outer steps of a fragment, and there only on that fragment's tensors. Take
    gradients at :func:`local_params`.
  """
  if isinstance(inner_steps, bool) or not isinstance(inner_steps, int) or inner_steps < 1:
    raise ValueError(f"inner_steps must be an int >= 1; got {inner_steps!r}.")
  _check_streaming(inner_steps, fragments, delay, mix)
  outer = _outer_optimizer(outer, outer_learning_rate, outer_momentum)
  ex = local_steps_lib.make_exchange(exchange, axis_name, exchange_kwargs, "diloco", "the pseudo-gradients")
  inner = optax.with_extra_args_support(inner)
  h = inner_steps

  def init_fn(params):
    frags = _Fragments(params, fragments, fragment_pattern)
    if frags.count > h:
      raise ValueError(f"{frags.count} fragments need inner_steps >= {frags.count}: a fragment sends at a step "
                       "of its own.")
    zeros = jax.tree.map(lambda p: jnp.zeros(jnp.shape(p), jnp.float32), params)
    parts = [frags.part(params, p) for p in range(frags.count)]
    return DiLoCoState(
        inner_step=jnp.zeros((), jnp.int32),
        offset=core.WorkerLocal(residual=zeros, metrics=_norms()),
        inner=core.WorkerLocal(residual=inner.init(params), metrics={}),
        exchange=_stored([local_steps_lib.silence_wire(ex.init(part)) for part in parts]),
        outer=_stored([outer.init(part) for part in parts]),
        pending=None if delay == 0 else Pending(sent=jnp.zeros((frags.count,), bool),
                                                sent_offset=core.WorkerLocal(residual=zeros, metrics={})),
    )

  def update_fn(updates, state, params=None, **extra_args):
    local = None if params is None else local_params(state, params)
    inner_updates, inner_state = inner.update(updates, state.inner.residual, local, **extra_args)
    offset = jax.tree.map(lambda o, u: o + u.astype(jnp.float32), state.offset.residual, inner_updates)
    frags = _Fragments(updates, fragments, fragment_pattern)
    sync = _Sync(frags, ex, outer, h, updates, params, extra_args)
    if delay == 0:
      new_updates, norms, offset, ex_states, outer_states = sync.at_once(state, offset)
      pending = None
    else:
      new_updates, norms, offset, ex_states, outer_states, pending = sync.delayed(state, offset, delay, mix)
    new_state = DiLoCoState(
        inner_step=(state.inner_step + 1) % h,
        offset=state.offset._replace(residual=offset, metrics=norms),  # keeps LaidOut
        inner=state.inner._replace(residual=inner_state),
        exchange=_stored(ex_states),
        outer=_stored(outer_states),
        pending=pending,
    )
    return new_updates, new_state

  return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def _outer_optimizer(outer: Optional[optax.GradientTransformation], learning_rate: float,
                     momentum: float) -> optax.GradientTransformationExtraArgs:
  """``outer``, or the default: SGD with Nesterov momentum (DiLoCo §3)."""
  if outer is None:
    if hyperparams.is_traced(momentum):  # injected: Nesterov's trace is kept even at 0, where it is plain SGD
      outer = optax.sgd(learning_rate, momentum=momentum, nesterov=True)
    else:
      outer = optax.sgd(learning_rate, momentum=momentum or None, nesterov=bool(momentum))
  elif not (hyperparams.is_traced(learning_rate) or hyperparams.is_traced(momentum)) and (
      learning_rate != 0.7 or momentum != 0.9):
    raise TypeError("outer_learning_rate and outer_momentum set the default outer optimizer; "
                    "pass them or `outer`, not both.")
  return optax.with_extra_args_support(outer)


def _check_streaming(h: int, fragments: Union[int, str], delay: int, mix: float) -> None:
  if fragments != "tensors" and (isinstance(fragments, bool) or not isinstance(fragments, int) or not
                                 1 <= fragments <= h):
    raise ValueError(f"fragments must be 'tensors' or an int in [1, inner_steps = {h}]; got {fragments!r}.")
  if isinstance(delay, bool) or not isinstance(delay, int) or not 0 <= delay < h:
    raise ValueError(f"delay must be an int in [0, inner_steps = {h}): a fragment's outer step comes before "
                     f"its next send; got {delay!r}.")
  hyperparams.check_number(mix, "mix", lambda v: 0.0 <= v <= 1.0, "a number in [0, 1]")


class _Sync:
  """One update's outer steps, fragment by fragment (a step of :func:`diloco`'s update)."""

  def __init__(self, frags: _Fragments, ex, outer, h: int, updates: Any, params: Any, extra_args: dict):
    self.frags, self.ex, self.outer, self.h = frags, ex, outer, h
    self.updates, self.params, self.extra_args = updates, params, extra_args

  def _params(self, p: int) -> Any:
    return None if self.params is None else self.frags.part(self.params, p)

  def _pseudo(self, offset_p: Any, p: int) -> Any:
    """``Δ_i = θ^(t−1) − θ_i^(t) = −offset`` in the gradients' dtype."""
    return jax.tree.map(lambda o, g: (-o).astype(g.dtype), offset_p, self.frags.part(self.updates, p))

  def _exchange(self, p: int):
    def run(pseudo, ex_state, nothing):
      averaged, ex_state = self.ex.update(pseudo, ex_state, self._params(p), **self.extra_args)
      return averaged, pseudo, local_steps_lib.traced_wire(ex_state), nothing
    return run

  def _outer(self, p: int, pseudo: Any, averaged: Any, new_offset):
    def run(offset_p, nothing, outer_state):
      upd, outer_state = self.outer.update(averaged, outer_state, self._params(p), **self.extra_args)
      return (upd, _norms(pseudo, averaged, outer_state, upd)), new_offset(offset_p, upd), nothing, outer_state
    return run

  def _collect(self, results: list, offset: Any) -> tuple[Any, dict[str, jax.Array], Any]:
    """The shared parameters' updates (every fragment's, zeros elsewhere), the norms, the offsets."""
    new_updates = jax.tree.map(jnp.zeros_like, self.updates)
    for p, (upd, _, off) in enumerate(results):
      new_updates, offset = self.frags.put(new_updates, upd, p), self.frags.put(offset, off, p)
    return new_updates, _combined_norms([norms for _, norms, _ in results]), offset

  def at_once(self, state: DiLoCoState, offset: Any):
    """``τ = 0``: each fragment's exchange and outer step right after its ``H``-th inner step."""
    results, ex_states, outer_states = [], [], []
    for p in range(self.frags.count):
      pred = None if self.h == 1 else state.inner_step == send_step(p, self.frags.count, self.h)

      def step(offset_p, ex_state, outer_state, p=p):
        pseudo = self._pseudo(offset_p, p)
        averaged, _, ex_state, _ = self._exchange(p)(pseudo, ex_state, ())
        reset = lambda o, u: jax.tree.map(jnp.zeros_like, o)
        out, offset_p, _, outer_state = self._outer(p, pseudo, averaged, reset)(offset_p, (), outer_state)
        return out, offset_p, ex_state, outer_state

      operands = (self.frags.part(offset, p), _fragment(state.exchange, p, self.frags.count),
                  _fragment(state.outer, p, self.frags.count))
      (upd, norms), off, ex_state, outer_state = local_steps_lib.on_step(pred, step, operands)
      results.append((upd, norms, off))
      ex_states.append(ex_state)
      outer_states.append(outer_state)
    return (*self._collect(results, offset), ex_states, outer_states)

  def delayed(self, state: DiLoCoState, offset: Any, delay: int, mix: float):
    """``τ >= 1``: sends after the fragment's inner step, outer step and merge ``τ`` steps later.

    The exchange runs on the outer step, on the pseudo-gradient kept since the send: its inputs do
    not depend on this step's gradients, so a runtime may run the collective beside the step's
    forward and backward passes (XLA:CPU does not: it runs it first, alone; docs/benchmarks.md).
    """
    pending = state.pending.sent_offset.residual
    results, ex_states, outer_states, sent = [], [], [], state.pending.sent
    merge = lambda o, u: jax.tree.map(lambda a, b: mix * (a - b.astype(jnp.float32)), o, u)  # α(offset − u)
    for p in range(self.frags.count):
      s = send_step(p, self.frags.count, self.h)
      due = jnp.logical_and(state.inner_step == (s + delay) % self.h, sent[p])
      pseudo = self._pseudo(self.frags.part(pending, p), p)
      ex_state = _fragment(state.exchange, p, self.frags.count)
      averaged, _, ex_state, _ = local_steps_lib.on_step(due, self._exchange(p), (pseudo, ex_state, ()))
      (upd, norms), off, _, outer_state = local_steps_lib.on_step(
          due, self._outer(p, pseudo, averaged, merge),
          (self.frags.part(offset, p), (), _fragment(state.outer, p, self.frags.count)))
      results.append((upd, norms, off))
      ex_states.append(ex_state)
      outer_states.append(outer_state)
    new_updates, norms, offset = self._collect(results, offset)
    pending, sent = self._send(state, offset, pending, sent)
    return (new_updates, norms, offset, ex_states, outer_states,
            Pending(sent=sent, sent_offset=state.pending.sent_offset._replace(residual=pending)))  # keeps LaidOut

  def _send(self, state: DiLoCoState, offset: Any, pending: Any, sent: jax.Array) -> tuple[Any, jax.Array]:
    """Keeps the offsets (``−Δ_i``) of the fragments whose send step this is, and marks them sent."""
    sends = [state.inner_step == send_step(p, self.frags.count, self.h) for p in range(self.frags.count)]
    flat = self.frags.treedef.flatten_up_to
    kept = [jnp.where(sends[f], o, x) for x, o, f in zip(flat(pending), flat(offset), self.frags.of)]
    return self.frags.treedef.unflatten(kept), jnp.stack(sends) | sent
