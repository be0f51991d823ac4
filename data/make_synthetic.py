"""Writes a learnable synthetic JPEG set in the ImageNet class-folder layout.

Each class has its own hue (evenly spaced around the colour wheel) and one of
four patterns (plain, horizontal stripes, vertical stripes, checkerboard);
every image jitters hue, brightness, stripe period and phase and adds pixel
noise. Colour and pattern survive the Inception random crop (>= 10% of the
area) and horizontal flips, so a small ResNet learns up to about a hundred
classes in a few hundred steps at 32-64 px. Tests and `make demo` use it to run
the real pipeline end to end (data/build_tfrecords.py makes the TFRecords).

  python -m data.make_synthetic --output_dir=demo_data/images \
      --num_classes=10 --images_per_class=100

writes OUTPUT_DIR/{train,validation}/<synset>/<synset>_<i>.JPEG with synsets
n00000000, n00000001, ... (sorted order = class order).
"""
import colorsys
import os

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

PATTERNS = ("plain", "horizontal_stripes", "vertical_stripes", "checkerboard")
JPEG_QUALITY = 90

FLAGS = flags.FLAGS


def synset(class_index: int) -> str:
  """ImageNet-style synset name whose sorted order is the class order."""
  return f"n{class_index:08d}"


def _pattern_mask(pattern: str, height: int, width: int,
                  rng: np.random.Generator) -> np.ndarray:
  """1 where the second colour goes; the period is about height / 6."""
  period = max(2.0, height / 6 * rng.uniform(0.85, 1.15))
  rows = (np.arange(height)[:, None] + rng.uniform(0, period)) // (period / 2)
  cols = (np.arange(width)[None, :] + rng.uniform(0, period)) // (period / 2)
  masks = {
      "plain": np.zeros((height, width)),
      "horizontal_stripes": np.broadcast_to(rows % 2, (height, width)),
      "vertical_stripes": np.broadcast_to(cols % 2, (height, width)),
      "checkerboard": (rows + cols) % 2,
  }
  return masks[pattern]


def render(class_index: int, num_classes: int, image_size: int,
           rng: np.random.Generator) -> np.ndarray:
  """One uint8 [image_size, ~image_size, 3] image of `class_index`."""
  height = image_size
  width = max(1, round(image_size * rng.uniform(0.8, 1.25)))
  hue = (class_index + rng.uniform(-0.2, 0.2)) / num_classes % 1.0
  brightness = rng.uniform(0.75, 1.0)
  first = np.array(colorsys.hsv_to_rgb(hue, 0.85, brightness))
  second = np.array(colorsys.hsv_to_rgb(hue, 0.35, 0.35 * brightness))
  pattern = PATTERNS[class_index % len(PATTERNS)]
  mask = _pattern_mask(pattern, height, width, rng)[..., None]
  image = 255 * (first * (1 - mask) + second * mask)
  image += rng.normal(0, 12, (height, width, 3))
  return np.clip(image, 0, 255).astype(np.uint8)


def write_split(split_dir: str, num_classes: int, images_per_class: int,
                image_size: int, rng: np.random.Generator) -> int:
  """Writes split_dir/<synset>/<synset>_<i>.JPEG; returns the image count."""
  for class_index in range(num_classes):
    folder = os.path.join(split_dir, synset(class_index))
    tf.io.gfile.makedirs(folder)
    for i in range(images_per_class):
      image = render(class_index, num_classes, image_size, rng)
      jpeg = tf.io.encode_jpeg(image, quality=JPEG_QUALITY)
      tf.io.write_file(os.path.join(folder, f"{synset(class_index)}_{i}.JPEG"),
                       jpeg)
  return num_classes * images_per_class


def make_synthetic(output_dir: str, num_classes: int, images_per_class: int,
                   validation_images_per_class: int | None = None,
                   image_size: int = 64, seed: int = 0) -> dict[str, int]:
  """Writes OUTPUT_DIR/train and OUTPUT_DIR/validation; returns image counts."""
  if num_classes < 1 or images_per_class < 1 or image_size < 8:
    raise ValueError(
        "need --num_classes >= 1, --images_per_class >= 1 and --image_size "
        f">= 8, got {num_classes}, {images_per_class} and {image_size}")
  if validation_images_per_class is None:
    validation_images_per_class = max(1, images_per_class // 5)
  rng = np.random.default_rng(seed)
  counts = {}
  for split, per_class in (("train", images_per_class),
                           ("validation", validation_images_per_class)):
    counts[split] = write_split(os.path.join(output_dir, split), num_classes,
                                per_class, image_size, rng)
  logging.info("wrote %s synthetic images of %d classes to %s", counts,
               num_classes, output_dir)
  return counts


def define_flags() -> None:
  """Flags exist only when run as a script; importing defines none."""
  flags.DEFINE_string("output_dir", None,
                      "Folder for the train/ and validation/ class folders.")
  flags.DEFINE_integer("num_classes", 10, "Number of classes.")
  flags.DEFINE_integer("images_per_class", 100, "Training images per class.")
  flags.DEFINE_integer("validation_images_per_class", None, "Validation "
                       "images per class; default images_per_class // 5.")
  flags.DEFINE_integer("image_size", 64,
                       "Image height; widths vary within +-25% of it.")
  flags.DEFINE_integer("seed", 0, "Seed of every random choice.")
  flags.mark_flag_as_required("output_dir")


def main(argv: list[str]) -> None:
  del argv
  make_synthetic(FLAGS.output_dir, FLAGS.num_classes, FLAGS.images_per_class,
                 FLAGS.validation_images_per_class, FLAGS.image_size,
                 FLAGS.seed)


if __name__ == "__main__":
  define_flags()
  app.run(main)
