"""Top-1/top-5 of an exported SavedModel on every example of a TFRecord split.

  python -m tools.evaluate --saved_model=E --data_dir=D [--split=validation] \\
      [--batch_size=256]

Feeds the raw encoded JPEGs of the records to the `serve_jpeg` signature, so
images go through exactly the eval preprocessing of training
(preprocessing.preprocess_for_eval, with the centre-crop fraction the run's
config.json recorded as --eval_crop_fraction) and the numbers reproduce the
in-training eval of the same checkpoint. Every record counts (the last batch
is simply smaller). A record whose JPEG does not decode is logged by file, record index
and file name, counted in "errors" and left out of "examples". The last line
on stdout is one JSON object: {"top1", "top5", "examples"[, "errors"]}.
"""
import dataclasses
import json
import os
import time

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from resnet_tpu.inputs.input_pipeline import split_files
from resnet_tpu.inputs.input_pipeline import SPLITS

FLAGS = flags.FLAGS
_FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
    "image/filename": tf.io.FixedLenFeature([], tf.string, default_value=""),
}


@dataclasses.dataclass
class Tally:
  """Running hit counts of one evaluation."""
  top1: int = 0
  top5: int = 0
  examples: int = 0
  errors: int = 0

  def add(self, logits: tf.Tensor, labels: tf.Tensor) -> None:
    # in_top_k, as the training-time eval
    # (train_step.ReplicaStep.losses_and_hits).
    self.top1 += int(tf.reduce_sum(tf.cast(
        tf.math.in_top_k(labels, logits, 1), tf.int32)))
    self.top5 += int(tf.reduce_sum(tf.cast(
        tf.math.in_top_k(labels, logits, 5), tf.int32)))
    self.examples += int(tf.size(labels))

  def result(self) -> dict:
    n = max(self.examples, 1)
    record = {"top1": self.top1 / n, "top5": self.top5 / n,
              "examples": self.examples}
    if self.errors:
      record["errors"] = self.errors
    return record


def load_export(saved_model: str):
  """The SavedModel of tools/export_savedmodel.py; ValueError if it is not."""
  if not tf.io.gfile.exists(os.path.join(saved_model, "saved_model.pb")):
    raise ValueError(f"--saved_model={saved_model!r} is not a SavedModel "
                     "folder (no saved_model.pb); write one with "
                     "`python -m tools.export_savedmodel`.")
  loaded = tf.saved_model.load(saved_model)
  if "serve_jpeg" not in loaded.signatures or not hasattr(loaded,
                                                          "label_offset"):
    raise ValueError(f"--saved_model={saved_model!r} lacks the serve_jpeg "
                     "signature or label_offset of tools/export_savedmodel.py.")
  return loaded


def records(data_dir: str, split: str) -> tf.data.Dataset:
  """(file, record index, JPEG bytes, stored label, file name) in file order."""
  def read(path):
    def parse(index, record):
      features = tf.io.parse_single_example(record, _FEATURES)
      return (path, index, features["image/encoded"],
              features["image/class/label"], features["image/filename"])
    return tf.data.TFRecordDataset(path).enumerate().map(parse)

  files = tf.data.Dataset.from_tensor_slices(split_files(data_dir, split))
  return files.flat_map(read)


def _evaluate_one_by_one(serve, batch, labels, tally: Tally) -> None:
  """Evaluates a batch holding an undecodable JPEG example by example."""
  paths, indices, image_bytes, _, names = batch
  for i in range(int(tf.size(labels))):
    try:
      logits = serve(image_bytes=image_bytes[i:i + 1])["logits"]
    except tf.errors.InvalidArgumentError as error:
      tally.errors += 1
      logging.warning("Undecodable image in %s record %d (%s): %s",
                      paths[i].numpy().decode(), int(indices[i]),
                      names[i].numpy().decode(),
                      str(error).strip().splitlines()[0])
    else:
      tally.add(logits, labels[i:i + 1])


def evaluate(saved_model: str, data_dir: str, split: str = "validation",
             batch_size: int = 256) -> dict:
  """Top-1/top-5 of `saved_model` over every record of `split` in data_dir."""
  if batch_size < 1:
    raise ValueError(f"--batch_size must be >= 1, got {batch_size}.")
  loaded = load_export(saved_model)
  serve = loaded.signatures["serve_jpeg"]
  label_offset = tf.cast(loaded.label_offset, tf.int32)
  if hasattr(loaded, "eval_crop_fraction"):
    logging.info("serve_jpeg centre crop: %.4f of the shorter side (the "
                 "run's --eval_crop_fraction)",
                 float(loaded.eval_crop_fraction.numpy()))
  dataset = records(data_dir, split).batch(batch_size).prefetch(2)
  tally, start = Tally(), time.time()
  for batch in dataset:
    labels = tf.cast(batch[3], tf.int32) - label_offset
    try:
      logits = serve(image_bytes=batch[2])["logits"]
    except tf.errors.InvalidArgumentError:
      _evaluate_one_by_one(serve, batch, labels, tally)
    else:
      tally.add(logits, labels)
  seconds = time.time() - start
  result = tally.result()
  logging.info("%s: top-1 %.4f top-5 %.4f over %d examples, %d errors, "
               "%.1f s (%.1f images/s)", split, result["top1"],
               result["top5"], tally.examples, tally.errors, seconds,
               tally.examples / max(seconds, 1e-9))
  return result


def define_flags() -> None:
  flags.DEFINE_string("saved_model", None, "SavedModel folder written by "
                      "`python -m tools.export_savedmodel`.")
  flags.DEFINE_string("data_dir", None, "Folder of train-*/validation-* "
                      "TFRecords (`python -m data.build_tfrecords`).")
  flags.DEFINE_enum("split", "validation", list(SPLITS), "Split to evaluate.")
  flags.DEFINE_integer("batch_size", 256, "Images per serve_jpeg call.")
  flags.mark_flags_as_required(["saved_model", "data_dir"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    result = evaluate(FLAGS.saved_model, FLAGS.data_dir, FLAGS.split,
                      FLAGS.batch_size)
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main)
