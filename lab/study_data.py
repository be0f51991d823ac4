"""The study's data: real photos as class-folder JPEGs, then TFRecords.

The default set is Fashion-MNIST (Xiao et al. 2017, arXiv 1708.07747) from
Debian's `dataset-fashion-mnist` package: 60,000 training and 10,000 test
photos of clothing, 28x28 grey levels, 10 classes. `fashion_mnist_folders`
writes a subset once as class-folder JPEGs at 32 px RGB (the grey level in
all three channels, resized bilinear), the layout any user's own set
(--image_dir) has too; `tfrecords` then runs the project's own
data/build_tfrecords.py on it, so the study reads what a real run reads.
Both are cached: a second study with the same subset reuses them.
"""
import dataclasses
import gzip
import os

from absl import logging
import numpy as np
import tensorflow as tf

from data import build_tfrecords

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "validation": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
# Sorted folder names = label order (data/build_tfrecords.py sorts them).
FASHION_MNIST_CLASSES = ("0_tshirt_top", "1_trouser", "2_pullover",
                         "3_dress", "4_coat", "5_sandal", "6_shirt",
                         "7_sneaker", "8_bag", "9_ankle_boot")
IMAGE_SIDE = 32
JPEG_QUALITY = 95
# Test folders may be named either way; the TFRecord split is "validation".
TEST_FOLDERS = ("validation", "test")


@dataclasses.dataclass(frozen=True)
class StudyData:
  """TFRecords of a study set and what a TrainConfig needs to read them."""
  data_dir: str
  num_train: int
  num_test: int
  num_classes: int
  name: str  # "Fashion-MNIST" or the --image_dir folder's name


