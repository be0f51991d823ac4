"""Checks that run before strategy start-up, so bad input fails in seconds.

Starting a TPU pod slice or a multi-worker cluster and tracing ResNet-50
takes minutes; a wrong --data_dir or --model_dir should not cost them.
config.validate checks the flags themselves (sizes agree); here the data
and the model_dir are opened:

* `find_data_files`: --data_dir is a folder holding train and validation
  TFRecord files. The one glob of a run: every later step takes this list.
* `check_data_dir`: the first record of the train and validation files is
  read: the files must be TFRecords of tf.train.Example with the features of
  input_pipeline.FEATURES, and the label must lie in [0, --num_classes)
  after --label_offset. Later records are guarded while training
  (record_guards.py). A progressive JPEG in the first training record is
  logged as a warning: the fused decode-and-crop saves nothing on it.
* `check_model_dir`: a model_dir that already holds checkpoints must have
  been written by the same network (its config.json, config.write_config).
* `check_resume`: a resumed run keeps every flag that shapes what it
  computes (batch, schedule, length, seed, data and model settings): a
  change stops it, naming each flag's old and new value, unless
  --allow_config_change names the flag; config.json then records it.
* `check_manifest`: every file's size must match manifest.json, when the
  data has one (resnet_tpu/inputs/manifest.py), so a truncated copy fails in
  O(files) stats instead of losing records every epoch.
* `num_train_images`: the epoch length, from the data unless set.
* `schedule_warnings`: warm-up, decays and batch-size switches that lie
  beyond the end of the run (the LR schedule counts in epochs).

Every read here goes through tf.io.gfile alone: MultiWorkerMirroredStrategy
can configure its collectives only before TensorFlow's runtime starts.
"""
import dataclasses
import json
import os
import time
from typing import Sequence

from absl import logging
import keras
import tensorflow as tf
from google.protobuf import message

from resnet_tpu.inputs import record_guards
from resnet_tpu.inputs import input_pipeline
from resnet_tpu.inputs import class_list
from resnet_tpu.inputs import manifest
from resnet_tpu.inputs import shard_audit
from resnet_tpu.optim import schedules
from resnet_tpu.runtime import process_setup
from resnet_tpu.config import allowed_changes
from resnet_tpu.config import CONFIG_FILE
from resnet_tpu.config import ConfigError
from resnet_tpu.config import FREE_ON_RESUME
from resnet_tpu.config import TrainConfig

# config.json keys that decide which variables a checkpoint holds.
CHECKPOINT_KEYS = ("resnet_depth", "num_classes", "optimizer", "backend")
# What a config.json written before a flag existed ran with, where that is
# not the flag's default: every run before --backend ran on TensorFlow.
RECORD_DEFAULTS = {"backend": "tensorflow"}
# ImageNet's training set, in tensorflow/tpu imagenet_to_gcs.py's layout.
IMAGENET_TRAIN_IMAGES = 1281167
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
        "as baseline JPEGs (README 'Running for real').", path)


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


def _engine_named(values: dict) -> dict:
  """Flag values (a config's or a record's), --backend=auto as the engine
  this process runs (run.py and run_jax.py record the one they ran)."""
  if values.get("backend") == "auto":
    return {**values, "backend": keras.backend.backend()}
  return values


def _run_values(cfg: TrainConfig) -> dict:
  return _engine_named(cfg.flat())


def check_model_dir(cfg: TrainConfig) -> None:
  """Raises ConfigError if model_dir has checkpoints of another network.

  Must run before this run writes its own config.json.
  """
  path = os.path.join(cfg.model_dir, CONFIG_FILE)
  if not (tf.train.latest_checkpoint(cfg.model_dir) and
          tf.io.gfile.exists(path)):
    return
  with tf.io.gfile.GFile(path) as f:
    found = _engine_named(json.load(f))
  flat = _run_values(cfg)
  differ = [f"--{key}={found[key]} there, {flat[key]} here"
            for key in CHECKPOINT_KEYS
            if key in found and found[key] != flat[key]]
  if differ:
    raise ConfigError(
        f"--model_dir={cfg.model_dir!r} holds checkpoints of another "
        f"network ({'; '.join(differ)}). Use a new --model_dir to start "
        "over, or the same flags to resume.")


