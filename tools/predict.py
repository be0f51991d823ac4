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
sorted; its other files are named as skipped, with why. A JPEG's EXIF
orientation is applied first, as photo viewers do (a phone's portrait
photo is stored sideways with a tag that says so). Class names come from
the run's synsets.txt (tools/evaluate.class_names). A file that does not
decode is named with its error and counted; the others are still
classified.
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
from data.build_tfrecords import JPEG_QUALITY
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
      names = sorted(tf.io.gfile.listdir(item))
      found = [os.path.join(item, n) for n in names
               if n.lower().endswith(IMAGE_EXTENSIONS)]
      for name in names:
        path = os.path.join(item, name)
        if (not name.lower().endswith(IMAGE_EXTENSIONS) and
            not tf.io.gfile.isdir(path)):
          logging.warning("Skipped %s: not a format training takes (%s).",
                          path, ", ".join(IMAGE_EXTENSIONS))
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


def exif_orientation(data: bytes) -> int:
  """The EXIF Orientation tag (1-8) of a JPEG's APP1 segment; 1 (upright)
  without one."""
  i = 2 if data.startswith(b"\xff\xd8") else len(data)
  while i + 4 <= len(data) and data[i] == 0xFF and data[i + 1] not in (
      0xD9, 0xDA):  # up to the image data
    length = int.from_bytes(data[i + 2:i + 4], "big")
    if data[i + 1] == 0xE1 and data[i + 4:i + 10] == b"Exif\0\0":
      return _tiff_orientation(data[i + 10:i + 2 + length])
    i += 2 + length
  return 1


def _tiff_orientation(tiff: bytes) -> int:
  order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
  if order is None or len(tiff) < 8:
    return 1
  ifd = int.from_bytes(tiff[4:8], order)
  for k in range(int.from_bytes(tiff[ifd:ifd + 2], order)):
    entry = tiff[ifd + 2 + 12 * k:ifd + 14 + 12 * k]
    if len(entry) == 12 and int.from_bytes(entry[:2], order) == 0x0112:
      value = int.from_bytes(entry[8:10], order)
      return value if 1 <= value <= 8 else 1
  return 1


def upright(image: tf.Tensor, orientation: int) -> tf.Tensor:
  """`image` [h, w, c] as EXIF `orientation` says to display it."""
  if orientation in (5, 7):
    image = tf.image.transpose(image)
  if orientation in (2, 4):
    image = tf.image.flip_left_right(image)
  # rot90 turns counter-clockwise: 6 (and 5) are stored turned left.
  turns = {3: 2, 4: 2, 6: 3, 7: 2, 8: 1}.get(orientation, 0)
  return tf.image.rot90(image, k=turns)


def as_training_jpeg(data: bytes) -> bytes:
  """`data` as training's records hold it (build_tfrecords.to_rgb_jpeg),
  turned upright by its EXIF orientation; undecodable data unchanged, for
  serve_jpeg to name its error."""
  try:
    jpeg = to_rgb_jpeg(data)[0]
  except tf.errors.InvalidArgumentError:
    return data
  orientation = exif_orientation(data)
  if orientation == 1:
    return jpeg
  image = upright(tf.io.decode_jpeg(jpeg, channels=3), orientation)
  return tf.io.encode_jpeg(image, format="rgb",
                           quality=JPEG_QUALITY).numpy()


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
