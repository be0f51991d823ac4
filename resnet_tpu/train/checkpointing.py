"""Checkpoint restore, save and resume (README "Reliability").

A checkpoint holds the model, the optimizer (slots and step) and
`input_batches`, the global batches read from the training input, so a
resumed run reads exactly the batches the interrupted one would have read
next. tf.train.CheckpointManager writes the `checkpoint` state file only
after a checkpoint's data files, so a save cut short leaves the previous
checkpoint as the latest. A checkpoint whose files cannot be read (bit rot, a
partial copy) is moved aside into `damaged/` and the newest intact one is
restored instead.
"""
import os

from absl import logging
import keras
import tensorflow as tf

from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig

DAMAGED_DIR = "damaged"


def worker_checkpoint_dir(model_dir: str, strategy: tf.distribute.Strategy,
                          chief: bool) -> str:
  """model_dir on the chief; a scratch folder of model_dir on other workers,
  which take part in saving but keep no files of their own."""
  if chief:
    return model_dir
  task = strategy.cluster_resolver.task_id
  return os.path.join(model_dir, f".worker_{task}_scratch")


class Checkpoints:
  """The run's checkpoints in `model_dir` (a scratch folder on non-chief
  workers, which take part in saving without keeping the files)."""

  def __init__(self, cfg: TrainConfig, model: keras.Model,
               optimizer: keras.optimizers.Optimizer,
               input_batches: tf.Variable, directory: str, chief: bool):
    self.cfg = cfg
    self.optimizer = optimizer
    self.input_batches = input_batches
    self.directory = directory
    self.chief = chief
    self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                          input_batches=input_batches)
    self.manager = self._manager()

  def _manager(self) -> tf.train.CheckpointManager:
    return tf.train.CheckpointManager(self.checkpoint, self.directory,
                                      max_to_keep=self.cfg.keep_checkpoints)

  def latest(self) -> str | None:
    return tf.train.latest_checkpoint(self.cfg.model_dir)

  def save(self) -> str:
    path = self.manager.save(checkpoint_number=self.optimizer.iterations)
    if self.chief:
      logging.info("Saved checkpoint %s", path)
    return path

  def restore(self) -> str | None:
    """Restores the newest intact checkpoint of model_dir; returns its path
    (None: nothing to restore, a fresh run).

    Raises ConfigError when the checkpoints belong to another network, or
    when every checkpoint is damaged.
    """
    candidates = self._candidates()
    damaged = []
    for path in candidates:
      try:
        self.checkpoint.restore(path).assert_existing_objects_matched()
      except Exception as e:  # pylint: disable=broad-except
        unreadable = _read_error(path)
        if unreadable:
          damaged.append(path)
          logging.warning("Checkpoint %s cannot be read (%s); trying the "
                          "previous one.", path, unreadable)
          continue
        if not isinstance(e, (AssertionError, ValueError,
                              tf.errors.OpError)):
          raise
        raise ConfigError(
            f"--model_dir={self.cfg.model_dir!r}: cannot restore {path} into "
            f"this run (--resnet_depth={self.cfg.resnet_depth}, "
            f"--num_classes={self.cfg.num_classes}, --optimizer="
            f"{self.cfg.optimizer}): {_first_line(e)}\nIf another network "
            "wrote it, use a new --model_dir or that run's flags (its "
            "config.json).") from e
      if damaged:
        self._set_aside(damaged, path, candidates)
      return path
    if damaged:
      raise ConfigError(
          f"--model_dir={self.cfg.model_dir!r}: every checkpoint is damaged "
          f"({', '.join(damaged)}). Start over with a new --model_dir, or "
          "remove the damaged checkpoints' files (ckpt-N.index and "
          "ckpt-N.data-*) and the 'checkpoint' file to train from scratch "
          "there.")
    return None

  def _candidates(self) -> list[str]:
    """The checkpoints of the state file, newest first."""
    state = tf.train.get_checkpoint_state(self.cfg.model_dir)
    if not state or not state.model_checkpoint_path:
      return []
    paths = list(state.all_model_checkpoint_paths) or [
        state.model_checkpoint_path]
    paths = [p if os.path.isabs(p) or "://" in p
             else os.path.join(self.cfg.model_dir, p) for p in paths]
    return sorted(paths, key=_number, reverse=True)

  def _set_aside(self, damaged: list[str], restored: str,
                 candidates: list[str]) -> None:
    """Moves the damaged checkpoints' files to damaged/ (kept for a look)
    and makes `restored` the latest, so the next save cannot overwrite or
    resume from them."""
    if self.chief:
      aside = os.path.join(self.cfg.model_dir, DAMAGED_DIR)
      tf.io.gfile.makedirs(aside)
      for path in damaged:
        for name in tf.io.gfile.glob(path + ".*"):
          tf.io.gfile.rename(name, os.path.join(aside,
                                                os.path.basename(name)),
                             overwrite=True)
      intact = [p for p in candidates if p not in damaged]
      tf.compat.v1.train.update_checkpoint_state(
          self.cfg.model_dir, restored,
          all_model_checkpoint_paths=sorted(intact, key=_number))
      logging.warning("Restored %s instead; the damaged checkpoint files "
                      "are kept in %s.", restored, aside)
    self.manager = self._manager()


def _read_error(path: str) -> str:
  """Why the checkpoint files of `path` cannot be read ("" if they can):
  a truncated or missing index or data file, bit rot. Read only after a
  restore failed, to tell damage from another network's checkpoint."""
  try:
    reader = tf.train.load_checkpoint(path)
    for name in reader.get_variable_to_shape_map():
      reader.get_tensor(name)
  except Exception as e:  # pylint: disable=broad-except
    return f"{type(e).__name__}: {_first_line(e)}"
  return ""


def _number(path: str) -> int:
  """N of a checkpoint path ending in -N."""
  tail = path.rsplit("-", 1)[-1]
  return int(tail) if tail.isdigit() else -1


def _first_line(error: Exception) -> str:
  message = getattr(error, "message", None) or str(error)
  return message.split("\n", 1)[0]  # Keras appends the whole variable