# Flags a finished run may change when it is run again to evaluate.
EVALUATION_ONLY = frozenset({"bn_stats", "bn_recompute_batches"})


def _checkpoint_step(path: str) -> int:
  """The step of a checkpoint the trainer saved (<model_dir>/ckpt-<step>)."""
  suffix = path.rsplit("-", 1)[-1]
  return int(suffix) if suffix.isdigit() else -1


def check_resume(cfg: TrainConfig) -> dict[str, list]:
  """Compares a resumed run's flags with its model_dir's config.json.

  Call it on the resolved config (resolve: the epoch length from the data).
  A finished run may be run again with other EVALUATION_ONLY flags.
  Returns the deliberate changes, flag -> [value there, value here], for
  config.write_config to record; raises ConfigError naming every other
  flag outside config.FREE_ON_RESUME that differs. A model_dir without a
  checkpoint is a fresh start: nothing to compare.
  """
  path = os.path.join(cfg.model_dir, CONFIG_FILE)
  latest = tf.train.latest_checkpoint(cfg.model_dir)
  if not (latest and tf.io.gfile.exists(path)):
    return {}
  with tf.io.gfile.GFile(path) as f:
    found = _engine_named(json.load(f))
  allowed = set(allowed_changes(cfg))
  if _checkpoint_step(latest) >= cfg.run.total_train_steps:
    # A finished run run again only evaluates (trainer._evaluate_finished),
    # with its statistics recomputed if asked (Akiba et al.).
    allowed |= EVALUATION_ONLY
  # A flag newer than the record had its default when the record was
  # written.
  defaults = {**TrainConfig(cfg.model_dir).flat(), **RECORD_DEFAULTS}
  changed = {key: [found.get(key, defaults[key]), value]
             for key, value in _run_values(cfg).items()
             if key not in FREE_ON_RESUME
             and found.get(key, defaults[key]) != value}
  refused = [f"--{key}={old!r} there, {new!r} here"
             for key, (old, new) in changed.items() if key not in allowed]
  if refused:
    names = ",".join(k for k in changed if k not in allowed)
    raise ConfigError(
        f"--model_dir={cfg.model_dir!r} holds a run trained with other "
        f"settings: {'; '.join(refused)}. Resume with the same flags, start "
        f"over in a new --model_dir, or change them deliberately with "
        f"--allow_config_change={names} (config.json records the change).")
  for key, (old, new) in changed.items():
    logging.warning("Resuming with --%s changed from %r to %r "
                    "(--allow_config_change).", key, old, new)
  return changed


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


def resolve(cfg: TrainConfig, files: DataFiles | None) -> TrainConfig:
  """`cfg` with what comes from the host and the data filled in: the
  strategy kind (process_setup.startup_kind, decided once) and the images
  of an epoch. After it no property of the config raises, and nothing
  reads --strategy=auto or --num_train_images=0 again. `files`: None with
  --use_synthetic_data."""
  dist = cfg.distribution
  return cfg.replace(
      strategy=process_setup.startup_kind(dist.strategy, dist.tpu),
      num_train_images=num_train_images(cfg, files))


def num_train_images(cfg: TrainConfig, files: DataFiles | None) -> int:
  """Images per epoch: --num_train_images, else the train records of
  manifest.json, else ImageNet's count for its 1024-file layout, else a
  count of the records (their framing read in every train file:
  shard_audit.count_records).
  Synthetic data stands in for ImageNet."""
  if cfg.run.num_train_images:
    return cfg.run.num_train_images
  if cfg.input.use_synthetic_data:
    logging.info("--use_synthetic_data: an epoch is ImageNet's %s images "
                 "(--num_train_images sets it)", f"{IMAGENET_TRAIN_IMAGES:,}")
    return IMAGENET_TRAIN_IMAGES
  data_dir = cfg.input.data_dir
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


