"""Preemption, checkpoint integrity and numerical faults (docs/reliability.md).

* SIGTERM to a real `python main.py` run: it finishes the host loop, writes
  a checkpoint, exits with code 42, and the same command resumes from it.
* A save cut short leaves the previous checkpoint as the latest; metrics of
  steps after it are dropped; --keep_checkpoints bounds the checkpoints kept.
* A NaN/Inf loss stops training with an error naming the step and the last
  good checkpoint, which stays the latest; --skip_nonfinite_steps instead
  skips the step as if its batch had never been in the data.
"""
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.checkpoint import checkpoint_management

from conftest import cpu_strategy
from resnet_tpu.train import loop_report
from resnet_tpu.train import loop
from resnet_tpu.train import preemption
from resnet_tpu.train.checkpoints import storage
from resnet_tpu.engines.tensorflow import engine as engine_lib
from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from resnet_tpu.train.metrics_log import read_metrics
from tiny_model import tiny_resnet

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = 32
CLASSES = 10
BATCH = 8
STARTUP_TIMEOUT_S = 300


def _trainer(cfg: TrainConfig, strategy) -> engine_lib.TensorFlowEngine:
  return engine_lib.TensorFlowEngine(cfg, strategy, model_fn=tiny_resnet)


def _config(model_dir, **overrides) -> TrainConfig:
  values = dict(model_dir=str(model_dir), use_synthetic_data=True,
                num_classes=CLASSES, image_size=IMAGE,
                global_batch_size=BATCH, eval_batch_size=BATCH,
                train_steps=4, steps_per_loop=1, checkpoint_every_steps=1,
                num_train_images=10_000, lr_schedule="constant",
                warmup_epochs=0.0, base_learning_rate=0.5)
  values.update(overrides)
  return TrainConfig.from_flat(**values)


def _batches(num_steps: int, nan_at_step: int | None = None):
  """Images and labels of `num_steps` global batches; one NaN pixel in the
  batch of step `nan_at_step` (1-based), if given."""
  rng = np.random.default_rng(0)
  images = rng.uniform(0, 255, (num_steps, BATCH, IMAGE, IMAGE, 3))
  labels = rng.integers(0, CLASSES, (num_steps, BATCH))
  if nan_at_step:
    images[nan_at_step - 1, 3, 0, 0, 0] = np.nan
  return images.astype(np.float32), labels.astype(np.int32)


def _dataset_fn(images, labels):
  def dataset_fn(ctx):
    batch = ctx.get_per_replica_batch_size(BATCH)
    return tf.data.Dataset.from_tensor_slices((
        images.reshape(-1, IMAGE, IMAGE, 3), labels.reshape(-1))).batch(batch)
  return dataset_fn


def _values(variables) -> list[np.ndarray]:
  return [v.numpy() for v in variables]


# --- preemption -------------------------------------------------------------

MAIN_FLAGS = ["--strategy=cpu", "--num_cpu_replicas=2",
              "--use_synthetic_data", "--resnet_depth=18", "--image_size=32",
              "--num_classes=10", "--global_batch_size=4",
              "--eval_batch_size=4", "--train_steps=100000",
              "--steps_per_loop=2"]


def _wait_for_step_above(log_path, step: int, process,
                         deadline: float) -> None:
  """Waits until main.py logs a training step > `step`."""
  while time.time() < deadline:
    with open(log_path) as f:
      logged = [int(s) for s in re.findall(r"step (\d+)/100000", f.read())]
    if logged and max(logged) > step:
      return
    assert process.poll() is None, (
        f"main.py exited with {process.returncode}:\n" +
        open(log_path).read()[-3000:])
    time.sleep(0.5)
  raise AssertionError(f"no step above {step} in {log_path}")


def _run_main_until_sigterm(model_dir, log_path, after_step: int) -> int:
  """Starts main.py, SIGTERMs it once it logged a step > after_step, checks
  exit code 42; returns the step it says it checkpointed."""
  env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
  with open(log_path, "w") as log:
    process = subprocess.Popen(
        [sys.executable, "main.py", f"--model_dir={model_dir}", *MAIN_FLAGS],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
  try:
    _wait_for_step_above(log_path, after_step, process,
                         time.time() + STARTUP_TIMEOUT_S)
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=120)
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  text = open(log_path).read()
  assert code == preemption.PREEMPTED_EXIT_CODE, text[-3000:]
  assert "SIGTERM received" in text
  return int(re.search(r"Preempted \(SIGTERM\) at step (\d+)/", text)[1])


