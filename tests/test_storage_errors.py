"""Storage that fails while the run writes ends it in one line naming the
path and the last good checkpoint, which stays readable (issue 37)."""
import os

from absl import logging
import pytest
import tensorflow as tf

import main as main_lib
from resnet_tpu import run as run_lib
from resnet_tpu.config import TrainConfig
from resnet_tpu.train.checkpoints import storage
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine
from conftest import cpu_strategy
from tiny_model import tiny_resnet


def _config(tmp_path, **overrides) -> TrainConfig:
  return TrainConfig.tiny(str(tmp_path / "model"), **{
      "use_synthetic_data": True, "num_classes": 10, "train_steps": 4,
      "steps_per_loop": 1, "checkpoint_every_steps": 1,
      "global_batch_size": 8, "num_train_images": 32, **overrides})


def test_a_checkpoint_that_cannot_be_written_ends_the_run_in_one_line(
    tmp_path):
  cfg = _config(tmp_path)

  def block_the_second_save(record):
    if record["step"] == 1:  # ckpt-1 is written; ckpt-2's index cannot be
      os.makedirs(os.path.join(cfg.model_dir, "ckpt-2.index"))

  with pytest.raises(storage.StorageError) as error:
    run_lib.run(cfg, model_fn=tiny_resnet, loop_callback=block_the_second_save)
  message = str(error.value)
  assert "\n" not in message
  last = os.path.join(cfg.model_dir, "ckpt-1")
  assert message.startswith(f"Writing a checkpoint to {cfg.model_dir} failed")
  assert f"The last good checkpoint is {last};" in message
  # It stays the latest, and it restores.
  assert tf.train.latest_checkpoint(cfg.model_dir) == last
  trainer = TensorFlowEngine(cfg, cpu_strategy(1), model_fn=tiny_resnet)
  trainer.restore()
  assert trainer.step == 1


def test_a_model_dir_gone_while_training_is_named(tmp_path):
  cfg = _config(tmp_path)

  def replace_the_model_dir_by_a_file(record):
    if record["step"] == 2:
      tf.io.gfile.rmtree(cfg.model_dir)
      with open(cfg.model_dir, "w") as f:
        f.write("not a folder")

  with pytest.raises(storage.StorageError, match=(
      f"Writing a checkpoint to {cfg.model_dir} failed: .* is not a "
      r"directory. The last good checkpoint is none \(no checkpoint is "
      r"readable in the model_dir\)")):
    run_lib.run(cfg, model_fn=tiny_resnet,
                loop_callback=replace_the_model_dir_by_a_file)


def test_transient_errors_are_retried_and_others_are_not(tmp_path):
  calls = []

  def flaky():
    calls.append(1)
    if len(calls) < 3:
      raise tf.errors.UnavailableError(None, None, "503 Service Unavailable")
    return "written"

  assert storage.written("x", "gs://b/x", str(tmp_path), flaky,
                         delays_s=(0, 0, 0)) == "written"
  assert len(calls) == 3
  calls.clear()

  def full():
    calls.append(1)
    raise OSError(28, "No space left on device")

  with pytest.raises(storage.StorageError, match=(
      r"Writing x to /d/x failed: OSError: \[Errno 28\] No space left on "
      r"device. The last good checkpoint is none \(")):
    storage.written("x", "/d/x", str(tmp_path), full, delays_s=(0, 0))
  assert len(calls) == 1


def test_main_prints_a_storage_error_as_one_line(tmp_path, monkeypatch,
                                                 capsys):
  error = storage.StorageError(
      "a checkpoint", "/m", OSError(28, "No space left on device"),
      str(tmp_path))

  def failing_run(cfg, model_fn=None):
    raise error

  monkeypatch.setattr(run_lib, "run", failing_run)
  # Parsing main.py's flags sets absl's logger to its --verbosity (WARNING
  # by default), where it was unset: later tests in this process read its
  # INFO lines.
  level = logging.get_absl_logger().level
  main_lib.FLAGS.unparse_flags()
  main_lib.FLAGS(["main.py", f"--model_dir={tmp_path}", "--train_steps=1",
                  "--strategy=cpu", "--use_synthetic_data"])
  try:
    with pytest.raises(SystemExit) as exit_:
      main_lib.main(["main.py"])
  finally:
    main_lib.FLAGS.unparse_flags()
    logging.get_absl_logger().setLevel(level)
  assert exit_.value.code == f"main.py: error: {error}"
