"""Checks that run before strategy start-up, so bad input fails in seconds.

Starting a TPU pod slice or a multi-worker cluster and tracing ResNet-50
takes minutes; a wrong --data_dir or --model_dir should not cost them.
config.validate checks the flags themselves (sizes agree); here the data
and the model_dir are opened:

* the data: data_checks.py (its folder, first records, manifest.json and
  synsets.txt); none with --use_synthetic_data;
* `check_model_dir`: a model_dir that already holds checkpoints must have
  been written by the same network (its config.json, config.write_config).
* `check_resume`: a resumed run keeps every flag that shapes what it
  computes (batch, schedule, length, seed, data and model settings): a
  change stops it, naming each flag's old and new value, unless
  --allow_config_change names the flag; config.json then records it.
* `num_train_images`: the epoch length, from the data unless set.
* `schedule_warnings`: warm-up, decays and batch-size switches that lie
  beyond the end of the run (the LR schedule counts in epochs).

Every read goes through files.py: TensorFlow's file systems where it is
installed (MultiWorkerMirroredStrategy can configure its collectives only
before TensorFlow's runtime starts, and tf.io.gfile starts none), Python's
own for a synthetic JAX run without TensorFlow, which never imports
data_checks.py.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from absl import logging
import keras

from resnet_tpu import files
from resnet_tpu.optim import schedules
from resnet_tpu.runtime import process_setup
from resnet_tpu.train.checkpoints import paths
from resnet_tpu.config import allowed_changes
from resnet_tpu.config import CONFIG_FILE
from resnet_tpu.config import ConfigError
from resnet_tpu.config import FREE_ON_RESUME
from resnet_tpu.config import IMAGENET_TRAIN_IMAGES
from resnet_tpu.config import TrainConfig

if TYPE_CHECKING:
  from resnet_tpu.data_checks import DataFiles

# config.json keys that decide which variables a checkpoint holds.
CHECKPOINT_KEYS = ("resnet_depth", "num_classes", "optimizer", "backend")
# What a config.json written before a flag existed ran with, where that is
# not the flag's default: every run before --backend ran on TensorFlow.
RECORD_DEFAULTS = {"backend": "tensorflow"}
def _engine_named(values: dict) -> dict:
  """Flag values (a config's or a record's), --backend=auto as the engine
  this process runs (run.py records the one it ran)."""
  if values.get("backend") == "auto":
    return {**values, "backend": keras.backend.backend()}
  return values


def _run_values(cfg: TrainConfig) -> dict:
  return _engine_named(cfg.flat())


def check_model_dir(cfg: TrainConfig) -> None:
  """Raises ConfigError if model_dir has checkpoints of another network.

  Must run before this run writes its own config.json. Without TensorFlow
  (a JAX run: files.py), TensorFlow's checkpoints cannot be read: a
  ConfigError too, not a fresh start beside them.
  """
  tf_latest = (not files.tensorflow_installed() and
               paths.tensorflow_latest(cfg.model_dir))
  if tf_latest:
    raise ConfigError(
        f"--model_dir={cfg.model_dir!r} holds TensorFlow checkpoints "
        f"({tf_latest}), which need TensorFlow, not installed here: resume "
        "where it is (pip install tensorflow-cpu==2.21.0 beside JAX), or "
        "use a new --model_dir.")
  path = os.path.join(cfg.model_dir, CONFIG_FILE)
  if not (paths.latest(cfg.model_dir) and files.exists(path)):
    return
  with files.open_file(path) as f:
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
  latest = paths.latest(cfg.model_dir)
  if not (latest and files.exists(path)):
    return {}
  with files.open_file(path) as f:
    found = _engine_named(json.load(f))
  allowed = set(allowed_changes(cfg))
  if paths.step_of(latest) >= cfg.run.total_train_steps:
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


def data_checks():
  """data_checks.py, imported where there is data to check: it reads the
  TFRecords with TensorFlow, which a synthetic JAX run may not have."""
  from resnet_tpu import data_checks as checks  # pylint: disable=g-import-not-at-top
  return checks


def resolve(cfg: TrainConfig, found: DataFiles | None) -> TrainConfig:
  """`cfg` with what comes from the host and the data filled in: the
  strategy kind (each engine's start-up has resolved it in a run;
  process_setup.startup_kind for a cfg that has not been through one) and
  the images of an epoch. After it no property of the config raises, and nothing
  reads --strategy=auto or --num_train_images=0 again. `found`: None with
  --use_synthetic_data."""
  dist = cfg.distribution
  return cfg.replace(
      strategy=process_setup.startup_kind(dist.strategy, dist.tpu),
      num_train_images=num_train_images(cfg, found))


def num_train_images(cfg: TrainConfig, found: DataFiles | None) -> int:
  """Images per epoch: --num_train_images, else the data's count
  (data_checks.count_train_images). Synthetic data stands in for
  ImageNet."""
  if cfg.run.num_train_images:
    return cfg.run.num_train_images
  if cfg.input.use_synthetic_data:
    logging.info("--use_synthetic_data: an epoch is ImageNet's %s images "
                 "(--num_train_images sets it)", f"{IMAGENET_TRAIN_IMAGES:,}")
    return IMAGENET_TRAIN_IMAGES
  return data_checks().count_train_images(cfg.input.data_dir, found)


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
  found = None
  if not cfg.input.use_synthetic_data:
    checks = data_checks()
    found = checks.find_data_files(cfg.input.data_dir)
    checks.check_data_dir(cfg, found)
    checks.check_manifest(cfg, found)
    checks.check_classes(cfg)
  cfg = resolve(cfg, found)
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
  return cfg, found, changes