def test_sigterm_checkpoints_exits_42_and_the_same_command_resumes(tmp_path):
  model_dir = tmp_path / "run"
  stopped = _run_main_until_sigterm(model_dir, tmp_path / "first.log", 0)
  assert tf.train.latest_checkpoint(model_dir).endswith(f"ckpt-{stopped}")

  again = _run_main_until_sigterm(model_dir, tmp_path / "second.log",
                                  stopped)
  second_log = (tmp_path / "second.log").read_text()
  assert f"ckpt-{stopped} at step {stopped}" in second_log  # "Restored ..."
  assert again > stopped
  assert tf.train.latest_checkpoint(model_dir).endswith(f"ckpt-{again}")


def _sigterm_self(watcher: preemption.SigtermWatcher) -> None:
  os.kill(os.getpid(), signal.SIGTERM)
  deadline = time.time() + 10
  while not watcher.received and time.time() < deadline:
    time.sleep(0.01)  # Python runs the handler between bytecodes
  assert watcher.received


def test_a_sigterm_no_run_stopped_goes_on_to_the_python_handler_it_displaced():
  """A SIGTERM in a run's last host loop or final eval ends no run (the run
  finishes); a caller's own handler (lab/study.py's) still gets it, once,
  after the watcher. One that raised Preempted is not passed on."""
  calls = []
  outer = signal.signal(signal.SIGTERM, lambda signum, _: calls.append(signum))
  try:
    with preemption.SigtermWatcher() as watcher:
      _sigterm_self(watcher)
      assert calls == []
    assert calls == [signal.SIGTERM]

    calls.clear()
    with pytest.raises(preemption.Preempted):
      with preemption.SigtermWatcher() as watcher:
        _sigterm_self(watcher)
        raise preemption.Preempted("saved")
    with preemption.SigtermWatcher():
      pass
    assert calls == []
  finally:
    signal.signal(signal.SIGTERM, outer)


# --- checkpoint integrity ---------------------------------------------------

