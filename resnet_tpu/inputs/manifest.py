"""manifest.json: what a folder of TFRecord shards should hold.

Written beside the shards by data/build_tfrecords.py, or by
`python -m data.verify_tfrecords --data_dir=D --write_manifest` for data that
has none (e.g. tensorflow/tpu imagenet_to_gcs.py output):

  {"splits": {"train": {"records": 1281167,
                        "files": {"train-00000-of-01024":
                                      {"bytes": 144703195, "records": 1252},
                                  ...}},
              "validation": {...}}}

File names are relative to the folder, so the folder can be copied (to
gs:// too) with its manifest. The pre-flight check compares the file sizes
with it (preflight.py); the input pipeline counts the records read from each
file against it (shard_audit.py); the training set size comes from it.
"""
import concurrent.futures
import json
import os
from typing import NamedTuple

import tensorflow as tf

from resnet_tpu.config import ConfigError

MANIFEST_FILE = "manifest.json"
# Files stat-ed at once: gs:// stats are round trips.
STAT_THREADS = 32
VERIFY_COMMAND = "python -m data.verify_tfrecords --data_dir={data_dir}"


class FileEntry(NamedTuple):
  bytes: int
  records: int


Split = dict[str, FileEntry]  # file name -> entry


def path(data_dir: str) -> str:
  return os.path.join(data_dir, MANIFEST_FILE)


def read(data_dir: str) -> dict[str, Split] | None:
  """split -> files of the manifest in `data_dir`; None when it has none."""
  if not tf.io.gfile.exists(path(data_dir)):
    return None
  with tf.io.gfile.GFile(path(data_dir)) as f:
    try:
      splits = json.load(f)["splits"]
      return {split: {name: FileEntry(entry["bytes"], entry["records"])
                      for name, entry in info["files"].items()}
              for split, info in splits.items()}
    except (ValueError, KeyError, TypeError) as e:
      raise ConfigError(
          f"{path(data_dir)} is not a manifest of data/build_tfrecords.py "
          f"({type(e).__name__}: {e}); delete it, or rewrite it with "
          f"`{VERIFY_COMMAND.format(data_dir=data_dir)} --write_manifest`"
      ) from e


def records(split: Split) -> int:
  return sum(entry.records for entry in split.values())


def write(data_dir: str, split: str, files: Split) -> str:
  """Sets `split` to `files` in the manifest of `data_dir`, keeping the
  other splits; returns the manifest's path."""
  splits = read(data_dir) or {}
  splits[split] = files
  text = json.dumps({"splits": {
      name: {"records": records(entries),
             "files": {f: entry._asdict() for f, entry in sorted(
                 entries.items())}}
      for name, entries in sorted(splits.items())}}, indent=1)
  partial = path(data_dir) + ".incomplete"
  with tf.io.gfile.GFile(partial, "w") as f:
    f.write(text + "\n")
  tf.io.gfile.rename(partial, path(data_dir), overwrite=True)
  return path(data_dir)


def file_sizes(paths: list[str]) -> dict[str, int]:
  """path -> size in bytes (-1 for a missing file), stat-ed in parallel."""
  def size(p: str) -> int:
    try:
      return tf.io.gfile.stat(p).length
    except tf.errors.NotFoundError:
      return -1

  with concurrent.futures.ThreadPoolExecutor(STAT_THREADS) as pool:
    return dict(zip(paths, pool.map(size, paths)))
