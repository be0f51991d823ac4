"""ImageNet preprocessing, fused JPEG decode-and-crop (Ying et al. 2018, §3.2).

Training uses the Inception-style random crop as tensorflow/tpu's
`resnet_preprocessing.py` does: a box with area_range 8%-100% and aspect ratio
3/4-4/3 is sampled from the JPEG header alone (min_object_covered=0.1 of the
whole-image box, as there, makes the smallest area 10%), and
`tf.image.decode_and_crop_jpeg` decodes only that box. Ying et al. report about
25% more input throughput from this fusion: a full decode spends most of its
time on pixels the crop throws away. The full-decode path stays for the
ablation (§4, Figure 5). The config's `InputConfig` (flags
--train_crop_min_area, --train_crop_max_aspect, --train_resize_method)
changes the area, the aspect range and the resize kernel; the defaults are
ImageNet's.

Evaluation decodes a centre crop of --eval_crop_fraction (0.875) of the
shorter side and resizes it; `preprocess_for_eval` is the one definition used
by the eval pipeline and by export. tensorflow/tpu writes the fraction as
image_size / (image_size + 32): 0.875 at 224 px, but 0.5 at 32 px, which
throws away half of a small image's side; a fixed fraction keeps the crop
ImageNet's at 224 px and at every other size.

Every function returns uint8 pixels (the resize rounded to the nearest
level); normalisation is the model's. Handing uint8 to the replicas
instead of float32 writes and copies a quarter of the bytes per image on the
host and moves a quarter over the host-to-device link; the model casts on the
device (`python -m lab.bench_input` times both).
"""
import tensorflow as tf

from resnet_tpu.config import InputConfig


# 224 / (224 + 32): tensorflow/tpu's eval crop at 224 px.
EVAL_CROP_FRACTION = 0.875
MIN_OBJECT_COVERED = 0.1
MAX_ATTEMPTS = 10


def _window(offset: tf.Tensor, size: tf.Tensor) -> tf.Tensor:
  """[y, x] and [h, w] -> the [y, x, h, w] window of decode_and_crop_jpeg."""
  return tf.stack([offset[0], offset[1], size[0], size[1]])


