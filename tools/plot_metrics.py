"""Training curves of a run as one PNG, from <model_dir>/metrics.jsonl.

  python -m tools.plot_metrics --model_dir=M [--output=M/metrics.png]

Six panels: train/eval loss, train/eval top-1 against step and against wall
time, top-5, train images/s and the learning rate. Wall time continues across
resumed runs (each run's elapsed_s restarts at 0). Rendered with the Agg
backend, so it needs no display.
"""
import os
import sys

from absl import app
from absl import flags
from absl import logging
from matplotlib.figure import Figure
import tensorflow as tf

if not __package__:  # run as a file: the repository's root on the path
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from resnet_tpu.train.metrics_log import read_metrics

FLAGS = flags.FLAGS
SPLITS = ("train", "eval")


def load_records(model_dir: str) -> list[dict]:
  """The records of <model_dir>/metrics.jsonl; ValueError if there are none."""
  path = os.path.join(model_dir, "metrics.jsonl")
  if not tf.io.gfile.exists(path):
    raise ValueError(f"--model_dir={model_dir!r} has no metrics.jsonl; it is "
                     "written by a training run (main.py).")
  records = read_metrics(model_dir)
  if not records:
    raise ValueError(f"{path} is empty.")
  return records


def wall_minutes(records: list[dict]) -> list[float]:
  """Minutes since the first run started, continuing across resumes."""
  offset, previous, minutes = 0.0, 0.0, []
  for record in records:
    if record["elapsed_s"] < previous:
      offset += previous
    previous = record["elapsed_s"]
    minutes.append((offset + previous) / 60)
  return minutes


def _series(records: list[dict], split: str, key: str,
            x: list[float] | None = None) -> tuple[list, list]:
  """(x, y) of `key` over the records of `split`; x defaults to the step."""
  pairs = [((x[i] if x else r["step"]), r[key])
           for i, r in enumerate(records) if r["split"] == split and key in r]
  return [p[0] for p in pairs], [p[1] for p in pairs]


def _panel(axes, records: list[dict], key: str, title: str,
           splits=SPLITS, x: list[float] | None = None,
           xlabel: str = "step") -> None:
  for split in splits:
    xs, ys = _series(records, split, key, x)
    if xs:
      axes.plot(xs, ys, marker="." if split == "eval" else None,
                label=split)
  axes.set_title(title)
  axes.set_xlabel(xlabel)
  axes.grid(alpha=0.3)
  axes.legend()


def plot(records: list[dict], title: str = "") -> Figure:
  """The six-panel figure of `records` (metrics.jsonl lines)."""
  figure = Figure(figsize=(15, 8), layout="constrained")
  grid = figure.subplots(2, 3)
  _panel(grid[0, 0], records, "loss", "loss")
  _panel(grid[0, 1], records, "top1", "top-1 vs step")
  _panel(grid[0, 2], records, "top1", "top-1 vs wall time",
         x=wall_minutes(records), xlabel="minutes")
  _panel(grid[1, 0], records, "top5", "top-5")
  _panel(grid[1, 1], records, "images_per_sec", "train images/s",
         splits=("train",))
  _panel(grid[1, 2], records, "learning_rate", "learning rate",
         splits=("train",))
  if title:
    figure.suptitle(title)
  return figure


def plot_metrics(model_dir: str, output: str = "") -> str:
  """Writes the PNG of a run (default <model_dir>/metrics.png); its path."""
  output = output or os.path.join(model_dir, "metrics.png")
  figure = plot(load_records(model_dir), title=model_dir)
  with tf.io.gfile.GFile(output, "wb") as f:
    figure.savefig(f, format="png", dpi=100)
  logging.info("Wrote %s", output)
  return output


def define_flags() -> None:
  flags.DEFINE_string("model_dir", None, "Training run folder holding "
                      "metrics.jsonl.")
  flags.DEFINE_string("output", "", "PNG to write; default "
                      "<model_dir>/metrics.png.")
  flags.mark_flag_as_required("model_dir")


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  try:
    plot_metrics(FLAGS.model_dir, FLAGS.output)
  except ValueError as error:
    raise app.UsageError(str(error)) from error


if __name__ == "__main__":
  define_flags()
  app.run(main)
