"""The pre-flight's checks of the TFRecord data (preflight.py runs them).

* `find_data_files`: --data_dir is a folder holding train and validation
  TFRecord files. The one glob of a run: every later step takes this list.
* `check_data_dir`: the first record of the train and validation files is
  read: the files must be TFRecords of tf.train.Example with the features of
  input_pipeline.FEATURES, and the label must lie in [0, --num_classes)
  after --label_offset. Later records are guarded while training
  (record_guards.py). A progressive JPEG in the first training record is
  logged as a warning: the fused decode-and-crop saves nothing on it.
* `check_manifest`: every file's size must match manifest.json, when the
  data has one (resnet_tpu/inputs/manifest.py), so a truncated copy fails in
  O(files) stats instead of losing records every epoch.
* `check_classes`: --num_classes is the number of classes synsets.txt
  lists, where the data has one.
* `count_train_images`: the epoch length, from the data.

Every read here goes through tf.io.gfile alone: MultiWorkerMirroredStrategy
can configure its collectives only before TensorFlow's runtime starts. This
module needs TensorFlow; a synthetic run does not import it (a JAX run
without TensorFlow: files.py).
"""
import dataclasses
import os
import time
from typing import Sequence

from absl import logging
import tensorflow as tf
from google.protobuf import message

from resnet_tpu.config import ConfigError
from resnet_tpu.config import IMAGENET_TRAIN_IMAGES
from resnet_tpu.config import TrainConfig
from resnet_tpu.inputs import class_list
from resnet_tpu.inputs import input_pipeline
from resnet_tpu.inputs import manifest
from resnet_tpu.inputs import record_guards
from resnet_tpu.inputs import shard_audit

# ImageNet's training files, in tensorflow/tpu imagenet_to_gcs.py's layout.
IMAGENET_TRAIN_FILES = tuple(f"train-{i:05d}-of-01024" for i in range(1024))
# Size mismatches named in one error.
MAX_LISTED = 5


@dataclasses.dataclass(frozen=True)
class DataFiles:
  """The sorted TFRecord files of each split, listed once."""
  train: tuple[str, ...]
  validation: tuple[str, ...]


def find_data_files(data_dir: str) -> DataFiles:
  """Lists the files of both splits in --data_dir (local, gs://, any
  filesystem TensorFlow reads); ConfigError if it is not a folder or a split
  has none."""
  if not tf.io.gfile.isdir(data_dir):
    raise ConfigError(f"--data_dir={data_dir!r} is not a directory.")
  return DataFiles(**{split: tuple(input_pipeline.split_files(data_dir, split))
                      for split in input_pipeline.SPLITS})


def _first_record(files: Sequence[str]) -> tuple[bytes, str] | None:
  """The first record of the first non-empty file, and that file (read
  without starting TensorFlow's runtime: shard_audit.first_record)."""
  for path in files:
    try:
      record = shard_audit.first_record(path)
    except tf.errors.DataLossError as e:
      raise ConfigError(
          f"{path} (in --data_dir) is not a TFRecord file: {e.message}. "
          "Expected the imagenet_to_gcs format written by "
          "data/build_tfrecords.py.") from e
    if record is not None:
      return record, path
  return None


def _check_example(record: bytes, path: str,
                   cfg: TrainConfig) -> tf.train.Example:
  label_offset, num_classes = cfg.input.label_offset, cfg.model.num_classes
  try:
    example = tf.train.Example.FromString(record)
  except message.DecodeError as e:
    raise ConfigError(f"The first record of {path} (in --data_dir) is not a "
                     f"tf.train.Example: {e}.") from e
  features = example.features.feature
  missing = sorted(set(input_pipeline.FEATURES) - set(features))
  if missing:
    raise ConfigError(
        f"The first record of {path} (in --data_dir) lacks the features "
        f"{missing}; it has {sorted(features)}. Expected "
        f"{sorted(input_pipeline.FEATURES)} (imagenet_to_gcs format).")
  labels = features["image/class/label"].int64_list.value
  if len(labels) != 1 or not 0 <= labels[0] - label_offset < num_classes:
    raise ConfigError(
        f"The first record of {path} has image/class/label {list(labels)}; "
        f"after subtracting --label_offset={label_offset} it must be one "
        f"value in [0, --num_classes={num_classes}).")
  return example


