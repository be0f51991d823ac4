"""Checkpoint restore, save and resume (docs/reliability.md).

A checkpoint holds the model, the optimizer (slots and step) and
`input_batches`, the global batches read from the training input, so a
resumed run reads exactly the batches the interrupted one would have read
next. tf.train.CheckpointManager writes the `checkpoint` state file only
after a checkpoint's data files, so a save cut short leaves the previous
checkpoint as the latest.

Restore tells damage from a storage hiccup. Only a checksum or framing error
(DataLossError), or a file the index lists that is truncated or missing,
is damage: that checkpoint is moved aside into its own folder of `damaged/`
(never over an earlier one) and the newest intact one is restored instead.
An error that may pass (a bucket's 503, a deadline: storage.READ_RETRIED)
is retried with a bounded backoff; if it persists the run stops naming the
checkpoint and the error, and moves nothing. Each worker restores on its
own, so all then compare what they restored (`check_workers_agree`).
"""
import os
from typing import Sequence

from absl import logging
import keras
import tensorflow as tf

from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from resnet_tpu.train.checkpoints import paths
from resnet_tpu.train.checkpoints import storage

# What damaged files raise: a checksum or framing error, a truncated or
# missing file. The reader reports an index cut short ("not an sstable (bad
# magic number)") as UNKNOWN.
DAMAGE_CODES = frozenset({tf.errors.DATA_LOSS, tf.errors.NOT_FOUND,
                          tf.errors.OUT_OF_RANGE, tf.errors.UNKNOWN})
# Seconds between the attempts at a read that failed with an error that may
# pass (storage.read_retried), and at a save (storage.written).
RETRY_DELAYS_S = storage.RETRY_DELAYS_S


class RestoreMismatch(ConfigError):
  """Workers restored different steps or input positions."""


def check_workers_agree(strategy: tf.distribute.Strategy, step: int,
                        input_batches: int) -> None:
  """Raises RestoreMismatch on every worker when the workers restored
  different steps or input positions; call on every worker together,
  before any training step.

  A worker that fell back to an older checkpoint (damage only it saw, a
  stale copy of model_dir) would train on with other weights, LR and
  input. One all-gather of (task, step, input_batches) shows each worker
  every pair, so all stop with the same message.
  """
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return
  mine = tf.constant([[strategy.cluster_resolver.task_id, step,
                       input_batches]], tf.int64)
  restored = strategy.gather(
      strategy.experimental_distribute_values_from_function(lambda _: mine),
      axis=0).numpy()
  message = restore_disagreement(
      {int(t): (int(s), int(i)) for t, s, i in restored})
  if message:
    raise RestoreMismatch(message)


def restore_disagreement(by_task: dict[int, tuple[int, int]]) -> str | None:
  """What differs in task -> (step, input_batches) restored, naming both
  sides and what to do; None when every worker restored the same."""
  if len(set(by_task.values())) == 1:
    return None
  steps = sorted({s for s, _ in by_task.values()}, reverse=True)
  inputs = sorted({i for _, i in by_task.values()}, reverse=True)
  differ = (f"steps {_listed(steps)}" if len(steps) > 1 else
            f"step {steps[0]}, input at global batches {_listed(inputs)}")
  return (
      f"worker restores disagree: {differ} ("
      + "; ".join(f"worker {t}: step {s}, input at global batch {i}"
                  for t, (s, i) in sorted(by_task.items())) +
      "). Stopped before any training step. Every worker must restore the "
      "same checkpoint: give all the same --model_dir, and see each "
      "worker's warnings for a checkpoint it found damaged; then run the "
      "same command again.")


def worker_checkpoint_dir(model_dir: str, strategy: tf.distribute.Strategy,
                          chief: bool) -> str:
  """model_dir on the chief; a scratch folder of model_dir on other workers,
  which take part in saving but keep no files of their own."""
  if chief:
    return model_dir
  task = strategy.cluster_resolver.task_id
  return os.path.join(model_dir, f".worker_{task}_scratch")


