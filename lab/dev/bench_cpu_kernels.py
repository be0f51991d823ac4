"""TensorFlow's CPU kernels, oneDNN vs Eigen, on our training step.

  python -m lab.dev.bench_cpu_kernels --output_dir=bench_results [--tiny]
  make bench-cpu-kernels    # the same, then REPORT.md again

Not part of `make bench` (six child processes that each trace ResNet-50
take about 3.5 minutes on 2 cores); REPORT.md includes its last result with
the date it was measured.

Why resnet_tpu/runtime/cpu_kernels.py turns TF_ENABLE_ONEDNN_OPTS on. TensorFlow
reads that switch once, when it loads, so each measurement is a child process
of its own, and the children alternate: Eigen, oneDNN, Eigen, oneDNN, ...
Each child builds the workload of lab/bench_train.py (our ResNet-50, 1
replica, synthetic data, the production loop), traces and warms it up, then
reports the median images/s of --calls timed calls of --steps steps, with
freed host memory kept as in training (host_memory.py). The ratio
oneDNN / Eigen is that of the medians over repetitions.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile

from absl import app
from absl import flags
from absl import logging

from resnet_tpu.runtime import cpu_kernels
from resnet_tpu.runtime import host_memory
from tools import bench_common
from lab import bench_train

FLAGS = flags.FLAGS
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
KERNELS = {"Eigen": "0", "oneDNN": "1"}  # name -> TF_ENABLE_ONEDNN_OPTS
TINY = dict(image_size=32, batch_size=2, depth=18, steps=1, calls=1,
            repetitions=1)


def child(setup: dict) -> dict:
  """Runs in a child process: images/s of `calls` timed calls."""
  host_memory.keep_freed_memory()  # as run.py and lab/bench_train.py do
  with tempfile.TemporaryDirectory() as tmp:
    cfg = bench_train.train_config("float32", setup["image_size"],
                                   setup["batch_size"], setup["depth"], tmp)
    _, seconds = bench_train.step_timer(cfg, None, setup["steps"])
    rates = [setup["batch_size"] / seconds() for _ in range(setup["calls"])]
  return {"onednn_kernels": cpu_kernels.onednn_enabled(),
          "images_per_second": statistics.median(rates), "calls": rates}


def run_child(setup: dict, onednn: str) -> dict:
  """One child process with TF_ENABLE_ONEDNN_OPTS=`onednn`; its result."""
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "result.json")
    command = [sys.executable, "-m", "lab.dev.bench_cpu_kernels",
               f"--child_json={path}",
               *(f"--{key}={value}" for key, value in setup.items()
                 if key != "repetitions")]
    env = {**os.environ, cpu_kernels.ONEDNN_ENV: onednn}
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True,
                          text=True, check=False)
    if done.returncode:
      raise RuntimeError(f"child {command} with {cpu_kernels.ONEDNN_ENV}="
                         f"{onednn} failed:\n{done.stderr[-3000:]}")
    with open(path) as f:
      result = json.load(f)
  if result["onednn_kernels"] != (onednn == "1"):
    raise RuntimeError(f"{cpu_kernels.ONEDNN_ENV}={onednn} did not set "
                       "TensorFlow's oneDNN kernels as asked")
  return result


def markdown(summary: dict, setup: dict, ratio: float, date: str) -> str:
  eigen, onednn = summary["Eigen"], summary["oneDNN"]
  return "\n".join([
      "### CPU kernels: oneDNN vs Eigen (resnet_tpu/runtime/cpu_kernels.py)",
      "",
      f"Measured {date} by lab/dev/bench_cpu_kernels.py (`make "
      "bench-cpu-kernels`, not part of `make bench`). Our "
      f"ResNet-{setup['depth']}, {setup['image_size']} px, batch "
      f"{setup['batch_size']}, 1 replica, float32: one child process per "
      f"measurement (TensorFlow reads {cpu_kernels.ONEDNN_ENV} once), "
      f"{setup['repetitions']} alternating repetitions of {setup['calls']} "
      f"calls x {setup['steps']} steps.",
      "",
      "| kernels | images/s (min-max) | vs Eigen |",
      "|---|---:|---:|",
      f"| Eigen ({cpu_kernels.ONEDNN_ENV}=0) | {eigen['median']:.2f} "
      f"({eigen['min']:.2f}-{eigen['max']:.2f}) | 1.00x |",
      f"| oneDNN ({cpu_kernels.ONEDNN_ENV}=1, our default) | "
      f"{onednn['median']:.2f} ({onednn['min']:.2f}-{onednn['max']:.2f}) | "
      f"{ratio:.2f}x |",
  ]) + "\n"


def main(argv: list[str]) -> None:
  del argv
  setup = dict(image_size=FLAGS.image_size, batch_size=FLAGS.batch_size,
               depth=FLAGS.depth, steps=FLAGS.steps, calls=FLAGS.calls,
               repetitions=FLAGS.repetitions)
  if FLAGS.tiny:
    setup.update(TINY)
  if FLAGS.child_json:
    with open(FLAGS.child_json, "w") as f:
      json.dump(child(setup), f)
    return
  runs = {name: [] for name in KERNELS}
  for repetition in range(setup["repetitions"]):
    for name, onednn in KERNELS.items():
      result = run_child(setup, onednn)
      runs[name].append(result["images_per_second"])
      logging.info("repetition %d: %s kernels: %.3f images/s", repetition,
                   name, runs[name][-1])
  summary = bench_common.summarise(runs)
  ratio = summary["oneDNN"]["median"] / summary["Eigen"]["median"]
  machine = bench_common.machine()
  report = markdown(summary, setup, ratio, machine["date"])
  bench_common.write_json(FLAGS.output_dir, "cpu_kernels.json", {
      "setup": setup, "machine": machine, "summary": summary,
      "onednn_vs_eigen_fp32": ratio, "headline_ranges": {
          "onednn_vs_eigen_fp32": bench_common.paired_range(
              runs["oneDNN"], runs["Eigen"])}})
  with open(os.path.join(FLAGS.output_dir, "cpu_kernels.md"), "w") as f:
    f.write(report)
  bench_common.merge_summary(FLAGS.output_dir, {"onednn_vs_eigen_fp32": ratio})
  print(report)


if __name__ == "__main__":
  flags.DEFINE_string("output_dir", "bench_results", "Where results go.")
  flags.DEFINE_integer("image_size", 224, "Image side.")
  flags.DEFINE_integer("batch_size", 4, "Global batch (1 replica).")
  flags.DEFINE_integer("depth", 50, "ResNet depth.")
  flags.DEFINE_integer("steps", 2, "Training steps per timed call.")
  flags.DEFINE_integer("calls", 3, "Timed calls per child process.")
  flags.DEFINE_integer("repetitions", 3,
                       "Alternating child processes per kernel set.")
  flags.DEFINE_string("child_json", "", "Internal: run as a child, write "
                      "its result here.")
  flags.DEFINE_bool("tiny", False, "Smoke-test sizes (seconds, not minutes).")
  app.run(main)
