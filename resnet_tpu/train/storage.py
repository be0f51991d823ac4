"""Writes to the model_dir that fail end the run in one line (issue 37).

A checkpoint, a metrics record, config.json or the export can fail to write:
a full disk, a model_dir removed or made unwritable, a bucket that stops
answering. Errors that may pass (a bucket's 503, a deadline: WRITE_RETRIED)
are retried with the restore path's backoff (checkpointing.RETRY_DELAYS_S);
any other, or one that outlasts the retries, raises StorageError: one line
naming what was written, where, the error and the last good checkpoint.
tf.train.CheckpointManager writes a checkpoint's state file only after its
data, so a save that fails leaves the previous checkpoint the latest.
"""
import time
from typing import Callable, Sequence, TypeVar

from absl import logging

from resnet_tpu import files
from resnet_tpu.train import checkpoint_paths

T = TypeVar("T")
# tf.errors' UNAVAILABLE, DEADLINE_EXCEEDED and ABORTED (the canonical codes
# of tensorflow/core/protobuf/error_codes.proto), named here so that a run
# without TensorFlow (files.py) can use this module.
WRITE_RETRIED = frozenset({14, 4, 10})
RETRY_DELAYS_S = (1.0, 4.0, 15.0, 60.0)


class StorageError(Exception):
  """A write to the run's storage failed for good; main.py prints it."""

  def __init__(self, what: str, path: str, error: Exception, model_dir: str):
    self.what, self.path, self.error = what, path, error
    self.model_dir = model_dir
    super().__init__(what)

  def __str__(self) -> str:
    try:
      last = (checkpoint_paths.latest(self.model_dir)
              or "none (no checkpoint is readable in the model_dir)")
    except files.errors():
      last = "unknown (the model_dir cannot be read)"
    return (f"Writing {self.what} to {self.path} failed: "
            f"{type(self.error).__name__}: {first_line(self.error)}. The "
            f"last good checkpoint is {last}; fix the storage (space, "
            "permissions, the bucket), then run the same command to resume "
            "from it.")


def first_line(error: Exception) -> str:
  text = getattr(error, "message", None) or str(error)
  return text.strip().splitlines()[0] if text.strip() else repr(error)


def written(what: str, path: str, model_dir: str, write: Callable[[], T],
            delays_s: Sequence[float] = RETRY_DELAYS_S) -> T:
  """Returns write(), retried after WRITE_RETRIED errors; raises
  StorageError for any other storage error, or one that persists."""
  for delay in (*delays_s, None):
    try:
      return write()
    except files.errors() as error:
      code = getattr(error, "error_code", None)
      if code not in WRITE_RETRIED or delay is None:
        raise StorageError(what, path, error, model_dir) from error
      logging.warning("Writing %s to %s failed (%s: %s); retrying in %g s.",
                      what, path, type(error).__name__, first_line(error),
                      delay)
      time.sleep(delay)
  raise AssertionError("unreachable")
