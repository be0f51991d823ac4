"""Why the CPU demo trains faster on TensorFlow than on JAX (issue 60 item 4),
measured side by side in one run on this CPU:

  step     the project's JAX step against the same ResNet-50 v1.5 built from
           stock keras.layers (Keras's BN) on JAX, same shapes and loss
           (lab/bench_gpu.py's `ours` and `stock_layers` on the CPU: batch
           16, 96 px, bfloat16 compute);
  loop     the JAX training loop against its step alone, at the demo's
           shapes (lab/bench_handoff.py): the input hand-off's cost;
  engines  the demo itself (flags/cpu_demo.cfg through main.py) on
           TensorFlow with oneDNN's CPU kernels (its default here), on
           TensorFlow with Eigen's (TF_ENABLE_ONEDNN_OPTS=0), and on JAX
           (XLA:CPU, whose convolutions are Eigen's): the images/s of its
           host loops after the first, the processes alternating over
           --rounds;
  stock    the engines' own ratio without the project's code, at the
           demo's image size and batch: stock keras.applications.ResNet50
           stepped by train_on_batch on the same three (one process each,
           alternating over --rounds).

  .venv/bin/python -m lab.bench_engines_cpu --data_dir=demo_data/tfrecords

(`make bench-engines-cpu`; about 14 minutes on 2 cores.) Writes
engines_cpu.json and engines_cpu.md to --output_dir.
"""
import ast
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command's flags, defined only where it runs as a command (tests
  import its functions beside other modules that define --data_dir)."""
  flags.DEFINE_string("data_dir", "demo_data/tfrecords",
                      "The demo's TFRecords.")
  flags.DEFINE_string("output_dir", "bench_results", "Where the report goes.")
  flags.DEFINE_integer("rounds", 2, "Demo processes per engine, alternating.")
  flags.DEFINE_integer("train_steps", 75, "Demo steps per process (the loops "
                       "after the first 25 are timed).")
  flags.DEFINE_list("parts", ["step", "loop", "engines", "stock"],
                    "What to measure.")
  flags.DEFINE_string("child", "", "Internal: measure `stock` here.")
  flags.DEFINE_integer("stock_steps", 5, "train_on_batch steps per sample.")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The demo on each engine and TensorFlow's CPU kernels: name -> (backend,
# extra environment).
ENGINES = {"tensorflow_onednn": ("tensorflow", {"TF_ENABLE_ONEDNN_OPTS": "1"}),
           "tensorflow_eigen": ("tensorflow", {"TF_ENABLE_ONEDNN_OPTS": "0"}),
           "jax": ("jax", {})}
LOOP_LINE = re.compile(r"step (\d+)/\d+: .* ([\d.]+) images/s")


def _summary(values: list[float]) -> dict:
  return {"median": round(statistics.median(values), 1),
          "min": round(min(values), 1), "max": round(max(values), 1),
          "n": len(values)}


def _by_engine(rates: dict[str, list[float]]) -> dict:
  """Each engine's images/s summary, and the TensorFlow kernels' medians
  against JAX's."""
  out = {name: {"images_per_s": _summary(rates[name])} for name in ENGINES}
  median = {name: out[name]["images_per_s"]["median"] for name in ENGINES}
  out["ratios"] = {f"{name}_vs_jax": round(median[name] / median["jax"], 2)
                   for name in ("tensorflow_onednn", "tensorflow_eigen")}
  return out


def _environ(**extra: str) -> dict:
  kept = {k: v for k, v in os.environ.items()
          if k not in ("KERAS_BACKEND", "XLA_FLAGS", "JAX_PLATFORMS",
                       "TF_ENABLE_ONEDNN_OPTS")}
  return {**kept, **extra}


def step_part() -> dict:
  """The ours and stock_layers workloads of lab/bench_gpu.py on this CPU."""
  with tempfile.TemporaryDirectory() as out:
    subprocess.run(
        [sys.executable, "-m", "lab.bench_gpu", f"--output_dir={out}",
         "--workloads=ours,stock_layers", "--depth=50", "--batch_size=16",
         "--image_size=96", "--num_classes=1000", "--warmup_steps=2",
         "--steps=5", "--repeats=5", "--budget_s=900"],
        cwd=ROOT, env=_environ(KERAS_BACKEND="jax"), check=True)
    with open(os.path.join(out, "gpu_bench.json")) as f:
      report = json.load(f)
  keep = ("images_per_s", "images_per_s_range", "step_ms", "compile_s")
  workloads = {name: {k: report["workloads"][name][k] for k in keep}
               for name in ("ours", "stock_layers")}
  return {"workloads": workloads,
          "ours_vs_stock_layers": report["ratios"]["ours_vs_stock_layers"],
          "device": report["versions"]["device"]}


def loop_part() -> dict:
  """The loop against the step at the demo's shapes, by lab/bench_handoff.py."""
  done = subprocess.run(
      [sys.executable, "-m", "lab.bench_handoff",
       f"--data_dir={FLAGS.data_dir}", "--rounds=2"],
      cwd=ROOT, env=_environ(), capture_output=True, text=True, check=True)
  line = next(l for l in done.stdout.splitlines() if l.startswith("after:"))
  loop = ast.literal_eval(line.split("loop ", 1)[1].split(", step")[0])
  step = ast.literal_eval(line.split("step ", 1)[1].split(", loop/step")[0])
  return {"loop_images_per_s": loop, "step_images_per_s": step,
          "loop_vs_step": round(loop["median"] / step["median"], 3)}


