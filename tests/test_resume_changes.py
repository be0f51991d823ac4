"""A resume that refuses silent changes (preflight.check_resume, issue 37):
a flag that shapes what the run computes stops a resumed run, named with
its old and new value, before start-up; --allow_config_change lets it
through and config.json records it."""
import json
import os

import pytest
import tensorflow as tf

from resnet_tpu import config as config_lib
from resnet_tpu import preflight
from resnet_tpu.engines.tensorflow import startup as tf_startup
from resnet_tpu import run as run_lib
from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from tiny_model import tiny_resnet


def _config(tmp_path, **overrides) -> TrainConfig:
  return TrainConfig.tiny(str(tmp_path / "model"), **{
      "use_synthetic_data": True, "num_classes": 10, "train_steps": 2,
      "steps_per_loop": 1, "global_batch_size": 8, "eval_batch_size": 8,
      "num_train_images": 32, **overrides})


def _record(tmp_path) -> dict:
  with open(tmp_path / "model" / config_lib.CONFIG_FILE) as f:
    return json.load(f)


def _no_strategy(*args, **kwargs):
  raise AssertionError("the strategy started before the resume check")


def test_a_changed_batch_stops_the_resume_naming_it_until_allowed(
    tmp_path, monkeypatch):
  run_lib.run(_config(tmp_path), model_fn=tiny_resnet)
  changed = _config(tmp_path, global_batch_size=16, seed=3, train_steps=4)
  with monkeypatch.context() as patch:
    patch.setattr(tf_startup, "create_strategy", _no_strategy)
    with pytest.raises(ConfigError) as error:
      run_lib.run(changed, model_fn=tiny_resnet)
  message = str(error.value)
  for named in ("--global_batch_size=8 there, 16 here",
                "--seed=0 there, 3 here", "--train_steps=2 there, 4 here",
                "--allow_config_change=global_batch_size,train_steps,seed"):
    assert named in message
  assert _record(tmp_path)["global_batch_size"] == 8  # not overwritten

  allowed = changed.replace(
      allow_config_change="global_batch_size,train_steps,seed")
  run_lib.run(allowed, model_fn=tiny_resnet)
  record = _record(tmp_path)
  assert record["global_batch_size"] == 16
  assert record[config_lib.CHANGES_KEY] == [{"changed": {
      "global_batch_size": [8, 16], "seed": [0, 3], "train_steps": [2, 4]}}]
  # The changed run is now the run: the same flags resume it, and the
  # history of changes stays.
  assert preflight.check_resume(changed) == {}
  config_lib.write_config(changed)
  assert len(_record(tmp_path)[config_lib.CHANGES_KEY]) == 1


def test_how_a_run_executes_may_change_on_resume(tmp_path):
  cfg = _config(tmp_path)
  config_lib.write_config(cfg)
  tf.train.Checkpoint(step=tf.Variable(1)).save(
      os.path.join(cfg.model_dir, "ckpt"))
  moved = cfg.replace(steps_per_loop=2, eval_batch_size=16,
                      checkpoint_every_minutes=1.0, num_cpu_replicas=4,
                      keep_checkpoints=2)
  assert preflight.check_resume(moved) == {}
  with pytest.raises(ConfigError, match=r"--label_smoothing=0\.1 there, "
                     r"0\.0 here"):
    preflight.check_resume(cfg.replace(label_smoothing=0.0))


def test_allow_config_change_must_name_flags(tmp_path):
  with pytest.raises(ConfigError, match=r"--allow_config_change names "
                     r"\['global_batch'\]"):
    config_lib.validate(_config(tmp_path, allow_config_change="global_batch"))


def test_a_finished_run_may_be_evaluated_again_with_recomputed_statistics(
    tmp_path):
  """Akiba et al.'s statistics, recomputed for a finished run's weights
  (trainer._evaluate_finished); an unfinished run may not switch."""
  cfg = _config(tmp_path, train_steps=4)
  config_lib.write_config(cfg)
  tf.train.Checkpoint(step=tf.Variable(1)).save(
      os.path.join(cfg.model_dir, "ckpt"))  # ckpt-1: step 1 of 4
  recompute = cfg.replace(bn_stats="recompute")
  with pytest.raises(ConfigError, match="--bn_stats='moving_average' there"):
    preflight.check_resume(recompute)
  tf.train.CheckpointManager(
      tf.train.Checkpoint(step=tf.Variable(1)), cfg.model_dir,
      max_to_keep=2).save(checkpoint_number=4)
  assert preflight.check_resume(recompute) == {
      "bn_stats": ["moving_average", "recompute"]}


def test_a_flag_newer_than_the_record_counts_as_its_default(tmp_path):
  """A run recorded before --zero_init_gamma existed trained with its
  default: resuming it with another value is a change."""
  run_lib.run(_config(tmp_path), model_fn=tiny_resnet)
  record = _record(tmp_path)
  del record["zero_init_gamma"]
  with open(tmp_path / "model" / config_lib.CONFIG_FILE, "w") as f:
    json.dump(record, f)
  assert preflight.check_resume(_config(tmp_path)) == {}
  with pytest.raises(ConfigError, match="--zero_init_gamma=True there, "
                     "False here"):
    preflight.check_resume(_config(tmp_path, zero_init_gamma=False))
