"""The closing lines of `make demo`: eval top-1, where its outputs went, time.

  python -m tools.demo_summary --model_dir=M --start_time=SECONDS \\
      [--export_dir=M/export] [--saved_model_eval=FILE]

Reads the last eval record of <model_dir>/metrics.jsonl and, if given, the
last line of --saved_model_eval (what tools/evaluate.py prints), and names
the latest checkpoint, the TensorBoard logs, the SavedModel and the plot
(tools/plot_metrics.py's default path). Exits 1, naming the file, when one
is missing. --start_time is when the demo started, in seconds since the
epoch (`date +%s`). Does not load TensorFlow.
"""
import glob
import json
import os
import re
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS


def latest_checkpoint(model_dir: str) -> str:
  """The prefix of the highest-step ckpt-N in `model_dir`, or ""."""
  indexes = glob.glob(os.path.join(model_dir, "ckpt-*.index"))
  steps = [int(re.search(r"ckpt-(\d+)\.index$", path).group(1))
           for path in indexes]
  return os.path.join(model_dir, f"ckpt-{max(steps)}") if steps else ""


def last_eval(model_dir: str) -> dict | None:
  """The last record of metrics.jsonl with split "eval", or None."""
  path = os.path.join(model_dir, "metrics.jsonl")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    evals = [r for r in map(json.loads, f) if r["split"] == "eval"]
  return evals[-1] if evals else None


def duration(seconds: float) -> str:
  minutes, seconds = divmod(round(seconds), 60)
  return f"{minutes} min {seconds} s" if minutes else f"{seconds} s"


def summary(model_dir: str, export_dir: str, saved_model_eval: str,
            seconds: float) -> tuple[list[str], list[str]]:
  """The summary lines, and the missing outputs (each a sentence)."""
  missing = []
  record = last_eval(model_dir)
  if record is None:
    missing.append(f"no eval record in {model_dir}/metrics.jsonl")
    top1 = "eval top-1 unknown"
  else:
    top1 = (f"eval top-1 {record['top1']:.4f} on {record['examples']} "
            f"validation images at step {record['step']}")
  if saved_model_eval:
    if os.path.exists(saved_model_eval):
      with open(saved_model_eval) as f:
        served = json.loads(f.read().splitlines()[-1])
      top1 += f"; SavedModel top-1 {served['top1']:.4f}"
    else:
      missing.append(f"{saved_model_eval} (tools/evaluate.py's output)")
  checkpoint = latest_checkpoint(model_dir)
  plot = os.path.join(model_dir, "metrics.png")
  if not checkpoint:
    missing.append(f"a checkpoint in {model_dir}")
  if not os.path.exists(os.path.join(export_dir, "saved_model.pb")):
    missing.append(f"a SavedModel in {export_dir}")
  if not os.path.exists(plot):
    missing.append(f"{plot} (tools/plot_metrics.py's output)")
  lines = [f"Demo done in {duration(seconds)}: {top1}.",
           f"  checkpoints:  {checkpoint or '(none)'} "
           f"(metrics.jsonl beside it)",
           f"  TensorBoard:  tensorboard --logdir {model_dir}",
           f"  SavedModel:   {export_dir}",
           f"  plot:         {plot}"]
  return lines, missing


def define_flags() -> None:
  flags.DEFINE_string("model_dir", None, "The demo's training run folder.")
  flags.DEFINE_string("export_dir", "", "Its SavedModel; default "
                      "<model_dir>/export.")
  flags.DEFINE_string("saved_model_eval", "", "File holding tools/"
                      "evaluate.py's output for the SavedModel.")
  flags.DEFINE_float("start_time", None, "When the demo started, in seconds "
                     "since the epoch (`date +%s`).")
  flags.mark_flags_as_required(["model_dir", "start_time"])


def main(argv: list[str]) -> None:
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  lines, missing = summary(
      FLAGS.model_dir, FLAGS.export_dir or os.path.join(FLAGS.model_dir,
                                                        "export"),
      FLAGS.saved_model_eval, time.time() - FLAGS.start_time)
  print("\n".join(lines))
  if missing:
    raise SystemExit("Missing: " + "; ".join(missing) + ".")


if __name__ == "__main__":
  define_flags()
  app.run(main)