def schedule_warnings(cfg: TrainConfig) -> list[str]:
  """A line for the warm-up, the decays and the batch-size switches that
  lie beyond the end of the run; `cfg` has its num_train_images."""
  optim = cfg.optim
  clock, steps = cfg.run.clock, cfg.run.total_train_steps
  epochs = cfg.run.total_train_epochs
  run = (f"the run ({steps:,} steps, {epochs:.3g} epochs of "
         f"--num_train_images={cfg.run.num_train_images:,})")
  warnings = []
  warmup_steps = clock.steps_for_epochs(optim.warmup_epochs)
  if warmup_steps > steps:
    batch_scale = (1.0 if optim.learning_rate_scaling == "none" else
                   clock.global_batch_at_step(steps - 1) / 256)
    scaled = (optim.base_learning_rate * batch_scale *
              (schedules.SLOW_START_MULTIPLIERS[0]
               if optim.lr_schedule == "slow_start" else 1.0))
    share = epochs / optim.warmup_epochs
    warnings.append(
        f"--warmup_epochs={optim.warmup_epochs:g} ({warmup_steps:,} steps) is "
        f"longer than {run}; the LR peaks at {scaled * share:.3g}, "
        f"{share * 100:.2g}% of the {scaled:.3g} it would reach.")
  boundaries = {"step": schedules.STEP_BOUNDARIES,
                "slow_start": schedules.SLOW_START_BOUNDARIES}
  late = [(epoch, clock.steps_for_epochs(epoch))
          for epoch in boundaries.get(optim.lr_schedule, ())
          if clock.steps_for_epochs(epoch) >= steps]
  if late:
    warnings.append(
        f"The decays of --lr_schedule={optim.lr_schedule} at epochs "
        f"{', '.join(f'{e:g}' for e, _ in late)} (steps "
        f"{', '.join(f'{s:,}' for _, s in late)}) lie beyond the end of "
        f"{run}: the LR never decays there.")
  late = [(epoch, batch, start) for (epoch, batch), start in zip(
      clock.batch_size_schedule, clock.phase_start_steps()) if start >= steps]
  if late:
    warnings.append(
        "The --batch_size_schedule's switches to global batches "
        f"{', '.join(f'{b:,}' for _, b, _ in late)} at epochs "
        f"{', '.join(str(e) for e, _, _ in late)} (steps "
        f"{', '.join(f'{s:,}' for _, _, s in late)}) lie beyond the end of "
        f"{run}.")
  return warnings


# At or below this side the ImageNet crop is a poor fit: its smallest box
# keeps 8% of the area, and small centred objects (digits, clothes) fall out.
SMALL_IMAGE_SIDE = 64
IMAGENET_CROP_MIN_AREA = 0.08


def input_notes(cfg: TrainConfig) -> list[str]:
  """Notes on the input settings worth a look, said once at start-up."""
  inputs, image_size = cfg.input, cfg.model.image_size
  if (inputs.use_synthetic_data or image_size > SMALL_IMAGE_SIDE
      or inputs.train_crop_min_area > IMAGENET_CROP_MIN_AREA):
    return []
  return [f"--image_size={image_size} with ImageNet's Inception crop "
          f"(--train_crop_min_area={inputs.train_crop_min_area:g}): a crop "
          "can keep 8% of a small image and cut a centred object away; "
          "small images usually train better with a larger "
          "--train_crop_min_area."]


def check_run(cfg: TrainConfig
              ) -> tuple[TrainConfig, DataFiles | None, dict[str, list]]:
  """Every pre-flight check of a run, on either engine, before its devices
  start: the model_dir, the data (None: synthetic), the resume and the
  schedule; logs the schedule's warnings and the input's notes. Returns the
  config resolved from the data, the files and the resume's deliberate
  changes (check_resume)."""
  check_model_dir(cfg)
  files = None
  if not cfg.input.use_synthetic_data:
    files = find_data_files(cfg.input.data_dir)
    check_data_dir(cfg, files)
    check_manifest(cfg, files)
    check_classes(cfg)
  cfg = resolve(cfg, files)
  changes = check_resume(cfg)
  optim = cfg.optim
  schedules.validate_schedule(optim.lr_schedule, optim.warmup_epochs,
                              cfg.run.total_train_epochs,
                              optim.learning_rate_scaling,
                              optim.end_learning_rate)
  for warning in schedule_warnings(cfg):
    logging.warning("%s", warning)
  for note in input_notes(cfg):
    logging.info("Note: %s", note)
  return cfg, files, changes
