"""The data's class list: synsets.txt beside the shards, one
`<class index>\t<synset or name>` line per class, written by
data/build_tfrecords.py. The pre-flight compares --num_classes with it;
evaluation and prediction print its names."""
import os

from resnet_tpu import files

SYNSETS_FILE = "synsets.txt"


def path(data_dir: str) -> str:
  """`data_dir`'s synsets.txt when it exists, else ""."""
  candidate = os.path.join(data_dir, SYNSETS_FILE) if data_dir else ""
  return candidate if candidate and files.exists(candidate) else ""


def read(data_dir: str) -> list[str] | None:
  """The class names of `data_dir` in class-index order, or None when it
  has no synsets.txt."""
  found = path(data_dir)
  if not found:
    return None
  with files.open_file(found) as f:
    return [line.split("\t", 1)[-1] for line in f.read().splitlines()
            if line.strip()]
