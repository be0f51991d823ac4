"""Where a run's checkpoints are, in either store's format.

TensorFlow's checkpoints (tf_files.py, and a JAX run's twins of them:
engines/jax/tf_checkpoints.py) are ckpt-<step>.index and .data-* files, listed
by the `checkpoint` state file. A JAX run without TensorFlow writes the numpy
store's ckpt-<step>.npz files (engines/jax/npz_checkpoints.py). A model_dir
holds the format its run started with.
"""
import io
import os
import re

import numpy as np

from resnet_tpu import files

NPZ_SUFFIX = ".npz"
STATE_FILE = "checkpoint"
# Where damaged checkpoints are set aside, each in a folder of its own.
DAMAGED_DIR = "damaged"
# The state file's newest entry, read as text where TensorFlow is absent.
_STATE_LATEST = re.compile(r'^model_checkpoint_path:\s*"(.*)"\s*$', re.M)


def step_of(path: str) -> int:
  """N of ckpt-N or ckpt-N.npz; -1 for another name."""
  stem = path[:-len(NPZ_SUFFIX)] if path.endswith(NPZ_SUFFIX) else path
  tail = stem.rsplit("-", 1)[-1]
  return int(tail) if tail.isdigit() else -1


def npz_key(group: str, index: int) -> str:
  """The name of a TrainState group's `index`th array in an .npz checkpoint
  (group: trainable, non_trainable or optimizer)."""
  return f"{group}_{index}"


def read_npz(path: str) -> dict[str, np.ndarray]:
  """Every array of the .npz checkpoint `path`, each read whole (its
  CRC-32 checked: a damaged file raises zipfile.BadZipFile)."""
  with files.open_file(path, "rb") as f:
    data = f.read()
  with np.load(io.BytesIO(data), allow_pickle=False) as saved:
    return {name: saved[name] for name in saved.files}


def npz_checkpoints(model_dir: str) -> list[str]:
  """The numpy store's checkpoints in `model_dir`, oldest first."""
  found = files.glob(os.path.join(model_dir, f"ckpt-*{NPZ_SUFFIX}"))
  return sorted((p for p in found if step_of(p) >= 0), key=step_of)


def tensorflow_latest(model_dir: str) -> str | None:
  """The newest TensorFlow checkpoint its state file names (without
  TensorFlow: the name alone, its files unchecked)."""
  if files.tensorflow_installed():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    return tf.train.latest_checkpoint(model_dir)
  state = os.path.join(model_dir, STATE_FILE)
  if not files.exists(state):
    return None
  with files.open_file(state) as f:
    found = _STATE_LATEST.search(f.read())
  if not found:
    return None
  path = found.group(1)
  return path if os.path.isabs(path) else os.path.join(model_dir, path)


def latest(model_dir: str) -> str | None:
  """The newest checkpoint of `model_dir` in either format; None if it
  has none."""
  npz = npz_checkpoints(model_dir)
  return npz[-1] if npz else tensorflow_latest(model_dir)


def free_folder(path: str) -> str:
  """`path`, or `path`.2, .3, ... : the first that does not exist (a
  damaged checkpoint never lands on an earlier one)."""
  candidate, n = path, 1
  while files.exists(candidate):
    n += 1
    candidate = f"{path}.{n}"
  return candidate
