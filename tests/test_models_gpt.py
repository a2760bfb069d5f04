"""The GPT-style language model: parameter counts (GPT-2 small's 124M, abstractly), causality,
tied embeddings, names, dtypes, and a few steps of learning."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxcomp import models
from jaxcomp.models import get_model, is_last_layer, param_count
from jaxcomp.models.gpt import gpt_param_count

pytestmark = pytest.mark.accelerator

TINY = dict(context=16, width=32, depth=2, heads=4)


def _abstract_params(model, t):
  tokens = jnp.zeros((1, t), jnp.int32)
  return jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens))["params"]


def test_gpt2_small_has_124m_parameters():
  params = _abstract_params(get_model("gpt2_small", 50257), 8)  # eval_shape: no memory
  assert param_count(params) == 124_439_808 == gpt_param_count(50257, 1024, 768, 12)
  assert params["logits"]["embedding"].shape == (50257, 768)  # the only vocabulary-sized table
  assert params["position"].shape == (1024, 768)


@pytest.mark.parametrize("kwargs", [{}, TINY, dict(context=64, width=48, depth=3, heads=6)])
def test_param_count_formula(kwargs):
  model = get_model("gpt", 256, **kwargs)
  assert param_count(_abstract_params(model, 4)) == gpt_param_count(
      256, model.context, model.width, model.depth)
  if not kwargs:
    assert gpt_param_count(256, 256, 256, 4) == 3_290_624


def test_names_and_tied_output():
  model = get_model("gpt", 256, **TINY)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 256)
  params = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)["params"]
  assert sorted(params) == ["block1", "block2", "ln_final", "logits", "position"]
  assert sorted(params["block1"]) == ["attn", "ln1", "ln2", "mlp"]
  paths = [p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  assert [models.path_names(p) for p in paths if is_last_layer(p)] == [("logits", "embedding")]
  assert not any(models.is_batch_norm(p) for p in paths)
  # The logits are the final hidden state times the embedding table: no separate output layer.
  logits, inter = jax.jit(lambda v, t: model.apply(v, t, capture_intermediates=True))({"params": params}, tokens)
  h = inter["intermediates"]["ln_final"]["__call__"][0]
  np.testing.assert_allclose(logits, h @ params["logits"]["embedding"].T, rtol=1e-5, atol=1e-5)
  assert logits.shape == (2, 16, 256) and logits.dtype == jnp.float32


def test_causal_and_shorter_sequences():
  model = get_model("gpt", 256, **TINY)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 256)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)
  apply = jax.jit(model.apply)
  full = apply(variables, tokens)
  changed = apply(variables, tokens.at[:, 10].set((tokens[:, 10] + 1) % 256))
  np.testing.assert_array_equal(full[:, :10], changed[:, :10])  # the past never sees the future
  assert not np.allclose(full[:, 10:], changed[:, 10:])
  np.testing.assert_allclose(apply(variables, tokens[:, :7]), full[:, :7], rtol=1e-5, atol=1e-5)


def test_bad_input_and_sizes():
  model = get_model("gpt", 256, **TINY)
  with pytest.raises(ValueError, match="integer tokens"):
    model.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)))
  with pytest.raises(ValueError, match="longer than context"):
    model.init(jax.random.PRNGKey(0), jnp.zeros((1, 17), jnp.int32))
  with pytest.raises(ValueError, match="divide"):
    get_model("gpt", 256, width=30, heads=4)
  with pytest.raises(ValueError, match="gpt2_small has width=768"):
    get_model("gpt2_small", 50257, width=64)


def test_bfloat16_compute_and_dropout():
  model = get_model("gpt", 256, dtype=jnp.bfloat16, dropout_rate=0.1, **TINY)
  tokens = jnp.zeros((2, 16), jnp.int32)
  variables = jax.jit(model.init)(jax.random.PRNGKey(0), tokens)
  assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(variables))
  assert jax.eval_shape(model.apply, variables, tokens).dtype == jnp.float32
  train = jax.jit(lambda v, t, k: model.apply(v, t, train=True, rngs={"dropout": k}))
  a, b = train(variables, tokens, jax.random.PRNGKey(1)), train(variables, tokens, jax.random.PRNGKey(2))
  assert a.dtype == jnp.float32 and not np.allclose(a, b)


def test_learns_a_repeating_sequence():
  """A few AdamW steps on a periodic byte string drive the loss far below log(256)."""
  model = get_model("gpt", 256, **TINY)
  text = np.frombuffer(b"the cat sat on the mat. " * 4, np.uint8).astype(np.int32)
  x, y = jnp.asarray(text[None, :16]), jnp.asarray(text[None, 1:17])
  params = jax.jit(model.init)(jax.random.PRNGKey(0), x)["params"]
  tx = optax.adamw(1e-2)
  opt = tx.init(params)

  @jax.jit
  def step(params, opt):
    loss, g = jax.value_and_grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(
        model.apply({"params": p}, x), y).mean())(params)
    u, opt = tx.update(g, opt, params)
    return optax.apply_updates(params, u), opt, loss

  losses = [float(step(params, opt)[2])]
  for _ in range(30):
    params, opt, loss = step(params, opt)
    losses.append(float(loss))
  assert losses[0] > 5.0 and losses[-1] < 1.0, losses[::10]