def _warn_if_progressive(example: tf.train.Example, path: str) -> None:
  image = example.features.feature["image/encoded"].bytes_list.value
  if image and record_guards.is_progressive_jpeg(image[0]):
    logging.warning(
        "The first record of %s (in --data_dir) is a progressive JPEG: the "
        "fused decode-and-crop (--fused_decode_crop) saves nothing on "
        "progressive JPEGs, which also decode about 2x slower; "
        "data/build_tfrecords.py --progressive_to_baseline re-encodes them "
        "as baseline JPEGs (docs/performance.md).", path)


def check_data_dir(cfg: TrainConfig, files: DataFiles) -> None:
  """Raises ConfigError naming the file when the data cannot be trained on."""
  for split in input_pipeline.SPLITS:
    listed = getattr(files, split)
    first = _first_record(listed)
    if first is None:
      raise ConfigError(f"--data_dir={cfg.input.data_dir!r}: the "
                        f"{len(listed)} {split} files hold no records.")
    example = _check_example(*first, cfg)
    if split == "train":
      _warn_if_progressive(example, first[1])


def _manifest_mismatches(data_dir: str, split: str, found: Sequence[str],
                         listed: manifest.Split) -> list[str]:
  paths = sorted(set(found) | {os.path.join(data_dir, n) for n in listed})
  sizes = manifest.file_sizes(paths)
  mismatches = []
  for path in paths:
    entry = listed.get(os.path.basename(path))
    if entry is None:
      mismatches.append(f"{path} is a {split} file manifest.json does not "
                        "list")
    elif sizes[path] < 0:
      mismatches.append(f"{path} is missing ({entry.records:,} records)")
    elif sizes[path] != entry.bytes:
      mismatches.append(f"{path} is {sizes[path]:,} bytes, manifest.json "
                        f"says {entry.bytes:,}")
  return mismatches


def check_manifest(cfg: TrainConfig, files: DataFiles) -> None:
  """Raises ConfigError naming every file whose size differs from
  manifest.json; warns that lost records cannot be counted without one."""
  data_dir = cfg.input.data_dir
  listed = manifest.read(data_dir)
  verify = manifest.VERIFY_COMMAND.format(data_dir=data_dir)
  if listed is None:
    logging.warning(
        "--data_dir=%s has no manifest.json: records lost to a truncated or "
        "corrupt file cannot be counted or their file named while training, "
        "and a truncated copy is not caught before start-up. `%s "
        "--write_manifest` checks every record and writes one.",
        data_dir, verify)
    return
  mismatches = []
  for split in [s for s in input_pipeline.SPLITS if s in listed]:
    mismatches += _manifest_mismatches(data_dir, split, getattr(files, split),
                                       listed[split])
  if mismatches:
    more = len(mismatches) - MAX_LISTED
    raise ConfigError(
        f"--data_dir={data_dir!r} does not match its manifest.json: "
        + "; ".join(mismatches[:MAX_LISTED])
        + (f"; and {more} more" if more > 0 else "")
        + f". A partial copy? `{verify}` checks every record; copy the "
        "files again, or rebuild them (data/build_tfrecords.py).")


def check_classes(cfg: TrainConfig) -> None:
  """Raises ConfigError when --num_classes is not the number of classes
  the data's synsets.txt lists (data/build_tfrecords.py writes one); data
  without one (tensorflow/tpu's imagenet_to_gcs.py) is not checked."""
  names = class_list.read(cfg.input.data_dir)
  if names is not None and len(names) != cfg.model.num_classes:
    raise ConfigError(
        f"--num_classes={cfg.model.num_classes}, but "
        f"{class_list.path(cfg.input.data_dir)} lists {len(names)} classes: "
        f"set --num_classes={len(names)}.")


def count_train_images(data_dir: str, files: DataFiles) -> int:
  """The training images of the data: the train records of manifest.json,
  else ImageNet's count for its 1024-file layout, else a count of the
  records (their framing read in every train file:
  shard_audit.count_records)."""
  listed = (manifest.read(data_dir) or {}).get("train")
  if listed:
    count = manifest.records(listed)
    logging.info("%s training images (manifest.json)", f"{count:,}")
    return count
  train = files.train
  if tuple(os.path.basename(f) for f in train) == IMAGENET_TRAIN_FILES:
    logging.info("ImageNet's 1024 training files: %s images (no "
                 "manifest.json to count them)", f"{IMAGENET_TRAIN_IMAGES:,}")
    return IMAGENET_TRAIN_IMAGES
  start = time.monotonic()
  count = sum(map(shard_audit.count_records, train))
  logging.info("Counted %s training records in %d files in %.1f s (a "
               "manifest.json saves this: `%s --write_manifest`)",
               f"{count:,}", len(train), time.monotonic() - start,
               manifest.VERIFY_COMMAND.format(data_dir=data_dir))
  return count
