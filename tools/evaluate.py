"""Top-1/top-5 of a trained network on every example of a TFRecord split,
overall and per class.

  python -m tools.evaluate --saved_model=E --data_dir=D [--split=validation] \\
      [--batch_size=256] [--output_dir=O]
  python -m tools.evaluate --model_dir=M [--checkpoint=C] --data_dir=D ...

--saved_model takes an export (tools/export_savedmodel.py); --model_dir takes
a run's folder and evaluates its latest checkpoint (or --checkpoint) with
the same serving functions, without writing an export.

Feeds the raw encoded JPEGs of the records to the `serve_jpeg` signature, so
images go through exactly the eval preprocessing of training
(preprocessing.preprocess_for_eval, with the centre-crop fraction the run's
config.json recorded as --eval_crop_fraction) and the numbers reproduce the
in-training eval of the same checkpoint. Every record counts (the last batch
is simply smaller). A record whose JPEG does not decode is logged by file,
record index and file name, counted in "errors" and left out of "examples". The
last line on stdout is one JSON object: {"top1", "top5", "examples"[,
"errors"]}.

With --output_dir it also writes, per class (named from the run's
synsets.txt when the export carries it): per_class.json (examples, top-1
and the class most often predicted instead), confusion_matrix.csv (rows:
true class, columns: predicted class, top-1) and confusion_matrix.png.
"""
import csv
import dataclasses
import json
import os
import sys
import time

from absl import app
from absl import flags
from absl import logging
from matplotlib.figure import Figure
import numpy as np
import tensorflow as tf

if not __package__:  # run as a file: the repository's root on the path
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from resnet_tpu import config as config_lib
from resnet_tpu import export
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
  """Running hit counts of one evaluation, and its confusion matrix (rows:
  true class, columns: the top-1 prediction)."""
  top1: int = 0
  top5: int = 0
  examples: int = 0
  errors: int = 0
  confusion: np.ndarray | None = None

  def add(self, logits: tf.Tensor, labels: tf.Tensor) -> None:
    # in_top_k, as the training-time eval
    # (ReplicaStep.losses_and_hits).
    self.top1 += int(tf.reduce_sum(tf.cast(
        tf.math.in_top_k(labels, logits, 1), tf.int32)))
    self.top5 += int(tf.reduce_sum(tf.cast(
        tf.math.in_top_k(labels, logits, 5), tf.int32)))
    self.examples += int(tf.size(labels))
    classes = int(logits.shape[-1])
    if self.confusion is None:
      self.confusion = np.zeros([classes, classes], np.int64)
    # in_top_k breaks ties against the label; argmax takes the first.
    hit = tf.math.in_top_k(labels, logits, 1).numpy()
    predicted = np.where(hit, labels.numpy(),
                         tf.argmax(logits, -1, tf.int32).numpy())
    np.add.at(self.confusion, (labels.numpy(), predicted), 1)

  def result(self) -> dict:
    n = max(self.examples, 1)
    record = {"top1": self.top1 / n, "top5": self.top5 / n,
              "examples": self.examples}
    if self.errors:
      record["errors"] = self.errors
    return record


@dataclasses.dataclass(frozen=True)
class Served:
  """What an evaluation calls: serve_jpeg, the label offset, class names."""
  serve_jpeg: object
  label_offset: int
  crop_fraction: float
  names: list[str]
  owner: object = None  # keeps the module of a bound serve_jpeg alive


def class_names(labels_path: str, num_classes: int) -> list[str]:
  """synsets.txt's names (data/build_tfrecords.py), else "class <i>"."""
  names = [f"class {i}" for i in range(num_classes)]
  if labels_path and tf.io.gfile.exists(labels_path):
    with tf.io.gfile.GFile(labels_path) as f:
      rows = [line.split("\t") for line in f.read().splitlines() if line]
    for index, name in rows:
      if 0 <= int(index) < num_classes:
        names[int(index)] = name
  return names


def served_export(saved_model: str) -> Served:
  loaded = load_export(saved_model)
  labels = (loaded.labels_file.asset_path.numpy().decode()
            if hasattr(loaded, "labels_file") else "")
  return Served(loaded.signatures["serve_jpeg"],
                int(loaded.label_offset.numpy()),
                float(loaded.eval_crop_fraction.numpy())
                if hasattr(loaded, "eval_crop_fraction") else 0.0,
                class_names(labels, int(loaded.num_classes.numpy())),
                owner=loaded)


