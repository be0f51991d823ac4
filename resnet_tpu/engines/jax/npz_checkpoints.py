"""The JAX engine's checkpoint store without TensorFlow: a .npz per save.

A JAX run's TrainState (engines/jax/step.py) is three lists of arrays: the
model's trainable and non-trainable variables, in the Keras model's order, and
the optimizer's variables (`iterations` among them). Where TensorFlow is
installed, engines/jax/tf_checkpoints.py saves them as TensorFlow checkpoints;
where it is not (a GPU image with JAX alone), ckpt-<step>.npz in the model_dir
holds them as `<group>_<index>` arrays, with `input_batches`, the input
position. What TensorFlow's store gives a run, this one gives too:
- a checkpoint is whole or absent: it is written under a temporary name
  and renamed, so a save cut short leaves the previous one the latest;
- the newest --keep_checkpoints stay;
- a file that cannot be read whole (not a zip, cut short, a checksum
  error) is damaged: it is moved to damaged/ and named, and the one before
  it restores; every one damaged is a ConfigError, as is a checkpoint of
  another network (other variables or shapes);
- a failed write ends the run in one line (storage.written); a read that
  fails with an error that may pass is retried, then stops the run in one
  line, moving nothing (storage.read_retried).
Process 0 writes (engines/jax/processes.py); every process reads.
"""
import io
import os
import zipfile
import zlib

from absl import logging
import jax
import numpy as np

from resnet_tpu import files
from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from resnet_tpu.train.checkpoints import paths
from resnet_tpu.train.checkpoints import storage
from resnet_tpu.engines.jax.state import TrainState

INPUT_KEY = "input_batches"
# What reading a damaged .npz raises: not a zip or cut short (BadZipFile,
# EOFError), a checksum or deflate error (BadZipFile, zlib.error), a member
# that is not an array (ValueError).
DAMAGE = (zipfile.BadZipFile, EOFError, zlib.error, ValueError)


class NpzCheckpoints:
  """Saves and restores a JAX run's TrainState and input position as
  ckpt-<step>.npz files of cfg.model_dir."""

  def __init__(self, cfg: TrainConfig, template: TrainState,
               step_index: int, chief: bool = True):
    """template: a state of this run's network (the shapes it restores);
    step_index: the optimizer's `iterations` in state.optimizer."""
    self.cfg = cfg
    self.directory = cfg.model_dir
    self.chief = chief
    self._shapes = {paths.npz_key(group, i): np.shape(value)
                    for group, values in zip(TrainState._fields, template)
                    for i, value in enumerate(values)}
    self._counts = [len(values) for values in template]
    self._step_index = step_index
    self.retry_delays_s = storage.RETRY_DELAYS_S  # of a read (tests: 0)

  def latest(self) -> str | None:
    found = paths.npz_checkpoints(self.directory)
    return found[-1] if found else None

  def save(self, state: TrainState, input_batches: int) -> str:
    """Writes `state` and the input position (process 0); returns the
    checkpoint's path on every process."""
    step = int(jax.device_get(state.optimizer[self._step_index]))
    path = os.path.join(self.directory,
                        f"ckpt-{step}{paths.NPZ_SUFFIX}")
    if not self.chief:
      return path
    arrays = {paths.npz_key(group, i): np.asarray(value)
              for group, values in zip(TrainState._fields,
                                       jax.device_get(state))
              for i, value in enumerate(values)}
    arrays[INPUT_KEY] = np.asarray(input_batches, np.int64)
    storage.written("a checkpoint", path, self.directory,
                    lambda: self._write(path, arrays))
    logging.info("Saved checkpoint %s", path)
    self._rotate()
    return path

  def _write(self, path: str, arrays: dict[str, np.ndarray]) -> None:
    """Writes the file whole, in one call (a zip is built by seeking back,
    which TensorFlow's file systems do not offer for writing)."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    files.makedirs(self.directory)
    partial = path + ".partial"
    with files.open_file(partial, "wb") as f:
      f.write(buffer.getvalue())
    files.rename(partial, path)

  def _rotate(self) -> None:
    """Removes all but the newest --keep_checkpoints."""
    found = paths.npz_checkpoints(self.directory)
    for path in found[:-self.cfg.run.keep_checkpoints]:
      storage.written("the removal of an old checkpoint", path,
                      self.directory, lambda p=path: files.remove(p))

  def restore(self) -> tuple[str | None, TrainState | None, int]:
    """The newest intact checkpoint: its path, state and input position
    (None, None, 0 for a fresh run)."""
    damaged = []
    for path in reversed(paths.npz_checkpoints(self.directory)):
      read = []
      error = storage.read_retried(
          path, self.directory,
          lambda p=path: read.append(paths.read_npz(p)),
          self.retry_delays_s)
      if isinstance(error, DAMAGE):
        damaged.append(path)
        logging.warning("Checkpoint %s is damaged (%s: %s); trying the "
                        "previous one.", path, type(error).__name__,
                        storage.first_line(error))
        continue
      if error is not None:
        raise error
      arrays = read[0]
      state = self._state(path, arrays)
      if damaged:
        self._set_aside(damaged, path)
      return path, state, int(arrays[INPUT_KEY])
    if damaged:
      raise ConfigError(
          f"--model_dir={self.directory!r}: every checkpoint is damaged "
          f"({', '.join(damaged)}: not a whole .npz file). Start over with "
          "a new --model_dir, or move those files out of it to train from "
          "scratch there.")
    return None, None, 0

  def _state(self, path: str, arrays: dict[str, np.ndarray]) -> TrainState:
    """`arrays` as this run's TrainState; ConfigError if another network
    wrote them."""
    found = {k: v.shape for k, v in arrays.items() if k != INPUT_KEY}
    if found != self._shapes or INPUT_KEY not in arrays:
      differ = sorted(set(found.items()) ^ set(self._shapes.items()))[:3]
      raise ConfigError(
          f"--model_dir={self.directory!r}: cannot restore {path} into this "
          f"run (--resnet_depth={self.cfg.model.resnet_depth}, "
          f"--num_classes={self.cfg.model.num_classes}, --optimizer="
          f"{self.cfg.optim.optimizer}): its arrays differ (e.g. {differ}). "
          "If another network wrote it, use a new --model_dir or that run's "
          "flags (its config.json).")
    return TrainState(*([arrays[paths.npz_key(group, i)]
                         for i in range(count)]
                        for group, count in zip(TrainState._fields,
                                                self._counts)))

  def _set_aside(self, damaged: list[str], restored: str) -> None:
    """Moves each damaged checkpoint into a folder of its own in damaged/,
    so the next save cannot resume from it."""
    if not self.chief:
      return
    for path in damaged:
      aside = paths.free_folder(os.path.join(
          self.directory, paths.DAMAGED_DIR,
          os.path.basename(path)))
      files.makedirs(aside)
      files.rename(path, os.path.join(aside, os.path.basename(path)))
      logging.warning("Restored %s instead; the damaged checkpoint is kept "
                      "in %s.", restored, aside)

