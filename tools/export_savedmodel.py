"""Exports a run's checkpoint as a serving SavedModel (resnet_tpu/export.py).

  python -m tools.export_savedmodel --model_dir=M --export_dir=E \\
      [--checkpoint=M/ckpt-300]

The network comes from <model_dir>/config.json; the checkpoint is the latest
of --model_dir unless --checkpoint names one.
"""
import os
import sys

from absl import app
from absl import flags

if not __package__:  # run as a file: the repository's root on the path
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from resnet_tpu import export

FLAGS = flags.FLAGS


def define_flags() -> None:
  flags.DEFINE_string("model_dir", None, "Training run folder holding "
                      "config.json and checkpoints.")
  flags.DEFINE_string("export_dir", None, "Folder to write the SavedModel to.")
  flags.DEFINE_string("checkpoint", "", "Checkpoint prefix to export (e.g. "
                      "M/ckpt-300); default: the latest in --model_dir.")
  flags.mark_flags_as_required(["model_dir", "export_dir"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    export.export_saved_model(FLAGS.model_dir, FLAGS.export_dir,
                              FLAGS.checkpoint)
  except ValueError as error:
    raise app.UsageError(str(error)) from error


if __name__ == "__main__":
  define_flags()
  app.run(main)
