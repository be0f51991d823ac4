"""Specification of the image ops of resnet_tpu.inputs.preprocessing (§3.2)."""
import numpy as np
import pytest
import tensorflow as tf

from resnet_tpu import config as config_lib
from resnet_tpu.config import InputConfig
from resnet_tpu.inputs import preprocessing

HEIGHT, WIDTH = 120, 160
# Chroma upsampling at a window's left and right edge sees other neighbours.
EDGE_TOLERANCE = 24


def textured_jpeg(height: int = HEIGHT, width: int = WIDTH) -> bytes:
  """Smooth colour fields plus noise, so that different crops differ."""
  rng = np.random.default_rng(0)
  field = tf.image.resize(rng.uniform(0, 255, (1, 6, 8, 3)), (height, width),
                          method="bicubic")[0].numpy()
  image = field + rng.normal(0, 10, (height, width, 3))
  return tf.io.encode_jpeg(np.clip(image, 0, 255).astype(np.uint8),
                           quality=90).numpy()


def seed(i: int) -> tf.Tensor:
  return tf.constant([i, 17], tf.int64)


def test_fused_decode_and_crop_equals_decode_then_crop_on_the_same_window():
  jpeg = textured_jpeg()
  full = tf.io.decode_jpeg(jpeg, channels=3).numpy().astype(int)
  rng = np.random.default_rng(1)
  for _ in range(20):
    h, w = rng.integers(8, HEIGHT), rng.integers(8, WIDTH)
    y, x = rng.integers(0, HEIGHT - h + 1), rng.integers(0, WIDTH - w + 1)
    window = tf.constant([y, x, h, w], tf.int32)
    fused = preprocessing.decode_and_crop(jpeg, window, fused=True)
    unfused = preprocessing.decode_and_crop(jpeg, window, fused=False)
    fused, unfused = fused.numpy().astype(int), unfused.numpy().astype(int)
    np.testing.assert_array_equal(unfused, full[y:y + h, x:x + w])
    np.testing.assert_array_equal(fused[:, 1:-1], unfused[:, 1:-1])
    assert np.abs(fused - unfused).max() <= EDGE_TOLERANCE


def test_seeded_train_preprocessing_is_the_same_with_fused_or_full_decode():
  jpeg = textured_jpeg()
  for i in range(10):
    fused = preprocessing.preprocess_for_train(jpeg, 32, True, seed(i))
    unfused = preprocessing.preprocess_for_train(jpeg, 32, False, seed(i))
    difference = np.abs(fused.numpy().astype(int) - unfused.numpy())
    assert difference.mean() < 0.5 and difference.max() <= EDGE_TOLERANCE


def test_crop_windows_lie_inside_the_image_with_inception_area_and_aspect():
  shape = tf.constant([HEIGHT, WIDTH, 3])
  center = preprocessing.center_crop_window(shape).numpy().tolist()
  areas = []
  for i in range(200):
    window = preprocessing.sample_crop_window(shape, seed(i))
    y, x, h, w = window.numpy().tolist()
    assert 0 <= y and 0 <= x and y + h <= HEIGHT and x + w <= WIDTH
    if [y, x, h, w] != center:
      areas.append(h * w / (HEIGHT * WIDTH))
      assert 0.1 - 0.02 <= areas[-1] <= 1.0
      assert 3 / 4 - 0.06 <= w / h <= 4 / 3 + 0.06
  assert len(areas) > 150 and min(areas) < 0.3 and max(areas) > 0.7


def test_crop_falls_back_to_the_center_crop_when_no_box_fits():
  # Boxes of aspect 3/4..4/3 in a 10x1000 strip cover < 0.02% of it.
  shape = tf.constant([10, 1000, 3])
  expected = preprocessing.center_crop_window(shape).numpy().tolist()
  for i in range(5):
    window = preprocessing.sample_crop_window(shape, seed(i))
    assert window.numpy().tolist() == expected