def weights_module(trainable: Sequence, non_trainable: Sequence
                   ) -> tf.Module:
  """A network's weights as a JAX run checkpoints them
  (engines/jax/tf_checkpoints.py): two lists, in the Keras model's variable
  order."""
  module = tf.Module()
  module.trainable = list(trainable)
  module.non_trainable = list(non_trainable)
  return module


class Checkpoints:
  """The run's checkpoints in `model_dir` (a scratch folder on non-chief
  workers, which take part in saving without keeping the files)."""

  def __init__(self, cfg: TrainConfig, model: keras.Model,
               optimizer: keras.optimizers.Optimizer,
               input_batches: tf.Variable, directory: str, chief: bool,
               loss_scale: tf.Module | None = None):
    """loss_scale: float16's dynamic loss scale, saved with the rest."""
    self.cfg = cfg
    self.optimizer = optimizer
    self.input_batches = input_batches
    self.directory = directory
    self.chief = chief
    self.retry_delays_s = RETRY_DELAYS_S
    extra = {"loss_scale": loss_scale} if loss_scale is not None else {}
    self.checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer,
                                          input_batches=input_batches,
                                          **extra)
    self.manager = self._manager()

  def _manager(self) -> tf.train.CheckpointManager:
    return tf.train.CheckpointManager(self.checkpoint, self.directory,
                                      max_to_keep=self.cfg.run.keep_checkpoints)

  def latest(self) -> str | None:
    return tf.train.latest_checkpoint(self.cfg.model_dir)

  def save(self) -> str:
    """Saves a checkpoint; storage.StorageError when it cannot be written
    (the previous checkpoint stays the latest)."""
    path = storage.written(
        "a checkpoint", self.directory, self.cfg.model_dir,
        lambda: self.manager.save(checkpoint_number=self.optimizer.iterations),
        self.retry_delays_s)
    if self.chief:
      logging.info("Saved checkpoint %s", path)
    return path

  def restore(self) -> str | None:
    """Restores the newest intact checkpoint of model_dir; returns its path
    (None: nothing to restore, a fresh run).

    Raises ConfigError when the checkpoints belong to another network or
    every checkpoint is damaged, storage.CheckpointUnavailable when a
    transient error outlasts its retries.
    """
    candidates = self._candidates()
    damaged = []
    for path in candidates:
      error = self._retried(
          path, lambda p=path: self.checkpoint.restore(
              p).assert_existing_objects_matched())
      if error is None:
        if damaged:
          self._set_aside(damaged, path, candidates)
        return path
      missing = _missing_files(path)
      if not missing and not _is_damage(error):
        # Another network's checkpoint, or damage the restore hid.
        error = self._retried(path, lambda p=path: _read_all(p)) or error
      if missing or _is_damage(error):
        damaged.append(path)
        logging.warning("Checkpoint %s is damaged (%s); trying the previous "
                        "one.", path, f"missing {', '.join(missing)}"
                        if missing else
                        f"{type(error).__name__}: {_first_line(error)}")
        continue
      if not isinstance(error, (AssertionError, ValueError,
                                tf.errors.OpError)):
        raise error
      raise ConfigError(
          f"--model_dir={self.cfg.model_dir!r}: cannot restore {path} into "
          f"this run (--resnet_depth={self.cfg.model.resnet_depth}, "
          f"--num_classes={self.cfg.model.num_classes}, --optimizer="
          f"{self.cfg.optim.optimizer}): {_first_line(error)}\nIf another "
          "network wrote it, use a new --model_dir or that run's flags (its "
          "config.json).") from error
    if damaged:
      raise ConfigError(
          f"--model_dir={self.cfg.model_dir!r}: every checkpoint is damaged "
          f"({', '.join(damaged)}: a checksum error or a truncated or "
          "missing file). Start over with a new --model_dir, or move those "
          "checkpoints' files (ckpt-N.index, ckpt-N.data-*) and the "
          "'checkpoint' file out of it to train from scratch there.")
    return None

  def _retried(self, path: str, read) -> Exception | None:
    """storage.read_retried over `retry_delays_s`."""
    return storage.read_retried(path, self.cfg.model_dir, read,
                                self.retry_delays_s)

  def _candidates(self) -> list[str]:
    """The checkpoints of the state file, newest first."""
    state = tf.train.get_checkpoint_state(self.cfg.model_dir)
    if not state or not state.model_checkpoint_path:
      return []
    found = list(state.all_model_checkpoint_paths) or [
        state.model_checkpoint_path]
    return sorted(map(self._absolute, found), key=paths.step_of,
                  reverse=True)

  def _absolute(self, path: str) -> str:
    return (path if os.path.isabs(path) or "://" in path
            else os.path.join(self.cfg.model_dir, path))

  def _set_aside(self, damaged: list[str], restored: str,
                 candidates: list[str]) -> None:
    """Moves each damaged checkpoint's files into a folder of its own in
    damaged/ (kept for a look, never over an earlier one) and makes
    `restored` the latest, so the next save cannot overwrite or resume from
    them."""
    if self.chief:
      for path in damaged:
        aside = paths.free_folder(os.path.join(
            self.cfg.model_dir, paths.DAMAGED_DIR,
            os.path.basename(path)))
        tf.io.gfile.makedirs(aside)
        for name in tf.io.gfile.glob(path + ".*"):
          tf.io.gfile.rename(name, os.path.join(aside,
                                                os.path.basename(name)))
        logging.warning("Restored %s instead; the damaged checkpoint's "
                        "files are kept in %s.", restored, aside)
      state = tf.train.get_checkpoint_state(self.cfg.model_dir)
      # With their save times, so the manager keeps managing (and
      # rotating) them.
      times = dict(zip(map(self._absolute, state.all_model_checkpoint_paths),
                       state.all_model_checkpoint_timestamps))
      intact = sorted((p for p in candidates if p not in damaged),
                      key=paths.step_of)
      tf.compat.v1.train.update_checkpoint_state(
          self.cfg.model_dir, restored, all_model_checkpoint_paths=intact,
          all_model_checkpoint_timestamps=[times[p] for p in intact
                                           if p in times] or None)
    self.manager = self._manager()