def served_checkpoint(model_dir: str, checkpoint: str = "") -> Served:
  """The serving functions of an export, built in memory from a run's
  config.json and its latest checkpoint (or `checkpoint`)."""
  config = config_lib.read_config(model_dir)  # ConfigError: a ValueError
  path = export.checkpoint_path(model_dir, checkpoint)
  module = export.ServingModule(
      export.restore_inference_model(config, path), config)
  logging.info("Evaluating checkpoint %s", path)
  return Served(module.serve_jpeg, int(config["label_offset"]),
                export.eval_crop_fraction(config),
                class_names(config.get("labels_file", ""),
                            int(config["num_classes"])), owner=module)


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
             batch_size: int = 256, output_dir: str = "",
             served: Served | None = None) -> dict:
  """Top-1/top-5 of `saved_model` (or of `served`, e.g. served_checkpoint)
  over every record of `split` in data_dir; with `output_dir`, the
  per-class results too (write_per_class)."""
  if batch_size < 1:
    raise ValueError(f"--batch_size must be >= 1, got {batch_size}.")
  served = served or served_export(saved_model)
  serve = served.serve_jpeg
  label_offset = tf.constant(served.label_offset, tf.int32)
  if served.crop_fraction:
    logging.info("serve_jpeg centre crop: %.4f of the shorter side (the "
                 "run's --eval_crop_fraction)", served.crop_fraction)
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
  if output_dir and tally.confusion is not None:
    write_per_class(tally.confusion, served.names, output_dir)
  return result


def per_class(confusion: np.ndarray, names: list[str]) -> list[dict]:
  """Each class's examples, top-1 and most frequent wrong prediction."""
  rows = []
  for i, name in enumerate(names):
    examples = int(confusion[i].sum())
    wrong = confusion[i].copy()
    wrong[i] = 0
    rows.append({"class": i, "name": name, "examples": examples,
                 "top1": float(confusion[i, i] / examples) if examples
                 else None,
                 "most_confused_with": names[int(wrong.argmax())]
                 if wrong.any() else None})
  return rows


def write_per_class(confusion: np.ndarray, names: list[str],
                    output_dir: str) -> None:
  """per_class.json, confusion_matrix.csv and confusion_matrix.png."""
  tf.io.gfile.makedirs(output_dir)
  with tf.io.gfile.GFile(os.path.join(output_dir, "per_class.json"),
                         "w") as f:
    json.dump(per_class(confusion, names), f, indent=1)
  with tf.io.gfile.GFile(os.path.join(output_dir, "confusion_matrix.csv"),
                         "w") as f:
    writer = csv.writer(f)
    writer.writerow(["true \\ predicted"] + names)
    for name, row in zip(names, confusion):
      writer.writerow([name] + [int(v) for v in row])
  totals = np.maximum(confusion.sum(axis=1, keepdims=True), 1)
  size = min(16, 4 + 0.3 * len(names))
  figure = Figure(figsize=(size, size))
  axes = figure.subplots()
  image = axes.imshow(confusion / totals, cmap="viridis", vmin=0, vmax=1)
  if len(names) <= 50:
    axes.set_xticks(range(len(names)), names, rotation=90)
    axes.set_yticks(range(len(names)), names)
  axes.set_xlabel("predicted class")
  axes.set_ylabel("true class")
  axes.set_title("Share of each true class by top-1 prediction")
  figure.colorbar(image)
  figure.tight_layout()
  with tf.io.gfile.GFile(os.path.join(output_dir, "confusion_matrix.png"),
                         "wb") as f:
    figure.savefig(f, format="png", dpi=100)
  logging.info("Per-class results in %s", output_dir)


def define_flags() -> None:
  flags.DEFINE_string("saved_model", None, "SavedModel folder written by "
                      "`python -m tools.export_savedmodel`.")
  flags.DEFINE_string("model_dir", None, "A run's model_dir: evaluate its "
                      "latest checkpoint (or --checkpoint) instead of an "
                      "export.")
  flags.DEFINE_string("checkpoint", "", "With --model_dir: the checkpoint "
                      "prefix to evaluate (default: the latest).")
  flags.DEFINE_string("output_dir", "", "Write per_class.json, "
                      "confusion_matrix.csv and confusion_matrix.png here.")
  flags.DEFINE_string("data_dir", None, "Folder of train-*/validation-* "
                      "TFRecords (`python -m data.build_tfrecords`).")
  flags.DEFINE_enum("split", "validation", list(SPLITS), "Split to evaluate.")
  flags.DEFINE_integer("batch_size", 256, "Images per serve_jpeg call.")
  flags.mark_flags_as_required(["data_dir"])
  flags.mark_flags_as_mutual_exclusive(["saved_model", "model_dir"],
                                       required=True)


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    served = (served_checkpoint(FLAGS.model_dir, FLAGS.checkpoint)
              if FLAGS.model_dir else None)
    result = evaluate(FLAGS.saved_model, FLAGS.data_dir, FLAGS.split,
                      FLAGS.batch_size, FLAGS.output_dir, served)
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  print(json.dumps(result), flush=True)


if __name__ == "__main__":
  define_flags()
  app.run(main)