def test_save_cut_short_leaves_previous_checkpoint_latest(tmp_path,
                                                          monkeypatch):
  images, labels = _batches(4)
  trainer = _trainer(_config(tmp_path, train_steps=3),
                     cpu_strategy(2))
  commit = checkpoint_management.update_checkpoint_state_internal

  def killed_before_commit_of_step_3(save_dir, model_checkpoint_path,
                                     *args, **kwargs):
    if model_checkpoint_path.endswith("ckpt-3"):
      raise KeyboardInterrupt("killed after writing ckpt-3's data files")
    return commit(save_dir, model_checkpoint_path, *args, **kwargs)

  monkeypatch.setattr(checkpoint_management,
                      "update_checkpoint_state_internal",
                      killed_before_commit_of_step_3)
  with pytest.raises(KeyboardInterrupt):
    trainer.fit(_dataset_fn(images, labels))
  # The data files of step 3 were written, the state file still names 2.
  assert os.path.exists(tmp_path / "ckpt-3.index")
  assert tf.train.latest_checkpoint(tmp_path).endswith("ckpt-2")
  # A save killed while writing data leaves only temporary or partial files.
  with open(tmp_path / "ckpt-3.index", "rb") as f:
    index = f.read()
  for name, data in (("ckpt-9.index", index[:len(index) // 2]),
                     ("ckpt-9.data-00000-of-00001", b"\0" * 100)):
    with open(tmp_path / name, "wb") as f:
      f.write(data)
  assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]

  resumed = _trainer(_config(tmp_path, train_steps=3), cpu_strategy(2))
  # The loop's restore: the engine's, and the records of later steps go.
  assert loop.TrainingLoop(resumed).restore() == 2
  assert resumed.input_batches == 2
  assert not np.array_equal(resumed.model.variables[0].numpy(),
                            trainer.model.variables[0].numpy())  # step 3's
  assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def _truncate(path, keep: float = 0.5) -> None:
  with open(path, "rb") as f:
    data = f.read()
  with open(path, "wb") as f:
    f.write(data[:int(len(data) * keep)])


def test_damaged_latest_checkpoint_falls_back_to_the_intact_one_exactly(
    tmp_path, caplog):
  images, labels = _batches(4)
  model_dir = tmp_path
  uninterrupted = _trainer(_config(model_dir), cpu_strategy(2))
  uninterrupted.fit(_dataset_fn(images, labels))
  _truncate(model_dir / "ckpt-4.data-00000-of-00001")  # bit rot, cut copy

  resumed = _trainer(_config(model_dir), cpu_strategy(2))
  with caplog.at_level("WARNING"):
    resumed.restore()
    assert resumed.step == 3
  assert "ckpt-4 is damaged" in caplog.text
  assert "ckpt-4.data-00000-of-00001" in os.listdir(
      model_dir / "damaged" / "ckpt-4")
  assert tf.train.latest_checkpoint(model_dir).endswith("ckpt-3")
  resumed.fit(_dataset_fn(images, labels))  # redoes step 4 from ckpt-3
  assert resumed.step == 4
  for got, want in zip(_values(resumed.model.variables) +
                       _values(resumed.optimizer.variables),
                       _values(uninterrupted.model.variables) +
                       _values(uninterrupted.optimizer.variables)):
    np.testing.assert_array_equal(got, want)


def test_when_every_checkpoint_is_damaged_restore_names_them_and_the_choices(
    tmp_path):
  images, labels = _batches(2)
  _trainer(_config(tmp_path, train_steps=2), cpu_strategy(1)).fit(
      _dataset_fn(images, labels))
  _truncate(tmp_path / "ckpt-1.index", keep=0.3)
  os.remove(tmp_path / "ckpt-2.data-00000-of-00001")  # a missing shard
  with pytest.raises(ConfigError,
                     match=r"every checkpoint is damaged .*ckpt-2.*ckpt-1.*"
                     r"new --model_dir.*move those") as error:
    _trainer(_config(tmp_path, train_steps=2), cpu_strategy(1)).restore()
  assert not re.search(r"\b(delete|remove)", str(error.value))


def test_a_second_set_aside_of_the_same_checkpoint_keeps_the_first(
    tmp_path):
  images, labels = _batches(2)
  for attempt in (1, 2):
    trainer = _trainer(_config(tmp_path, train_steps=2), cpu_strategy(1))
    trainer.fit(_dataset_fn(images, labels))  # (re)writes ckpt-2
    _truncate(tmp_path / "ckpt-2.data-00000-of-00001", keep=0.3 * attempt)
    again = _trainer(_config(tmp_path, train_steps=2), cpu_strategy(1))
    again.restore()
    assert again.step == 1
  first, second = (tmp_path / "damaged" / "ckpt-2",
                   tmp_path / "damaged" / "ckpt-2.2")
  data = "ckpt-2.data-00000-of-00001"
  assert (first / data).stat().st_size < (second / data).stat().st_size


def _fails_first(monkeypatch, times: int, error: Exception) -> list[str]:
  """tf.train.Checkpoint.restore raises `error` on its first `times`
  calls; returns the paths it was called with."""
  restore = tf.train.Checkpoint.restore
  calls = []

  def flaky(self, save_path, *args, **kwargs):
    calls.append(save_path)
    if len(calls) <= times:
      raise error
    return restore(self, save_path, *args, **kwargs)

  monkeypatch.setattr(tf.train.Checkpoint, "restore", flaky)
  return calls


def _files(model_dir) -> list[str]:
  return sorted(str(p.relative_to(model_dir))
                for p in model_dir.rglob("*") if p.is_file())


@pytest.mark.parametrize("keep", [1, 3])
def test_a_transient_error_on_restore_is_retried_and_moves_nothing(
    tmp_path, monkeypatch, keep):
  images, labels = _batches(3)
  _trainer(_config(tmp_path, train_steps=3, keep_checkpoints=keep),
           cpu_strategy(1)).fit(_dataset_fn(images, labels))
  before = _files(tmp_path)
  calls = _fails_first(monkeypatch, 1, tf.errors.UnavailableError(
      None, None, "503 Service Unavailable"))
  trainer = _trainer(_config(tmp_path, train_steps=3, keep_checkpoints=keep),
                     cpu_strategy(1))
  trainer.checkpoints.retry_delays_s = (0.0,)
  trainer.restore()
  assert trainer.step == 3
  assert [os.path.basename(c) for c in calls] == ["ckpt-3", "ckpt-3"]
  assert _files(tmp_path) == before  # nothing moved, no damaged/
  assert tf.train.latest_checkpoint(tmp_path).endswith("ckpt-3")


def test_a_persistent_transient_error_stops_naming_it_and_moves_nothing(
    tmp_path, monkeypatch):
  images, labels = _batches(3)
  _trainer(_config(tmp_path, train_steps=3, keep_checkpoints=3),
           cpu_strategy(1)).fit(_dataset_fn(images, labels))
  before = _files(tmp_path)
  _fails_first(monkeypatch, 100, tf.errors.DeadlineExceededError(
      None, None, "deadline exceeded reading gs://b/ckpt-3.index"))
  trainer = _trainer(_config(tmp_path, train_steps=3), cpu_strategy(1))
  trainer.checkpoints.retry_delays_s = (0.0, 0.0)
  with pytest.raises(storage.CheckpointUnavailable,
                     match=r"ckpt-3: DeadlineExceededError: deadline "
                     r"exceeded .*tried 3 times.*nothing was moved") as error:
    trainer.restore()
  assert not re.search(r"\b(delete|remove)", str(error.value))
  assert _files(tmp_path) == before


def test_keep_checkpoints_bounds_the_checkpoints_on_disk(tmp_path):
  images, labels = _batches(5)
  trainer = _trainer(
      _config(tmp_path, train_steps=5, keep_checkpoints=2), cpu_strategy(1))
  trainer.fit(_dataset_fn(images, labels))
  assert sorted(f for f in os.listdir(tmp_path) if f.endswith(".index")) == [
      "ckpt-4.index", "ckpt-5.index"]


# --- numerical faults -------------------------------------------------------

def test_nan_loss_stops_naming_the_step_and_keeps_last_good_checkpoint(
    tmp_path):
  images, labels = _batches(6, nan_at_step=5)
  trainer = _trainer(
      _config(tmp_path, train_steps=6, steps_per_loop=2,
              checkpoint_every_steps=2), cpu_strategy(2))
  with pytest.raises(loop_report.NonFiniteLossError,
                     match=r"at step 5 .*ckpt-4 and stays the latest"):
    trainer.fit(_dataset_fn(images, labels))
  assert tf.train.latest_checkpoint(tmp_path).endswith("ckpt-4")
  assert not os.path.exists(tmp_path / "ckpt-6.index")
  restored = _trainer(_config(tmp_path, train_steps=6),
                                 cpu_strategy(2))
  restored.restore()
  assert restored.step == 4
  assert all(np.isfinite(v).all() for v in _values(restored.model.variables))


def test_skip_nonfinite_steps_trains_as_if_the_bad_batch_was_never_there(
    tmp_path):
  images, labels = _batches(5, nan_at_step=3)
  skipping = _trainer(
      _config(tmp_path / "skip", skip_nonfinite_steps=True,
              steps_per_loop=4, checkpoint_every_steps=0), cpu_strategy(2))
  clean = _trainer(
      _config(tmp_path / "clean", steps_per_loop=4, checkpoint_every_steps=0),
      cpu_strategy(2))
  clean.model.set_weights(skipping.model.get_weights())
  keep = [0, 1, 3, 4]
  skipping.fit(_dataset_fn(images, labels))
  clean.fit(_dataset_fn(images[keep], labels[keep]))

  assert skipping.step == clean.step == 4
  for variable, got, want in zip(
      skipping.model.variables + skipping.optimizer.variables,
      _values(skipping.model.variables) + _values(skipping.optimizer.variables),
      _values(clean.model.variables) + _values(clean.optimizer.variables)):
    if variable.synchronization == "on_read":
      # BN moving statistics: each replica's own, averaged at the end of
      # each host loop, and the skipping run's loops end at other batches
      # (4 batches, then 1; the clean run's: 4). The average is linear, so
      # they agree up to float rounding.
      np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-8)
    else:
      np.testing.assert_array_equal(got, want)
  assert [r["skipped_steps"] for r in read_metrics(tmp_path / "skip")] == [
      1, 0]


