"""The epoch length comes from the data (preflight.num_train_images), and a
schedule boundary beyond the end of the run is warned about before start-up
(preflight.schedule_warnings)."""
import logging

import pytest

from resnet_tpu import data_checks
from resnet_tpu import preflight
from resnet_tpu.engines.tensorflow import startup as tf_startup
from resnet_tpu import run as run_lib
from resnet_tpu.inputs import input_pipeline
from resnet_tpu.optim import schedules
from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from resnet_tpu.runtime import process_setup
import damaged_shards


def _config(data_dir="", **overrides) -> TrainConfig:
  return TrainConfig.from_flat(**{
      "model_dir": "unused", "data_dir": str(data_dir), "num_classes": 3,
      "train_steps": 1, **overrides})


def _train_files(data_dir) -> data_checks.DataFiles:
  """The train files of `data_dir` (it has no validation split)."""
  return data_checks.DataFiles(
      train=tuple(input_pipeline.split_files(str(data_dir), "train")),
      validation=())


def test_num_train_images_is_the_flag_else_the_manifest_else_a_count(
    tmp_path):
  shards = damaged_shards.write_shards(tmp_path, per_file=5)
  files = _train_files(tmp_path)
  assert preflight.num_train_images(_config(tmp_path), files) == 10  # counted
  assert preflight.num_train_images(
      _config(tmp_path, num_train_images=7), files) == 7
  damaged_shards.write_manifest(tmp_path, "train", {
      path: records * 3 for path, records in shards.items()})
  assert preflight.num_train_images(_config(tmp_path),
                                    files) == 30  # manifest


def test_imagenets_1024_file_layout_is_imagenets_count_without_reading(
    tmp_path):
  for i in range(1024):  # empty: reading them would count 0
    (tmp_path / f"train-{i:05d}-of-01024").touch()
  assert preflight.num_train_images(_config(tmp_path),
                                    _train_files(tmp_path)) == 1281167
  assert preflight.num_train_images(
      _config(use_synthetic_data=True), None) == 1281167


def test_warm_up_and_decays_beyond_the_run_are_warned_with_the_peak_lr():
  # A small set (4,000 images) trained with ImageNet's image count.
  cfg = _config(num_train_images=1281167, train_steps=250,
                global_batch_size=64, base_learning_rate=0.1,
                warmup_epochs=5, lr_schedule="step")
  assert preflight.schedule_warnings(cfg) == [
      "--warmup_epochs=5 (100,092 steps) is longer than the run (250 steps, "
      "0.0125 epochs of --num_train_images=1,281,167); the LR peaks at "
      "6.24e-05, 0.25% of the 0.025 it would reach.",
      "The decays of --lr_schedule=step at epochs 30, 60, 80 (steps 600,548, "
      "1,201,095, 1,601,459) lie beyond the end of the run (250 steps, "
      "0.0125 epochs of --num_train_images=1,281,167): the LR never decays "
      "there."]
  assert preflight.schedule_warnings(
      cfg.replace(num_train_images=64, warmup_epochs=5)) == []


def test_batch_size_switch_beyond_the_run_is_warned():
  cfg = _config(num_train_images=1024, train_steps=8, global_batch_size=64,
                batch_size_schedule="0:64,2:128", warmup_epochs=0,
                lr_schedule="constant")
  assert preflight.schedule_warnings(cfg) == [
      "The --batch_size_schedule's switches to global batches 128 at epochs 2 "
      "(steps 32) lie beyond the end of the run (8 steps, 0.5 epochs of "
      "--num_train_images=1,024)."]
  assert preflight.schedule_warnings(
      cfg.replace(train_steps=40)) == []


def test_run_warns_before_start_up_of_a_warm_up_longer_than_the_run(
    tmp_path, monkeypatch, caplog):
  class StartUp(Exception):
    pass

  def strategy(*args, **kwargs):
    raise StartUp

  monkeypatch.setattr(tf_startup, "create_strategy", strategy)
  cfg = _config(model_dir=str(tmp_path), use_synthetic_data=True,
                strategy="cpu", image_size=32, train_steps=250,
                global_batch_size=64)  # an epoch of ImageNet's 1,281,167
  with caplog.at_level(logging.WARNING), pytest.raises(StartUp):
    run_lib.run(cfg)
  assert ("--warmup_epochs=5 (100,092 steps) is longer than the run (250 "
          "steps") in caplog.text


def test_a_schedule_that_cannot_be_built_fails_before_start_up():
  with pytest.raises(ConfigError, match="must exceed --warmup_epochs"):
    schedules.validate_schedule("cosine", 5.0, 0.5, "linear", 0.0)
  with pytest.raises(ConfigError, match="must end before the first decay"):
    schedules.validate_schedule("step", 30.0, 90.0, "linear", 0.0)


def test_the_warm_up_warning_quotes_an_absolute_lr_as_it_is():
  cfg = _config(num_train_images=1_281_167, train_steps=250,
                global_batch_size=4096, base_learning_rate=10.0,
                learning_rate_scaling="none")
  [warm_up, *_] = preflight.schedule_warnings(cfg)
  assert "of the 10 it would reach" in warm_up


@pytest.mark.parametrize("image_size,min_area,noted", [
    (32, 0.08, True), (64, 0.08, True), (96, 0.08, False),
    (32, 0.35, False)])
def test_small_images_with_the_imagenet_crop_get_one_note(image_size,
                                                          min_area, noted):
  cfg = _config("/data", image_size=image_size,
                train_crop_min_area=min_area)
  notes = preflight.input_notes(cfg)
  assert len(notes) == (1 if noted else 0)
  if noted:
    assert f"--image_size={image_size}" in notes[0]
    assert "--train_crop_min_area" in notes[0]


def test_resolve_fills_the_strategy_kind_and_the_epoch_from_host_and_data(
    tmp_path):
  damaged_shards.write_shards(tmp_path, per_file=5)
  cfg = _config(tmp_path, strategy="auto")
  with pytest.raises(ValueError, match="images_per_epoch"):
    cfg.run.clock  # pylint: disable=pointless-statement
  files = _train_files(tmp_path)
  resolved = preflight.resolve(cfg, files)
  assert resolved.distribution.strategy == process_setup.startup_kind("auto",
                                                                     "")
  assert resolved.distribution.strategy != "auto"
  assert resolved.run.num_train_images == 10
  assert resolved.run.total_train_epochs == pytest.approx(
      resolved.run.global_batch_size / 10)
  assert preflight.resolve(resolved, files) == resolved  # once is enough