def read_idx(path: str) -> np.ndarray:
  """An idx file (gzipped or not) as a uint8 array of its dimensions."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    data = f.read()
  if data[:2] != b"\0\0" or data[2] != 8:
    raise ValueError(f"{path} is not an idx file of unsigned bytes.")
  ndim = data[3]
  shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big")
                for i in range(ndim))
  return np.frombuffer(data, np.uint8, offset=4 + 4 * ndim).reshape(shape)


def _write_jpegs(images: np.ndarray, labels: np.ndarray, folder: str) -> None:
  for name in FASHION_MNIST_CLASSES:
    tf.io.gfile.makedirs(os.path.join(folder, name))
  grey = tf.image.resize(images[..., None].astype(np.float32),
                         [IMAGE_SIDE, IMAGE_SIDE])
  rgb = tf.cast(tf.clip_by_value(tf.round(grey), 0, 255), tf.uint8)
  rgb = tf.repeat(rgb, 3, axis=-1).numpy()
  for i, (image, label) in enumerate(zip(rgb, labels)):
    path = os.path.join(folder, FASHION_MNIST_CLASSES[label], f"{i:05d}.jpg")
    with open(path, "wb") as f:
      f.write(tf.io.encode_jpeg(image, quality=JPEG_QUALITY).numpy())


def fashion_mnist_folders(cache_dir: str, num_train: int, num_test: int,
                          source_dir: str = FASHION_MNIST_DIR) -> str:
  """The first num_train / num_test photos as <cache>/images_<n>_<m>/."""
  root = os.path.join(cache_dir, f"images_{num_train}_{num_test}")
  done = os.path.join(root, ".complete")
  if os.path.exists(done):
    return root
  for split, count in (("train", num_train), ("validation", num_test)):
    image_file, label_file = (os.path.join(source_dir, f)
                              for f in FASHION_MNIST_FILES[split])
    if not os.path.exists(image_file):
      raise ValueError(
          f"{image_file} not found: install Debian's dataset-fashion-mnist "
          "(apt-get install dataset-fashion-mnist) or pass --image_dir.")
    images, labels = read_idx(image_file), read_idx(label_file)
    if count > len(images):
      raise ValueError(f"Fashion-MNIST {split} has {len(images)} images; "
                       f"{count} were asked for.")
    logging.info("Writing %d Fashion-MNIST %s JPEGs to %s", count, split,
                 root)
    _write_jpegs(images[:count], labels[:count], os.path.join(root, split))
  open(done, "w").close()
  return root


def validation_indices(labels: np.ndarray, per_class: int, seed: int,
                       first: int) -> np.ndarray:
  """A seeded, stratified validation split of the training images:
  `per_class` indices of each class, drawn without replacement from the
  indices at or after `first` (those before it are the studies' training
  images), sorted."""
  rng = np.random.default_rng(seed)
  chosen = []
  for label in range(len(FASHION_MNIST_CLASSES)):
    pool = np.flatnonzero(labels[first:] == label) + first
    if len(pool) < per_class:
      raise ValueError(f"Fashion-MNIST train has {len(pool)} images of class "
                       f"{label} after its first {first}; {per_class} were "
                       "asked for.")
    chosen.append(rng.choice(pool, per_class, replace=False))
  return np.sort(np.concatenate(chosen))


def fashion_mnist_validation_folders(cache_dir: str, num_train: int,
                                     per_class: int, seed: int, first: int,
                                     source_dir: str = FASHION_MNIST_DIR
                                     ) -> str:
  """The first num_train training photos as <root>/train/ and a validation
  split of the training photos (validation_indices) as
  <root>/validation/; the test photos are not read."""
  root = os.path.join(cache_dir, f"images_{num_train}_val{per_class}x10_"
                      f"seed{seed}_from{first}")
  done = os.path.join(root, ".complete")
  if os.path.exists(done):
    return root
  image_file, label_file = (os.path.join(source_dir, f)
                            for f in FASHION_MNIST_FILES["train"])
  if not os.path.exists(image_file):
    raise ValueError(
        f"{image_file} not found: install Debian's dataset-fashion-mnist "
        "(apt-get install dataset-fashion-mnist).")
  images, labels = read_idx(image_file), read_idx(label_file)
  if num_train > first:
    raise ValueError(f"The validation split starts at training image {first}"
                     f", inside the {num_train} training images.")
  held = validation_indices(labels, per_class, seed, first)
  logging.info("Writing %d Fashion-MNIST training JPEGs and a validation "
               "split of %d to %s", num_train, len(held), root)
  _write_jpegs(images[:num_train], labels[:num_train],
               os.path.join(root, "train"))
  _write_jpegs(images[held], labels[held], os.path.join(root, "validation"))
  open(done, "w").close()
  return root


def validation_data(cache_dir: str, num_train: int, per_class: int,
                    seed: int, first: int,
                    source_dir: str = FASHION_MNIST_DIR) -> StudyData:
  """TFRecords of the first num_train training photos, with a validation
  split of the training photos as the evaluated split (cached)."""
  folders = fashion_mnist_validation_folders(cache_dir, num_train, per_class,
                                             seed, first, source_dir)
  return tfrecords(folders, os.path.join(
      cache_dir, "tfrecords_" + os.path.basename(folders).removeprefix(
          "images_")), "Fashion-MNIST, validation split")


def _test_folder(image_dir: str) -> str:
  for name in TEST_FOLDERS:
    if os.path.isdir(os.path.join(image_dir, name)):
      return os.path.join(image_dir, name)
  raise ValueError(f"--image_dir={image_dir!r} needs train/<class>/ and "
                   f"one of {TEST_FOLDERS}/<class>/ image folders.")


def tfrecords(image_dir: str, output_dir: str, name: str,
              num_shards: int = 8) -> StudyData:
  """TFRecords of image_dir/train and its test folder (cached)."""
  done = os.path.join(output_dir, ".complete")
  splits = (("train", os.path.join(image_dir, "train")),
            ("validation", _test_folder(image_dir)))
  counts = {}
  for split, folder in splits:
    images = build_tfrecords.list_images(folder)
    counts[split] = len(images)
    if not os.path.exists(done):
      build_tfrecords.build(folder, output_dir, split,
                            min(num_shards, len(images)))
  open(done, "w").close()
  num_classes = len(build_tfrecords.read_synsets(
      os.path.join(output_dir, build_tfrecords.SYNSETS_FILE)))
  return StudyData(output_dir, counts["train"], counts["validation"],
                   num_classes, name)


def study_data(cache_dir: str, image_dir: str, num_train: int,
               num_test: int, source_dir: str = FASHION_MNIST_DIR
               ) -> StudyData:
  """Fashion-MNIST subsets (default) or the user's class folders."""
  if not image_dir:
    folders = fashion_mnist_folders(cache_dir, num_train, num_test,
                                    source_dir)
    output_dir = os.path.join(cache_dir, f"tfrecords_{num_train}_{num_test}")
    return tfrecords(folders, output_dir, "Fashion-MNIST")
  tag = os.path.abspath(image_dir).strip("/").replace("/", "_")
  return tfrecords(image_dir, os.path.join(cache_dir, "image_dirs", tag),
                   os.path.basename(os.path.abspath(image_dir)))