# --- spot machines: SIGTERM within --max_loop_seconds ----------------------

def test_sigterm_is_answered_within_max_loop_seconds_whatever_the_loop(
    tmp_path):
  """Spot machines (issue 50): with --steps_per_loop=100000 and
  --max_loop_seconds=1, the checkpoint is written within a few seconds of
  SIGTERM (measured: the seconds from the signal to the saved checkpoint
  and to the exit), not after 100,000 steps."""
  model_dir, log_path = tmp_path / "run", tmp_path / "run.log"
  flags = [f for f in MAIN_FLAGS if not f.startswith("--steps_per_loop")]
  env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TF_CPP_MIN_LOG_LEVEL="2")
  with open(log_path, "w") as log:
    process = subprocess.Popen(
        [sys.executable, "main.py", f"--model_dir={model_dir}", *flags,
         "--steps_per_loop=100000", "--max_loop_seconds=1"],
        cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
  try:
    _wait_for_step_above(log_path, 3, process,
                         time.time() + STARTUP_TIMEOUT_S)
    sent = time.time()
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=60)  # a 100,000-step loop would not end
    exited = time.time() - sent
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  text = log_path.read_text()
  assert code == preemption.PREEMPTED_EXIT_CODE, text[-3000:]
  checkpoint = tf.train.latest_checkpoint(model_dir)
  saved = os.path.getmtime(checkpoint + ".index") - sent
  assert 0 < saved < 10, (saved, text[-2000:])
  assert exited < 20, exited
