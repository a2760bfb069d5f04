"""Model-sharded parameters: each device compresses only its own shard of every tensor.

On a ``(data × model)`` mesh whose parameters are sharded over ``model`` (for
example Flax kernels annotated with ``nn.with_partitioning``), the gradient
exchange runs over ``data`` while each tensor lives in pieces on the
``model`` devices. :func:`per_shard` wraps a chain (or one transform) so that
its update runs under a ``jax.shard_map`` over the model axes: inside it every
device holds its own shard of every gradient, and the wrapped transform
encodes, exchanges over ``data`` and decodes that shard alone. A device's
bytes on the wire are then the payload of its shard, never of the whole
tensor, and the compiler has no reshape or ``top_k`` of a sharded dimension to
place, so the same code runs on meshes of ``AxisType.Auto`` and
``AxisType.Explicit`` axes.

What becomes per shard. Every statistic a compressor takes over "a tensor"
is taken over the device's shard of it (tested against each shard compressed
alone in ``tests/test_sharded.py``):

==================  ==========================================================
compressor          per shard
==================  ==========================================================
terngrad            the scale ``s_t = max|g|`` (Wen et al., NeurIPS 2017,
                    Eq. 2) and the clipping bound ``c·σ`` (§3.3)
qsgd                nothing new: its norms are per bucket of the flattened
                    shard (Alistarh et al., NeurIPS 2017, §4), so buckets
                    follow the shard's own order
threelc             ``M = max|x|`` (Lim et al., MLSys 2019, §3.1), the zero-run
                    stream
int8                the scale ``max|x|/127``
stochastic_ternary  the scale ``max|g|``
signsgd             nothing (signs, and the vote, are elementwise)
signum              nothing (the momentum and the vote are elementwise)
ef_signsgd          the scale ``‖p‖₁/d`` (Karimireddy et al., ICML 2019,
                    Alg. 1), ``d`` the shard's size
onebit              the means per column of the shard (Seide et al. 2014):
                    a tensor split along its rows has each column's means
                    per shard; ``per="tensor"``: one pair per shard
adaptive            the thresholds per column of the shard (Dryden et al.,
                    MLHPC 2016, §3.3)
threshold           nothing (``τ`` is fixed); its capacity is a fraction of
                    the shard
topk                ``k`` (a fraction of the shard) and the sampled threshold
dgc                 ``k`` and the threshold, and the local clipping norm
                    (Lin et al., ICLR 2018, §3.2): the norm of this device's
                    shards of every tensor, not of the whole model
randomk             ``k`` and the shared indices, drawn for the shard's size
powersgd            the rank-``r`` factors of the shard's matrix (Vogels et
                    al., NeurIPS 2019, Alg. 1): a block's low-rank
                    approximation, and its warm-started ``Q``
natural, half       nothing (elementwise)
none                nothing (a float all-reduce of the shard)
==================  ==========================================================

A tensor not sharded over the model axes (a bias left replicated) is encoded
and sent whole by every model device, as each of them computes it.

The state. The wrapped transform's state is per device: every leaf gains a
leading axis over the model axes (size: the number of model devices), split
over them, as worker-local leaves gain a leading worker axis
(:func:`jaxcomp.parallel.replicate_workers`). :func:`jaxcomp.metrics` then
gives the mean over the model devices of their per-device counters. Every
shard starts from the same seed, so shard ``k`` draws its random numbers
(TernGrad's rounding) from the stream shard 0 uses for its own elements: each
element stays unbiased, and the draws of different shards are not
independent.

The layout is read once, by ``init``, from the parameters' ``NamedSharding``
(place them on the mesh first, with ``jax.device_put`` or a jitted ``init``
with ``out_shardings``) and kept, static, in the state: ``update`` uses it
under Auto axes too, where traced values carry no sharding.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Union

import jax
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxcomp import core

AxisNames = Union[str, tuple[str, ...]]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PerShardState:
  """The state of :func:`per_shard`.

  Attributes:
    inner: the wrapped transform's state, every leaf with a leading axis
      over the model axes (one entry per model device).
    specs: static: per gradient leaf (flattened order), its ``PartitionSpec``
      over the model axes.
    mesh: static: the mesh the parameters were laid out on.
    axes: static: the model axes.
  """

  inner: Any
  specs: tuple = dataclasses.field(metadata=dict(static=True))
  mesh: Any = dataclasses.field(metadata=dict(static=True))
  axes: tuple = dataclasses.field(metadata=dict(static=True))


def _names(axes: AxisNames) -> tuple[str, ...]:
  names = (axes,) if isinstance(axes, str) else tuple(axes)
  if not names or not all(isinstance(a, str) for a in names):
    raise TypeError(f"axes must be a mesh axis name or a tuple of them; got {axes!r}.")
  return names


def spec_axes(spec: Any) -> set[str]:
  """The mesh axes a ``PartitionSpec`` splits over (an entry is ``None``, a name or a tuple of names)."""
  return {a for e in (spec or ()) if e is not None for a in ((e,) if isinstance(e, str) else e)}


def model_spec(spec: P, axes: tuple[str, ...], path: str) -> P:
  """``spec`` as the model axes see it; raises if it shards over any other axis."""
  others = sorted(spec_axes(spec) - set(axes))
  if others:
    raise ValueError(
        f"params{path} is sharded over {others}, which are not the model axes {list(axes)}: a "
        "parameter split over the worker axis (fully sharded data parallelism) is not supported; "
        "shard parameters over the model axes only.")
  return spec


def read_layout(params: Any, axes: tuple[str, ...]) -> tuple[tuple[P, ...], Any]:
  """Per leaf of ``params``, its ``PartitionSpec``; and the mesh they share.

  Raises a ValueError naming the first leaf that is not a ``jax.Array`` laid
  out with a ``NamedSharding`` on a mesh that has the model ``axes``.
  """
  specs, mesh = [], None
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    where = jax.tree_util.keystr(path)
    sharding = getattr(leaf, "sharding", None)
    if not isinstance(sharding, NamedSharding):
      raise ValueError(
          f"params{where} has no NamedSharding ({type(sharding).__name__ if sharding else type(leaf).__name__}): "
          "per_shard reads each parameter's layout over the model axes from its sharding. Place the "
          "parameters on the mesh first: jax.device_put(params, shardings), e.g. with "
          "shardings = nn.get_sharding(nn.get_partition_spec(variables), mesh).")
    missing = sorted(set(axes) - set(sharding.mesh.axis_names))
    if missing:
      raise ValueError(f"params{where} is on a mesh with axes {sharding.mesh.axis_names}, without {missing}.")
    if mesh is not None and sharding.mesh != mesh:
      raise ValueError(f"params{where} is on another mesh than the parameters before it.")
    mesh = sharding.mesh
    specs.append(model_spec(sharding.spec, axes, where))
  return tuple(specs), mesh


def per_shard(inner: optax.GradientTransformation, axes: AxisNames = "model") -> optax.GradientTransformationExtraArgs:
  """Runs ``inner`` on each device's shard of the model-sharded gradients.

  Example (a ``(data × model)`` mesh, parameters sharded over ``model``)::

    tx = jaxcomp.per_shard(optax.chain(jaxcomp.terngrad(axis_name="data"), optax.sgd(0.1)), "model")
    opt_state = tx.init(params)            # params placed on the mesh (NamedSharding)
    # inside jax.shard_map(..., axis_names={"data"}): the gradients are this worker's
    updates, opt_state = tx.update(grads, opt_state, params)

  See the module docstring for what becomes per shard.

  Args:
    inner: the transform (a compressor, or a chain with one) whose update runs
      per shard; its exchange axis (``axis_name``) is the data axis, which
      must not be among ``axes``.
    axes: the mesh axes the parameters are sharded over (a name or a tuple).

  Returns:
    An ``optax.GradientTransformationExtraArgs`` whose state is a
    :class:`PerShardState`.
  """
  names = _names(axes)
  inner = optax.with_extra_args_support(inner)

  def init_fn(params):
    specs, mesh = read_layout(params, names)
    treedef = jax.tree.structure(params)
    param_specs = treedef.unflatten(specs)

    def local_init(p):
      return jax.tree.map(lambda a: a[None], inner.init(p))

    # Over every mesh axis: the worker axis is then manual in here, so the inner init can trace its
    # update over it (jaxcomp.compress does, for its static counts); every worker makes the same state.
    state = jax.jit(jax.shard_map(local_init, mesh=mesh, in_specs=(param_specs,), out_specs=P(names),
                                  check_vma=False))(params)
    return PerShardState(inner=state, specs=specs, mesh=mesh, axes=names)

  def update_fn(updates, state, params=None, **extra_args):
    if not core.is_traced((updates, state, params, extra_args)):
      # Called eagerly: one compiled program, not the nested shard_map's operations one by one.
      return compiled_update(updates, state, params, **extra_args)
    return update(updates, state, params, **extra_args)

  def update(updates, state, params=None, **extra_args):
    treedef = jax.tree.structure(updates)
    if treedef.num_leaves != len(state.specs):
      raise ValueError(f"the gradients have {treedef.num_leaves} leaves; the state was made for "
                       f"{len(state.specs)} (initialize it with the parameters these gradients are of).")
    specs = treedef.unflatten(state.specs)
    context = jax.sharding.get_abstract_mesh()
    mesh = context if not context.empty else state.mesh

    def local_update(u, s, p):
      u, s = inner.update(u, jax.tree.map(lambda a: a[0], s), p, **extra_args)
      return u, jax.tree.map(lambda a: a[None], s)

    # Unchecked (check_vma=False): a tensor replicated over the model axes comes out the same on
    # every model device (the same inputs, state and keys), but typed as varying with the state.
    new_updates, new_inner = jax.shard_map(
        local_update, mesh=mesh, in_specs=(specs, P(names), None if params is None else specs),
        out_specs=(specs, P(names)), axis_names=set(names), check_vma=False)(updates, state.inner, params)
    # Pinned to the layout the state came in with (jaxcomp.parallel.worker_shardings): left to the
    # compiler, a leaf could come back in another spelling of it and a jitted step compile again.
    # (Explicit axes carry the layout in the types already.)
    if set(names) <= set(mesh.auto_axes):
      layout = P(names) if not context.empty else NamedSharding(mesh, P(names))  # outside any mesh context
      new_inner = jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, layout), new_inner)
    return new_updates, dataclasses.replace(state, inner=new_inner)

  compiled_update = jax.jit(update)
  return optax.GradientTransformationExtraArgs(init_fn, update_fn)