def demo_rates(backend: str, extra: dict) -> tuple[list[float], float]:
  """One demo process: the images/s of its host loops after the first, and
  its wall seconds."""
  with tempfile.TemporaryDirectory() as model_dir:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "main.py", f"--backend={backend}",
         "--flagfile=flags/cpu_demo.cfg", f"--data_dir={FLAGS.data_dir}",
         f"--model_dir={model_dir}", f"--train_steps={FLAGS.train_steps}",
         f"--eval_every_steps={FLAGS.train_steps}"],
        cwd=ROOT, env=_environ(**extra), capture_output=True, text=True,
        check=True)
    wall = time.perf_counter() - start
  loops = [(int(s), float(r)) for s, r in LOOP_LINE.findall(done.stderr)]
  return [rate for step, rate in loops if step > loops[0][0]], wall


def engines_part() -> dict:
  rates = {name: [] for name in ENGINES}
  walls = {name: [] for name in ENGINES}
  for _ in range(FLAGS.rounds):
    for name, (backend, extra) in ENGINES.items():
      got, wall = demo_rates(backend, extra)
      rates[name] += got
      walls[name].append(round(wall, 1))
  out = _by_engine(rates)
  for name in ENGINES:
    out[name]["wall_s"] = walls[name]
  onednn, eigen = (out[name]["images_per_s"]["median"]
                   for name in ("tensorflow_onednn", "tensorflow_eigen"))
  out["ratios"]["onednn_vs_eigen"] = round(onednn / eigen, 2)
  return out


def stock_rates() -> list[float]:
  """In this process (KERAS_BACKEND set by the parent): images/s of stock
  keras.applications.ResNet50 by train_on_batch at the demo's 32 px and
  batch 64, 3 samples after 2 warm-up steps."""
  import keras  # pylint: disable=g-import-not-at-top  (after the env)
  import numpy as np  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  model = keras.applications.ResNet50(weights=None, input_shape=(32, 32, 3),
                                      classes=10)
  model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9),
                loss="sparse_categorical_crossentropy")
  rng = np.random.RandomState(0)
  images = rng.uniform(0, 1, (64, 32, 32, 3)).astype(np.float32)
  labels = rng.randint(0, 10, (64,)).astype(np.int32)
  for _ in range(2):
    model.train_on_batch(images, labels)
  rates = []
  for _ in range(3):
    start = time.perf_counter()
    for _ in range(FLAGS.stock_steps):
      model.train_on_batch(images, labels)
    rates.append(64 * FLAGS.stock_steps / (time.perf_counter() - start))
  return rates


def stock_part() -> dict:
  rates = {name: [] for name in ENGINES}
  for _ in range(FLAGS.rounds):
    for name, (backend, extra) in ENGINES.items():
      done = subprocess.run(
          [sys.executable, "-m", "lab.bench_engines_cpu", "--child=stock",
           f"--stock_steps={FLAGS.stock_steps}"],
          cwd=ROOT, env=_environ(KERAS_BACKEND=backend, **extra),
          capture_output=True, text=True, check=True)
      line = done.stdout.strip().splitlines()[-1]
      rates[name] += json.loads(line)
  return _by_engine(rates)


def markdown(report: dict) -> str:
  lines = ["### The CPU demo's engines, side by side (lab/bench_engines_cpu.py)",
           "", f"Measured {report['date']} on {report['cpus']} CPU cores by "
           "`make bench-engines-cpu`; medians with min-max.", ""]
  for part, title in (("engines", "the demo (flags/cpu_demo.cfg) on"),
                      ("stock", "stock keras.applications.ResNet50, 32 px, "
                       "batch 64, train_on_batch, on")):
    if part not in report:
      continue
    e = report[part]
    lines += [f"| {title} | images/s | vs JAX |", "|---|---:|---:|"]
    for name in ENGINES:
      s = e[name]["images_per_s"]
      ratio = s["median"] / e["jax"]["images_per_s"]["median"]
      lines.append(f"| {name} | {s['median']} ({s['min']}-{s['max']}) | "
                   f"{ratio:.2f}x |")
    lines.append("")
  if "loop" in report:
    p = report["loop"]
    lines += [f"JAX's training loop / its step alone at the demo's shapes: "
              f"{p['loop_vs_step']:.2f} (loop "
              f"{p['loop_images_per_s']['median']}, step "
              f"{p['step_images_per_s']['median']} images/s).", ""]
  if "step" in report:
    p = report["step"]
    w = p["workloads"]
    lines += [f"The project's JAX step / stock keras.layers v1.5 on JAX "
              f"(ResNet-50, batch 16, 96 px): {p['ours_vs_stock_layers']:.2f}"
              f" ({w['ours']['images_per_s']:.2f} against "
              f"{w['stock_layers']['images_per_s']:.2f} images/s).", ""]
  return "\n".join(lines)


def main(argv):
  del argv
  if FLAGS.child == "stock":
    print(json.dumps(stock_rates()), flush=True)
    return
  report = {"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
            "command": "make bench-engines-cpu"}
  parts = {"engines": engines_part, "loop": loop_part, "step": step_part,
           "stock": stock_part}
  for name in FLAGS.parts:
    report[name] = parts[name]()
    print(name, json.dumps(report[name]), flush=True)
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  with open(os.path.join(FLAGS.output_dir, "engines_cpu.json"), "w") as f:
    json.dump(report, f, indent=1)
  with open(os.path.join(FLAGS.output_dir, "engines_cpu.md"), "w") as f:
    f.write(markdown(report))
  print(markdown(report))


if __name__ == "__main__":
  define_flags()
  app.run(main)
