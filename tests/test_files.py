"""files.py and train/checkpoints/paths.py without TensorFlow (a JAX run on a
machine without it) do what TensorFlow's file API does for them here."""
import os

import pytest
import tensorflow as tf

from resnet_tpu import files
from resnet_tpu.train.checkpoints import paths
from resnet_tpu.train.checkpoints import storage


@pytest.fixture(name="without_tensorflow")
def _without_tensorflow(monkeypatch):
  monkeypatch.setattr(files, "tensorflow_installed", lambda: False)


def _file_ops(root: str) -> list:
  """What a run does to its model_dir, and what it sees afterwards."""
  folder = os.path.join(root, "a", "b")
  files.makedirs(folder)
  files.makedirs(folder)  # already there: no error
  path = os.path.join(folder, "metrics.jsonl")
  with files.open_file(path, "w") as f:
    f.write("one\n")
  with files.open_file(path, "a") as f:
    f.write("two\n")
  with files.open_file(path + ".partial", "wb") as f:
    f.write(b"\x00\x01")
  files.rename(path + ".partial", os.path.join(folder, "x.npz"))
  files.rename(path, os.path.join(folder, "x.npz"))  # replaces it
  with files.open_file(os.path.join(folder, "x.npz")) as f:
    text = f.read()
  seen = [text, files.exists(path), files.isdir(folder),
          [os.path.basename(p) for p in files.glob(f"{folder}/*")]]
  files.remove(os.path.join(folder, "x.npz"))
  return seen + [files.glob(f"{folder}/*"), files.errors()]


def test_python_files_do_what_tensorflows_do(tmp_path, monkeypatch):
  with_tf = _file_ops(str(tmp_path / "tf"))
  monkeypatch.setattr(files, "tensorflow_installed", lambda: False)
  without = _file_ops(str(tmp_path / "python"))
  assert with_tf[:-1] == without[:-1] == [
      "one\ntwo\n", False, True, ["x.npz"], []]
  assert with_tf[-1] == (tf.errors.OpError, OSError)
  assert without[-1] == (OSError,)


def test_the_state_file_names_the_latest_checkpoint_without_tensorflow(
    tmp_path, without_tensorflow):
  del without_tensorflow
  assert paths.latest(str(tmp_path)) is None
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(v=tf.Variable(1.0)), str(tmp_path), max_to_keep=3)
  for step in (5, 10):
    manager.save(checkpoint_number=step)
  assert paths.latest(str(tmp_path)) == (
      tf.train.latest_checkpoint(str(tmp_path))) == f"{tmp_path}/ckpt-10"


def test_npz_checkpoints_are_listed_by_step_not_by_name(tmp_path):
  for name in ("ckpt-9.npz", "ckpt-10.npz", "ckpt-10.npz.partial",
               "ckpt-x.npz", "checkpoint"):
    (tmp_path / name).write_bytes(b"")
  assert paths.npz_checkpoints(str(tmp_path)) == [
      f"{tmp_path}/ckpt-9.npz", f"{tmp_path}/ckpt-10.npz"]
  assert paths.latest(str(tmp_path)) == f"{tmp_path}/ckpt-10.npz"
  assert [paths.step_of(p) for p in (
      "d/ckpt-10.npz", "d/ckpt-7", "d/ckpt-x")] == [10, 7, -1]


def test_the_retried_write_errors_are_tensorflows_codes():
  assert storage.WRITE_RETRIED == {tf.errors.UNAVAILABLE,
                                   tf.errors.DEADLINE_EXCEEDED,
                                   tf.errors.ABORTED}


def test_the_retried_read_errors_are_tensorflows_codes():
  assert storage.READ_RETRIED == {
      tf.errors.UNAVAILABLE, tf.errors.DEADLINE_EXCEEDED, tf.errors.ABORTED,
      tf.errors.RESOURCE_EXHAUSTED, tf.errors.INTERNAL}
