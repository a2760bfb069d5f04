"""Per-example preprocessing and the papers' augmentation presets (TensorFlow).

Every random choice uses a stateless op (``tf.image.stateless_random_*``)
with a seed the pipeline derives from ``(seed, position of the example in the
stream)``, so an augmented example is a pure function of the run's seed and
its position: the basis of bit-exact resumption (see
:mod:`jaxcomp.data.pipeline`).

Presets (``augment=``), train / eval:

``None``
  Pixels scaled to [0, 1] by ``1/255`` (Caffe's LeNet uses ``1/256``; the
  0.4% difference in scale is immaterial and ``1/255`` maps 255 to exactly
  1.0). Used for LeNet/MNIST (TernGrad §4.1: "LeNet is trained without data
  augmentation") and the MLP of Dryden et al. Same at train and eval.
``"cifarnet"``
  TernGrad §4.1 / the TensorFlow CIFAR-10 tutorial (``cifar10_input.py``):
  random 24x24 crop, random horizontal flip, random brightness
  (``max_delta=63/255``), random contrast (factor in [0.2, 1.8]), then
  per-image standardization. The tutorial works on [0, 255] floats with
  ``max_delta=63``; on [0, 1] floats with ``63/255`` the result after
  standardization is the same. Eval: central 24x24 crop + standardization.
``"cifar_resnet"``
  He et al. (2016) §4.2, used by 3LC §4.3 and QSGD for ResNet-110: pad 4
  zero pixels on each side (in uint8 pixel space, i.e. black), random crop
  back to the original size, random horizontal flip, then per-channel
  normalisation ``(x/255 - mean) / std`` with the train split's statistics
  from the registry (He et al. subtract the per-pixel mean; per-channel
  mean/std is the common modern equivalent). Eval: normalisation only.
``"imagenet"``
  Inception-style random-resized crop (Szegedy et al., 2015): a crop covering
  8%-100% of the image area with aspect ratio in [3/4, 4/3] (10 attempts,
  else the whole image), resized to ``image_size`` (default 224) bilinearly,
  random flip, ImageNet mean/std normalisation. JPEG input is decoded only
  inside the crop window (``tf.image.decode_and_crop_jpeg``).
``"imagenet_simple"``
  The Caffe/AlexNet recipe that TernGrad's AlexNet runs follow: resize the
  shorter side to ``256/224 * image_size`` (256), random ``image_size`` crop,
  random flip, normalisation.

Eval for both ImageNet presets: shorter side resized to 256 (scaled with
``image_size``), central ``image_size`` crop, normalisation.

Grayscale 28x28 sets for CIFAR-style models: ``image_size`` (for the non-
ImageNet presets) is the size images are brought to *before* augmentation,
by centred zero padding (or centred cropping when smaller): 28 -> 32 pads 2
black pixels on each side, which keeps every pixel and its scale, like the
32x32 input of the original LeNet-5. ``channels=3`` repeats the grey channel
(and its mean/std). So Fashion-MNIST with ``augment="cifar_resnet",
image_size=32, channels=3`` gives a CIFAR ResNet [B, 32, 32, 3] inputs.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

AUGMENTATIONS = (None, "cifarnet", "cifar_resnet", "imagenet", "imagenet_simple")
IMAGENET_PRESETS = ("imagenet", "imagenet_simple")

CIFARNET_CROP = 24
CIFARNET_MAX_BRIGHTNESS_DELTA = 63.0 / 255.0
CIFARNET_CONTRAST_RANGE = (0.2, 1.8)
CIFAR_RESNET_PAD = 4
IMAGENET_DEFAULT_SIZE = 224
IMAGENET_RESIZE_RATIO = 256.0 / 224.0
INCEPTION_AREA_RANGE = (0.08, 1.0)
INCEPTION_ASPECT_RANGE = (3.0 / 4.0, 4.0 / 3.0)
INCEPTION_MAX_ATTEMPTS = 10


@dataclasses.dataclass(frozen=True)
class PreprocessConfig:
  """A resolved preprocessing recipe (see :func:`resolve`).

  Attributes:
    augment: the preset name (or None).
    in_channels: channels of the stored images.
    channels: channels of the output (1 -> 3 repeats the grey channel).
    source_size: ``(H, W)`` stored images are padded/cropped to before
      augmentation, or None to keep them (always None for ImageNet presets).
    output_shape: ``(H, W, C)`` of every output image.
    mean: per-output-channel mean on the [0, 1] scale.
    std: per-output-channel standard deviation on the [0, 1] scale.
    jpeg: stored images are JPEG bytes (enables ``decode_and_crop_jpeg``).
  """

  augment: str | None
  in_channels: int
  channels: int
  source_size: tuple[int, int] | None
  output_shape: tuple[int, int, int]
  mean: tuple[float, ...]
  std: tuple[float, ...]
  jpeg: bool = False


def resolve(spec, augment: str | None, image_size: int | None = None,
            channels: int | None = None) -> PreprocessConfig:
  """Validates the preprocessing arguments and works out the output shape.

  Args:
    spec: the dataset's :class:`~jaxcomp.data.registry.DatasetSpec`.
    augment: a preset from :data:`AUGMENTATIONS`.
    image_size: for ``None``/``"cifarnet"``/``"cifar_resnet"``: the size the
      stored images are zero-padded (or centre-cropped) to before
      augmentation; for the ImageNet presets: the output crop size (224).
    channels: output channels; ``None`` keeps the stored ones, 3 repeats a
      grey channel.

  Returns:
    The resolved :class:`PreprocessConfig`.

  Raises:
    ValueError: unknown preset, impossible size or channel combination.
  """
  if augment not in AUGMENTATIONS:
    raise ValueError(f"unknown augment {augment!r}; choose one of {AUGMENTATIONS}")
  h, w, c = spec.image_shape
  out_c = c if channels is None else channels
  if out_c not in (c, 3) or (out_c != c and c != 1):
    raise ValueError(f"channels={channels} not supported for {spec.name} ({c} channel(s)): "
                     "use None or, for grayscale data, 3")
  if image_size is not None and (not isinstance(image_size, int) or image_size <= 0):
    raise ValueError(f"image_size must be a positive int or None, got {image_size!r}")
  mean = tuple(spec.mean) * (out_c // c)
  std = tuple(spec.std) * (out_c // c)
  jpeg = h is None
  if augment in IMAGENET_PRESETS:
    size = image_size or IMAGENET_DEFAULT_SIZE
    return PreprocessConfig(augment, c, out_c, None, (size, size, out_c), mean, std, jpeg)
  if h is None:
    raise ValueError(f"{spec.name} images vary in size; use augment='imagenet' or "
                     f"'imagenet_simple' (got {augment!r})")
  source = (image_size, image_size) if image_size is not None else (h, w)
  if augment == "cifarnet":
    if min(source) < CIFARNET_CROP:
      raise ValueError(f"'cifarnet' crops {CIFARNET_CROP}x{CIFARNET_CROP} but {spec.name} "
                       f"images are {source[0]}x{source[1]}; pass image_size>={CIFARNET_CROP}")
    out = (CIFARNET_CROP, CIFARNET_CROP, out_c)
  else:
    out = (*source, out_c)
  return PreprocessConfig(augment, c, out_c, source if image_size is not None else None,
                          out, mean, std, jpeg)


def make_preprocess_fn(cfg: PreprocessConfig, train: bool) -> Callable:
  """Returns ``fn(image, seed) -> float32 [H, W, C]`` for one example.

  Args:
    cfg: from :func:`resolve`.
    train: apply the preset's random train-time augmentation; otherwise its
      deterministic eval transform (``seed`` is then ignored).

  ``image`` is a uint8 ``[H, W, C]`` tensor or an encoded (PNG/JPEG) scalar
  string; ``seed`` an int64 ``[2]`` tensor (stateless-op seed).
  """
  from jaxcomp.data import tfds_sources  # pylint: disable=g-import-not-at-top
  tf = tfds_sources.import_tf()

  mean = tf.constant(cfg.mean, tf.float32)
  std = tf.constant(cfg.std, tf.float32)
  out_h, out_w, out_c = cfg.output_shape

  def decode(image):
    if image.dtype == tf.string:
      image = tf.io.decode_image(image, channels=cfg.in_channels, expand_animations=False)
    return image

  def fix_channels(image):
    if cfg.channels != cfg.in_channels:
      image = tf.image.grayscale_to_rgb(image)
    return image

  def source(image):
    image = fix_channels(decode(image))
    if cfg.source_size is not None:
      image = tf.image.resize_with_crop_or_pad(image, *cfg.source_size)
    return image

  def to_unit(image):
    return tf.cast(image, tf.float32) * (1.0 / 255.0)

  def normalize(image01):
    return (image01 - mean) / std

  def resize_shorter(image, target):
    shape = tf.shape(image)
    h, w = tf.cast(shape[0], tf.float32), tf.cast(shape[1], tf.float32)
    scale = tf.cast(target, tf.float32) / tf.minimum(h, w)
    new = tf.cast(tf.round(tf.stack([h * scale, w * scale])), tf.int32)
    new = tf.maximum(new, target)
    return tf.image.resize(image, new, method="bilinear", antialias=True)

  resize_target = int(round(out_h * IMAGENET_RESIZE_RATIO))

  def imagenet_eval(image):
    image = fix_channels(decode(image))
    image = resize_shorter(image, resize_target)
    image = tf.image.resize_with_crop_or_pad(image, out_h, out_w)
    return normalize(image / 255.0)

  def preprocess(image, seed):
    a = cfg.augment
    if a is None:
      return to_unit(source(image))
    if a in IMAGENET_PRESETS and not train:
      return imagenet_eval(image)
    if a == "cifarnet" and not train:
      image = tf.image.resize_with_crop_or_pad(source(image), out_h, out_w)
      return tf.image.per_image_standardization(to_unit(image))
    if a == "cifar_resnet" and not train:
      return normalize(to_unit(source(image)))

    seeds = tf.random.experimental.stateless_split(seed, 4)
    if a == "cifarnet":
      image = source(image)
      image = tf.image.stateless_random_crop(image, [out_h, out_w, out_c], seed=seeds[0])
      image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
      x = to_unit(image)
      x = tf.image.stateless_random_brightness(x, CIFARNET_MAX_BRIGHTNESS_DELTA, seed=seeds[2])
      x = tf.image.stateless_random_contrast(x, *CIFARNET_CONTRAST_RANGE, seed=seeds[3])
      return tf.image.per_image_standardization(x)
    if a == "cifar_resnet":
      image = source(image)
      p = CIFAR_RESNET_PAD
      image = tf.pad(image, [[p, p], [p, p], [0, 0]])
      image = tf.image.stateless_random_crop(image, [out_h, out_w, out_c], seed=seeds[0])
      image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
      return normalize(to_unit(image))
    if a == "imagenet":
      if image.dtype == tf.string and cfg.jpeg:
        shape = tf.image.extract_jpeg_shape(image)
      else:
        image = decode(image)
        shape = tf.shape(image)
      begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
          shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seeds[0],
          min_object_covered=0.1, aspect_ratio_range=INCEPTION_ASPECT_RANGE,
          area_range=INCEPTION_AREA_RANGE, max_attempts=INCEPTION_MAX_ATTEMPTS,
          use_image_if_no_bounding_boxes=True)
      if image.dtype == tf.string:
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(size)
        image = tf.image.decode_and_crop_jpeg(image, tf.stack([y, x, h, w]),
                                              channels=cfg.in_channels)
      else:
        image = tf.slice(image, begin, size)
      image = fix_channels(image)
      image = tf.image.resize(image, [out_h, out_w], method="bilinear")
      image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
      return normalize(image / 255.0)
    # imagenet_simple
    image = resize_shorter(fix_channels(decode(image)), resize_target)
    image = tf.image.stateless_random_crop(image, [out_h, out_w, out_c], seed=seeds[0])
    image = tf.image.stateless_random_flip_left_right(image, seed=seeds[1])
    return normalize(image / 255.0)

  def fn(image, seed):
    out = preprocess(image, seed)
    out = tf.ensure_shape(tf.cast(out, tf.float32), cfg.output_shape)
    return out

  return fn
