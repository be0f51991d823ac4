"""The run's files on either engine, with TensorFlow or without it.

TensorFlow's file systems where TensorFlow is installed: tf.io.gfile reads
and writes local paths, gs:// and every file system TensorFlow has, so the
model_dir and the data may live in a bucket. A JAX run on a machine
without TensorFlow (a GPU image with JAX alone: docs/jax.md)
writes its model_dir with Python's `open` and `os`: local paths only, which
config.validate checks before start-up.
"""
import functools
import glob as glob_lib
import importlib.util
import os
from typing import IO


@functools.cache
def tensorflow_installed() -> bool:
  """Whether this process can import TensorFlow (asked once: finding it
  does not load it)."""
  return importlib.util.find_spec("tensorflow") is not None


def _gfile():
  """tf.io.gfile, or None without TensorFlow."""
  if not tensorflow_installed():
    return None
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile


def is_remote(path: str) -> bool:
  """A path of a file system other than the local one (gs://, s3://...)."""
  return "://" in path


def errors() -> tuple[type[Exception], ...]:
  """What a failed read or write raises: OSError, and TensorFlow's
  OpError where TensorFlow does the writing."""
  if not tensorflow_installed():
    return (OSError,)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return (tf.errors.OpError, OSError)


def exists(path: str) -> bool:
  gfile = _gfile()
  return gfile.exists(path) if gfile else os.path.exists(path)


def isdir(path: str) -> bool:
  gfile = _gfile()
  return gfile.isdir(path) if gfile else os.path.isdir(path)


def makedirs(path: str) -> None:
  gfile = _gfile()
  if gfile:
    gfile.makedirs(path)
  else:
    os.makedirs(path, exist_ok=True)


def open_file(path: str, mode: str = "r") -> IO:
  """`path` opened in `mode` ("r", "w", "a", "rb", "wb")."""
  gfile = _gfile()
  if gfile:
    return gfile.GFile(path, mode)
  return open(path, mode, encoding=None)  # pylint: disable=unspecified-encoding


def glob(pattern: str) -> list[str]:
  gfile = _gfile()
  return sorted(gfile.glob(pattern) if gfile else glob_lib.glob(pattern))


def rename(source: str, target: str) -> None:
  """Moves `source` to `target`, replacing it if it exists (one rename on
  a local disk: a reader sees the old file or the new, never a part)."""
  gfile = _gfile()
  if gfile:
    gfile.rename(source, target, overwrite=True)
  else:
    os.replace(source, target)


def remove(path: str) -> None:
  gfile = _gfile()
  if gfile:
    gfile.remove(path)
  else:
    os.remove(path)