def center_crop_window(image_shape: tf.Tensor,
                       crop_fraction: float = EVAL_CROP_FRACTION
                       ) -> tf.Tensor:
  """The eval crop: a centred square of `crop_fraction` of the shorter side.

  The side is truncated to whole pixels and the offsets round up, as
  tensorflow/tpu's _decode_and_center_crop.
  """
  height, width = image_shape[0], image_shape[1]
  short_side = tf.cast(tf.minimum(height, width), tf.float64)
  crop = tf.maximum(tf.cast(crop_fraction * short_side, tf.int32), 1)
  offset = tf.stack([(height - crop + 1) // 2, (width - crop + 1) // 2])
  return _window(offset, tf.stack([crop, crop]))


def sample_crop_window(image_shape: tf.Tensor,
                       seed: tf.Tensor | None = None,
                       options: InputConfig = InputConfig()) -> tf.Tensor:
  """An Inception-style random crop window [y, x, h, w] of an image shape.

  When none of MAX_ATTEMPTS boxes fits, the sampler returns the whole image
  and we use the eval centre crop instead, as tensorflow/tpu does. A `seed`
  (shape [2] int) selects the stateless sampler: the window is then a pure
  function of (image_shape, seed).
  """
  kwargs = dict(
      bounding_boxes=tf.constant([0.0, 0.0, 1.0, 1.0], shape=[1, 1, 4]),
      min_object_covered=MIN_OBJECT_COVERED,
      aspect_ratio_range=(1.0 / options.train_crop_max_aspect,
                          options.train_crop_max_aspect),
      area_range=(options.train_crop_min_area, 1.0),
      max_attempts=MAX_ATTEMPTS,
      use_image_if_no_bounding_boxes=True)
  if seed is None:
    offset, size, _ = tf.image.sample_distorted_bounding_box(
        image_shape, **kwargs)
  else:
    offset, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        image_shape, seed=seed, **kwargs)
  whole_image = tf.reduce_all(tf.equal(size[:2], image_shape[:2]))
  # Both windows are a few scalar ops: a select is cheaper than a tf.cond.
  return tf.where(whole_image,
                  center_crop_window(image_shape, options.eval_crop_fraction),
                  _window(offset, size))


def decode_and_crop(image_bytes: tf.Tensor, window: tf.Tensor,
                    fused: bool) -> tf.Tensor:
  """Decodes the `window` [y, x, h, w] of a JPEG to uint8 [h, w, 3].

  fused=True decodes only the window; fused=False decodes the whole image and
  slices it. They agree pixel for pixel except in the window's first and last
  column, where chroma upsampling sees different neighbours (a few levels).
  """
  if fused:
    return tf.image.decode_and_crop_jpeg(image_bytes, window, channels=3)
  image = tf.io.decode_jpeg(image_bytes, channels=3)
  return tf.image.crop_to_bounding_box(image, window[0], window[1], window[2],
                                       window[3])


def resize(image: tf.Tensor, image_size: int,
           method: str = "bilinear") -> tf.Tensor:
  """Resize to uint8 [size, size, 3], rounded to the nearest level.

  A bilinear sample of uint8 pixels lies in [0, 255], so adding 0.5 and
  truncating rounds without overflow; a bicubic one can overshoot and is
  clipped first. The crop is cast to float32 first: TensorFlow's float32
  kernel gives bit-identical samples faster than its uint8 kernel, cast
  included (the resize table of lab/bench_input.py). Bicubic is
  tf.image.resize's (Keys a = -0.5, half-pixel centres), not TF1's
  resize_bicubic of tensorflow/tpu bit for bit.
  """
  resized = tf.image.resize(tf.cast(image, tf.float32),
                            [image_size, image_size], method=method)
  if method != "bilinear":
    resized = tf.clip_by_value(resized, 0.0, 255.0)
  resized = tf.cast(resized + 0.5, tf.uint8)
  return tf.ensure_shape(resized, [image_size, image_size, 3])


def random_flip(image: tf.Tensor, seed: tf.Tensor | None) -> tf.Tensor:
  """Left-right flip with probability 1/2 (stateless when `seed` is given).

  Only flipped images pay for the reverse (tf.image's flip computes it for
  every image and selects).
  """
  if seed is None:
    uniform = tf.random.uniform([])
  else:
    uniform = tf.random.stateless_uniform([], seed=seed)
  return tf.cond(uniform < 0.5, lambda: tf.reverse(image, axis=[1]),
                 lambda: image)


def preprocess_for_train(image_bytes: tf.Tensor, image_size: int, fused: bool,
                         seed: tf.Tensor | None = None,
                         options: InputConfig = InputConfig()) -> tf.Tensor:
  """JPEG -> random crop, resize, random flip (unless
  options.random_flip is off) -> uint8 [S, S, 3].

  With a `seed` (shape [2] int) every random choice is stateless, so the
  output is a pure function of (image_bytes, seed); without one the stateful
  random ops are used.
  """
  crop_seed, flip_seed = (None, None) if seed is None else tf.unstack(
      tf.random.split(seed, 2))
  shape = tf.image.extract_jpeg_shape(image_bytes)
  window = sample_crop_window(shape, crop_seed, options)
  image = resize(decode_and_crop(image_bytes, window, fused), image_size,
                 options.train_resize_method)
  return random_flip(image, flip_seed) if options.random_flip else image


def preprocess_for_eval(image_bytes: tf.Tensor, image_size: int,
                        crop_fraction: float = EVAL_CROP_FRACTION
                        ) -> tf.Tensor:
  """JPEG -> centre crop of `crop_fraction`, bilinear resize -> uint8."""
  window = center_crop_window(tf.image.extract_jpeg_shape(image_bytes),
                              crop_fraction)
  return resize(decode_and_crop(image_bytes, window, fused=True), image_size)