def _listed(values: list[int]) -> str:
  """"10 and 5", "10, 5 and 3"."""
  return ", ".join(map(str, values[:-1])) + f" and {values[-1]}"


def _code(error: Exception) -> int | None:
  return error.error_code if isinstance(error, tf.errors.OpError) else None


def _is_damage(error: Exception) -> bool:
  """A checksum or framing error, a truncated or missing file (the reader
  raises IndexError "Read less bytes than requested" for a data file cut
  short)."""
  return _code(error) in DAMAGE_CODES or isinstance(error, IndexError)


def _missing_files(path: str) -> list[str]:
  """The files of checkpoint `path` that its index lists and that are not
  there (the reader says UNKNOWN for them, not NOT_FOUND)."""
  if not tf.io.gfile.exists(path + ".index"):
    return [path + ".index"]
  shards = tf.io.gfile.glob(path + ".data-*-of-*")
  total = int(shards[0].rsplit("-of-", 1)[1]) if shards else 1
  listed = [f"{path}.data-{i:05d}-of-{total:05d}" for i in range(total)]
  return [f for f in listed if not tf.io.gfile.exists(f)]


def _read_all(path: str) -> None:
  """Reads every tensor of checkpoint `path`: raises what its files
  raise. Called only after a restore failed, to tell damage from another
  network's checkpoint."""
  reader = tf.train.load_checkpoint(path)
  for name in reader.get_variable_to_shape_map():
    reader.get_tensor(name)


def _first_line(error: Exception) -> str:
  message = getattr(error, "message", None) or str(error)
  return message.split("\n", 1)[0]  # Keras appends the whole variable
