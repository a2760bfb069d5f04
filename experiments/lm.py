"""The language-model task: byte windows of a text corpus, next-byte loss, bits per byte.

A config whose ``dataset`` is text (``jaxcomp.data.DATASETS[name].modality == "text"``, e.g.
``gcide``) trains a language model (``jaxcomp.models.LANGUAGE_MODELS``) on windows of
``config.seq_len + 1`` bytes: the inputs are the first ``seq_len`` bytes, the targets the last
``seq_len``. The training step is :func:`experiments.step.make_train_step` as for images (its
loss is the mean cross-entropy over every predicted byte, its accuracy the fraction of bytes
predicted exactly); this module supplies the pipelines and the evaluation:

* train batches: :class:`jaxcomp.data.TextPipeline`, windows drawn at random per step from the
  train split, reproducible from ``(seed, step)`` (so a resumed run sees the same batches);
* evaluation: ``config.eval_windows`` windows spread evenly over the held-out split (0: all
  non-overlapping windows), reporting the loss in nats per byte, ``bits_per_byte`` (the loss
  divided by ln 2, the figure a compressor of the text would be judged by) and the byte accuracy.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxcomp import data as data_lib
from jaxcomp.data import text as text_lib


def is_text(config: ml_collections.ConfigDict) -> bool:
  """Whether ``config.dataset`` is a text corpus (a language-model run)."""
  return data_lib.get_spec(config.dataset).modality == "text"


def pipeline(config: ml_collections.ConfigDict, split: str, *, start_step: int = 0,
             global_batch_size: int | None = None) -> text_lib.TextPipeline:
  """The train (random windows) or test (fixed windows) pipeline of this process."""
  train = split == "train"
  return text_lib.TextPipeline(
      data_lib.load_text(config.dataset, split), seq_len=config.seq_len,
      global_batch_size=global_batch_size or config.batch_size, train=train, seed=config.seed,
      start_step=start_step, eval_windows=0 if train else config.eval_windows,
      process_index=jax.process_index(), process_count=jax.process_count())


def make_eval_step(model):
  """Returns a jitted ``eval_step(params, tokens, targets, mask)`` of masked sums over bytes."""

  @jax.jit
  def eval_step(params, tokens, targets, mask):
    logits = model.apply({"params": params}, tokens, train=False)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets)
    correct = jnp.argmax(logits, -1) == targets
    m = jnp.broadcast_to(mask[:, None], targets.shape).astype(jnp.float32)
    return {"loss": jnp.sum(loss * m), "correct": jnp.sum(correct * m), "count": jnp.sum(m)}

  return eval_step


def evaluate(eval_step, params, pipeline_: text_lib.TextPipeline) -> dict[str, Any]:
  """Loss (nats per byte), bits per byte and byte accuracy over the evaluation windows.

  Each process evaluates its slice of every batch on one of its devices; the sums are added up
  over processes.
  """
  params = jax.tree.map(lambda a: a.addressable_data(0) if isinstance(a, jax.Array) else a, params)
  totals = np.zeros(3)
  for batch in pipeline_.reset():
    out = jax.device_get(eval_step(params, batch["inputs"], batch["targets"], batch["mask"]))
    totals += [float(out["loss"]), float(out["correct"]), float(out["count"])]
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    totals = np.sum(multihost_utils.process_allgather(totals), axis=0)
  loss, correct, count = totals.tolist()
  n = max(count, 1.0)
  return {"loss": loss / n, "accuracy": correct / n,
          "bits_per_byte": text_lib.bits_per_byte(loss / n), "count": count}


def corpus_label(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """What a report says of the text: the corpus, its size, its licence, the unigram baseline."""
  spec = data_lib.get_spec(config.dataset)
  entropy, held_out = text_lib.UNIGRAM_BITS_PER_BYTE[config.dataset]
  return {"corpus": spec.source, "corpus_license": spec.license,
          "train_bytes": spec.num_train, "test_bytes": spec.num_test,
          "unigram_entropy_bits_per_byte": entropy, "unigram_held_out_bits_per_byte": held_out}
