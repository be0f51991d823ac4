"""Writes to the model_dir that fail end the run in one line (issue 37);
reads of a checkpoint that fail for a while are retried.

A checkpoint, a metrics record, config.json or the export can fail to write:
a full disk, a model_dir removed or made unwritable, a bucket that stops
answering. Errors that may pass (a bucket's 503, a deadline: WRITE_RETRIED)
are retried with the restore path's backoff (tf_files.RETRY_DELAYS_S);
any other, or one that outlasts the retries, raises StorageError: one line
naming what was written, where, the error and the last good checkpoint.
tf.train.CheckpointManager writes a checkpoint's state file only after its
data, so a save that fails leaves the previous checkpoint the latest.
Reading a checkpoint retries READ_RETRIED errors with the same backoff and
then stops with CheckpointUnavailable, for either engine's store.
"""
import time
from typing import Callable, Sequence, TypeVar

from absl import logging

from resnet_tpu import files
from resnet_tpu.config import ConfigError
from resnet_tpu.train.checkpoints import paths

T = TypeVar("T")
# tf.errors' UNAVAILABLE, DEADLINE_EXCEEDED and ABORTED (the canonical codes
# of tensorflow/core/protobuf/error_codes.proto), named here so that a run
# without TensorFlow (files.py) can use this module.
WRITE_RETRIED = frozenset({14, 4, 10})
# A read also retries RESOURCE_EXHAUSTED and INTERNAL (a bucket's 429 and
# 500); a write does not, as it may have left part of a file.
READ_RETRIED = WRITE_RETRIED | {8, 13}
RETRY_DELAYS_S = (1.0, 4.0, 15.0, 60.0)


class CheckpointUnavailable(ConfigError):
  """A checkpoint stayed unreadable through every retry of an error that
  may be transient; nothing was moved."""


class StorageError(Exception):
  """A write to the run's storage failed for good; main.py prints it."""

  def __init__(self, what: str, path: str, error: Exception, model_dir: str):
    self.what, self.path, self.error = what, path, error
    self.model_dir = model_dir
    super().__init__(what)

  def __str__(self) -> str:
    try:
      last = (paths.latest(self.model_dir)
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


def read_retried(path: str, model_dir: str, read: Callable[[], object],
                 delays_s: Sequence[float] = RETRY_DELAYS_S
                 ) -> Exception | None:
  """Calls `read` (of the checkpoint `path`) until it raises no
  READ_RETRIED error; returns what else it raised (None: it succeeded).
  Raises CheckpointUnavailable when the error outlasts every delay."""
  for delay in (*delays_s, None):
    try:
      read()
      return None
    except Exception as e:  # pylint: disable=broad-except
      if getattr(e, "error_code", None) not in READ_RETRIED:
        return e
      if delay is None:
        raise CheckpointUnavailable(
            f"--model_dir={model_dir!r}: cannot read checkpoint {path}: "
            f"{type(e).__name__}: {first_line(e)} (tried "
            f"{len(delays_s) + 1} times). This error may be transient "
            "(storage unavailable or overloaded); nothing was moved or "
            "changed. Run the same command again once the storage "
            "answers.") from e
      logging.warning("Reading checkpoint %s failed (%s: %s); retrying in "
                      "%g s.", path, type(e).__name__, first_line(e), delay)
      time.sleep(delay)
  raise AssertionError("unreachable")


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
