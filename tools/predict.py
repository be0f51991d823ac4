"""The top classes of photos under a trained network.

  python -m tools.predict --saved_model=E photo.jpg [more.jpg folder/ ...] \
      [--top_k=5] [--json_output=predictions.json]
  python -m tools.predict --model_dir=M [--checkpoint=C] photo.jpg ...

Every format training takes (data/build_tfrecords.IMAGE_EXTENSIONS: JPEG,
PNG, BMP, GIF) is read as training's records hold it: an RGB JPEG, others
re-encoded to JPEG exactly as build_tfrecords does (to_rgb_jpeg). Each then
goes through the export's `serve_jpeg`: the eval preprocessing of training
(the run's centre crop), so a photo scores as the in-training evaluation
would score it. A folder stands for the images in it (not its subfolders),
sorted. Class names come from the run's synsets.txt
(tools/evaluate.class_names). A file that does not decode is named with its
error and counted; the others are still classified.
"""
import json
import os
import sys

from absl import app
from absl import flags
from absl import logging
import numpy as np
import tensorflow as tf

if not __package__:  # run as a file: the repository's root on the path
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from data.build_tfrecords import IMAGE_EXTENSIONS
from data.build_tfrecords import to_rgb_jpeg
from tools import evaluate

FLAGS = flags.FLAGS
BATCH = 32


def image_paths(inputs: list[str]) -> list[str]:
  """Files as given, folders as their image files; ValueError names a path
  that does not exist or a folder without images."""
  paths = []
  for item in inputs:
    if tf.io.gfile.isdir(item):
      found = sorted(os.path.join(item, n) for n in tf.io.gfile.listdir(item)
                     if n.lower().endswith(IMAGE_EXTENSIONS))
      if not found:
        raise ValueError(f"{item} holds no image ({', '.join(IMAGE_EXTENSIONS)}"
                         ").")
      paths += found
    elif tf.io.gfile.exists(item):
      paths.append(item)
    else:
      raise ValueError(f"{item} does not exist.")
  if not paths:
    raise ValueError("Name at least one image file or folder of them.")
  return paths


def _top(probabilities: np.ndarray, names: list[str], k: int) -> list[dict]:
  order = np.argsort(-probabilities, kind="stable")[:k]
  return [{"class": int(i), "name": names[i],
           "probability": float(probabilities[i])} for i in order]


def _one(served: evaluate.Served, data: bytes) -> np.ndarray | str:
  """One image's probabilities, or its decoding error."""
  try:
    return served.serve_jpeg(
        image_bytes=tf.constant([data]))["probabilities"].numpy()[0]
  except tf.errors.InvalidArgumentError as error:
    return str(error).strip().splitlines()[0]


def as_training_jpeg(data: bytes) -> bytes:
  """`data` as training's records hold it (build_tfrecords.to_rgb_jpeg);
  undecodable data unchanged, for serve_jpeg to name its error."""
  try:
    return to_rgb_jpeg(data)[0]
  except tf.errors.InvalidArgumentError:
    return data


def predict(served: evaluate.Served, paths: list[str],
            top_k: int = 5) -> list[dict]:
  """For each path: {"path", "top": [{"class", "name", "probability"}]},
  or {"path", "error"} when it does not decode."""
  results = []
  for start in range(0, len(paths), BATCH):
    chunk = paths[start:start + BATCH]
    data = [as_training_jpeg(tf.io.gfile.GFile(p, "rb").read())
            for p in chunk]
    try:
      outcomes = list(served.serve_jpeg(image_bytes=tf.constant(data))
                      ["probabilities"].numpy())
    except tf.errors.InvalidArgumentError:  # find the files that fail
      outcomes = [_one(served, one) for one in data]
    for path, outcome in zip(chunk, outcomes):
      results.append({"path": path, "error": outcome}
                     if isinstance(outcome, str) else
                     {"path": path, "top": _top(outcome, served.names,
                                                top_k)})
  return results


def render(results: list[dict]) -> str:
  lines = []
  for result in results:
    lines.append(result["path"])
    if "error" in result:
      lines.append(f"  not classified: {result['error']}")
      continue
    for rank, top in enumerate(result["top"], 1):
      lines.append(f"  {rank}. {top['name']} ({top['class']}) "
                   f"{top['probability']:.3f}")
  return "\n".join(lines)


def define_flags() -> None:
  flags.DEFINE_string("saved_model", None, "SavedModel folder written by "
                      "`python -m tools.export_savedmodel`.")
  flags.DEFINE_string("model_dir", None, "A run's model_dir: its latest "
                      "checkpoint (or --checkpoint) instead of an export.")
  flags.DEFINE_string("checkpoint", "", "With --model_dir: the checkpoint "
                      "prefix (default: the latest).")
  flags.DEFINE_integer("top_k", 5, "Classes listed per image.")
  flags.DEFINE_string("json_output", "", "Also write the predictions here "
                      "as JSON.")
  flags.mark_flags_as_mutual_exclusive(["saved_model", "model_dir"],
                                       required=True)


def main(argv: list[str]) -> None:
  try:
    if FLAGS.top_k < 1:
      raise ValueError(f"--top_k must be >= 1, got {FLAGS.top_k}.")
    paths = image_paths(argv[1:])
    served = (evaluate.served_checkpoint(FLAGS.model_dir, FLAGS.checkpoint)
              if FLAGS.model_dir else evaluate.served_export(FLAGS.saved_model))
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  results = predict(served, paths, FLAGS.top_k)
  print(render(results), flush=True)
  failed = sum("error" in r for r in results)
  if failed:
    logging.warning("%d of %d files were not classified.", failed,
                    len(results))
  if FLAGS.json_output:
    with tf.io.gfile.GFile(FLAGS.json_output, "w") as f:
      json.dump(results, f, indent=1)


if __name__ == "__main__":
  define_flags()
  app.run(main)