def test_center_crop_is_centred_and_the_fraction_of_the_short_side():
  for fraction in (0.875, 0.5, 1.0):
    window = preprocessing.center_crop_window(
        tf.constant([HEIGHT, WIDTH, 3]), fraction)
    y, x, h, w = window.numpy().tolist()
    assert h == w == int(fraction * HEIGHT)
    assert (y, x) == ((HEIGHT - h + 1) // 2, (WIDTH - w + 1) // 2)


# A square JPEG of side S at --image_size=S: the eval crop keeps 0.875 of
# the side at every size. tensorflow/tpu's S / (S + 32) gave [8, 8, 16, 16]
# at 32 px (half the side) and [11, 11, 42, 42] at 64 px.
@pytest.mark.parametrize("size,window", [(32, [2, 2, 28, 28]),
                                         (64, [4, 4, 56, 56]),
                                         (224, [14, 14, 196, 196])])
def test_eval_crop_keeps_0_875_of_the_side_at_32_64_and_224_px(size, window):
  jpeg = textured_jpeg(size, size)
  shape = tf.image.extract_jpeg_shape(jpeg)
  assert preprocessing.center_crop_window(shape).numpy().tolist() == window
  image = preprocessing.preprocess_for_eval(jpeg, size).numpy()
  crop = preprocessing.decode_and_crop(jpeg, tf.constant(window), fused=True)
  np.testing.assert_array_equal(image,
                                preprocessing.resize(crop, size).numpy())


def test_eval_preprocessing_is_the_resized_center_crop_of_the_decoded_image():
  jpeg = textured_jpeg()
  image = preprocessing.preprocess_for_eval(jpeg, 32).numpy()
  crop = int(0.875 * HEIGHT)
  y, x = (HEIGHT - crop + 1) // 2, (WIDTH - crop + 1) // 2
  decoded = tf.io.decode_jpeg(jpeg, channels=3)[y:y + crop, x:x + crop]
  expected = tf.image.resize(decoded, [32, 32]).numpy()
  assert image.shape == (32, 32, 3) and image.dtype == np.uint8
  assert np.abs(image - expected).mean() < 0.5


@pytest.mark.parametrize("fused", [True, False])
def test_train_output_is_uint8_raw_pixels_of_the_requested_size(fused):
  image = preprocessing.preprocess_for_train(textured_jpeg(), 24, fused)
  image = image.numpy()
  assert image.shape == (24, 24, 3) and image.dtype == np.uint8
  assert 1 < image.max()


def test_resize_rounds_the_bilinear_sample_to_the_nearest_level():
  # The reference is TensorFlow's uint8 kernel; ours casts to float32 first.
  rng = np.random.default_rng(3)
  for shape, size in [((37, 51, 3), 24), ((150, 300, 3), 224),
                      ((375, 500, 3), 64)]:
    crop = rng.integers(0, 256, shape).astype(np.uint8)
    crop[0, 0] = crop[-1, -1] = 255  # saturated pixels must not wrap to 0
    resized = preprocessing.resize(tf.constant(crop), size).numpy()
    expected = np.floor(tf.image.resize(crop, [size, size]).numpy() + 0.5)
    np.testing.assert_array_equal(resized, expected.astype(np.uint8))
  white = preprocessing.resize(tf.fill([9, 13, 3], tf.constant(255, tf.uint8)),
                               5).numpy()
  assert (white == 255).all()


def test_seeded_train_preprocessing_is_a_pure_function_of_the_seed():
  jpeg = textured_jpeg()
  outputs = [[preprocessing.preprocess_for_train(jpeg, 16, True, seed(i))
              .numpy().tobytes() for i in range(6)] for _ in range(2)]
  assert outputs[0] == outputs[1]
  assert len(set(outputs[0])) == 6


def test_random_flip_mirrors_about_half_of_the_images():
  # Left half white, right half black: a crop across both shows its side.
  image = np.zeros((32, 32, 3), np.uint8)
  image[:, :16] = 255
  jpeg = tf.io.encode_jpeg(image, quality=100).numpy()
  sides = []
  for i in range(60):
    out = preprocessing.preprocess_for_train(jpeg, 8, True, seed(i)).numpy()
    sides.append(np.sign(out[:, 0].mean() - out[:, -1].mean()))
  assert sides.count(-1) >= 10 and sides.count(1) >= 10


def test_without_random_flip_no_image_is_mirrored():
  image = np.zeros((32, 32, 3), np.uint8)
  image[:, :16] = 255  # left half white
  jpeg = tf.io.encode_jpeg(image, quality=100).numpy()
  options = InputConfig(random_flip=False, train_crop_min_area=1.0,
                        train_crop_max_aspect=1.0)
  for i in range(20):
    out = preprocessing.preprocess_for_train(jpeg, 8, True, seed(i),
                                             options).numpy()
    assert out[:, 0].mean() > out[:, -1].mean()


def test_random_flip_is_an_exact_mirror_or_the_identity():
  image = tf.constant(np.random.default_rng(4).integers(
      0, 256, (6, 7, 3)).astype(np.uint8))
  outcomes = set()
  for i in range(20):
    out = preprocessing.random_flip(image, seed(i)).numpy()
    mirrored = np.array_equal(out, image.numpy()[:, ::-1])
    assert mirrored or np.array_equal(out, image.numpy())
    outcomes.add(mirrored)
  assert outcomes == {True, False}


def test_crop_options_bound_the_area_and_aspect_of_the_random_boxes():
  shape = tf.constant([HEIGHT, WIDTH, 3])
  options = InputConfig(train_crop_min_area=0.5, train_crop_max_aspect=1.1)
  center = preprocessing.center_crop_window(shape).numpy().tolist()
  areas = []
  for i in range(200):
    y, x, h, w = preprocessing.sample_crop_window(
        shape, seed(i), options).numpy().tolist()
    if [y, x, h, w] != center:
      areas.append(h * w / (HEIGHT * WIDTH))
      assert 1 / 1.1 - 0.03 <= w / h <= 1.1 + 0.03
  assert len(areas) > 150 and 0.5 - 0.02 <= min(areas) < 0.6


def test_bicubic_resize_is_tf_bicubic_clipped_and_rounded():
  checkers = np.kron(np.indices((6, 6)).sum(0) % 2, np.ones((4, 4)))
  crop = np.repeat(checkers[..., None] * 255, 3, -1).astype(np.uint8)
  resized = preprocessing.resize(tf.constant(crop), 17, "bicubic").numpy()
  raw = tf.image.resize(crop.astype(np.float32), [17, 17], "bicubic").numpy()
  assert raw.min() < 0 and raw.max() > 255  # bicubic overshoots...
  np.testing.assert_array_equal(  # ...and is clipped, never wrapped.
      resized, np.floor(np.clip(raw, 0, 255) + 0.5).astype(np.uint8))
  bilinear = preprocessing.resize(tf.constant(crop), 17).numpy()
  assert np.abs(resized.astype(int) - bilinear).max() > 10


def test_train_preprocessing_resizes_with_the_chosen_kernel():
  jpeg, s = textured_jpeg(), seed(3)
  crop_seed, flip_seed = tf.unstack(tf.random.split(s, 2))
  window = preprocessing.sample_crop_window(
      tf.image.extract_jpeg_shape(jpeg), crop_seed)
  crop = preprocessing.decode_and_crop(jpeg, window, fused=True)
  for method in config_lib.RESIZE_METHODS:
    options = InputConfig(train_resize_method=method)
    image = preprocessing.preprocess_for_train(jpeg, 24, True, s, options)
    expected = preprocessing.random_flip(
        preprocessing.resize(crop, 24, method), flip_seed)
    np.testing.assert_array_equal(image.numpy(), expected.numpy())
