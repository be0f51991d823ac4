"""What JAX's persistent compilation cache saves a restarted run (issue 60):
the seconds its first training step compiles, cold and restarted.

  make bench-compile-cache  (.venv/bin/python -m lab.bench_compile_cache
                             --output_dir=bench_results)

Each sample is two runs of main.py on JAX, --use_synthetic_data, on
--replicas virtual CPU devices, in a fresh model_dir with
--jax_compilation_cache_dir=auto (the cache in the model_dir): a cold run
of 2 steps, then a restart that resumes it for 2 more
(--allow_config_change=train_steps), as after a preemption. From each
run's JAX_LOG_COMPILES log: the seconds of the step's XLA compilation
(jit(_replica_step); a cache hit is the seconds to load it), of every
compilation together, and the process's wall seconds; the step's entries
in the cache after the cold run. Median, min and max over --samples; the
restarted/cold ratio of the medians.

Writes compile_cache.json.
"""
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

from resnet_tpu.engines.jax import startup

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", "bench_results",
                    "Where compile_cache.json goes.")
flags.DEFINE_integer("samples", 3, "Cold and restarted pairs.")
flags.DEFINE_integer("resnet_depth", 18, "ResNet depth of the runs.")
flags.DEFINE_integer("image_size", 32, "Image side in pixels.")
flags.DEFINE_integer("replicas", 2, "Virtual CPU devices.")
flags.DEFINE_integer("timeout_s", 900, "Limit of one run.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEP = "jit(_replica_step)"
COMPILED = re.compile(r"Finished XLA compilation of (\S+) in ([\d.]+) sec")
HIT = "Persistent compilation cache hit for 'jit__replica_step'"
# auto's folder in the model_dir.
CACHE_FOLDER = startup.CACHE_FOLDER


def run_flags(model_dir: str, steps: int) -> list[str]:
  """main.py's flags for a run of `steps` steps in `model_dir`."""
  return ["--backend=jax", "--strategy=cpu",
          f"--num_cpu_replicas={FLAGS.replicas}", "--use_synthetic_data",
          f"--resnet_depth={FLAGS.resnet_depth}",
          f"--image_size={FLAGS.image_size}", "--num_classes=10",
          f"--global_batch_size={4 * FLAGS.replicas}",
          "--num_train_images=800", "--warmup_epochs=0",
          "--checkpoint_every_minutes=0", f"--model_dir={model_dir}",
          f"--train_steps={steps}", "--allow_config_change=train_steps"]


def compiles(log: str) -> dict:
  """A run's step compile seconds, all compile seconds, and whether the
  step came from the cache, read from its JAX_LOG_COMPILES lines."""
  found = COMPILED.findall(log)
  step = [float(s) for name, s in found if name == STEP]
  if not step:
    raise RuntimeError(f"no {STEP} compilation in the log: {log[-2000:]}")
  return {"step_compile_s": step[0],
          "all_compile_s": sum(float(s) for _, s in found),
          "step_cache_hit": HIT in log}


def timed_run(model_dir: str, steps: int) -> dict:
  """One main.py run, its compiles and wall seconds."""
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "KERAS_BACKEND",
                      startup.JAX_CACHE_ENV)}  # cold means cold
  env["JAX_LOG_COMPILES"] = "1"
  start = time.perf_counter()
  done = subprocess.run(
      [sys.executable, "main.py", *run_flags(model_dir, steps)], cwd=ROOT,
      env=env, capture_output=True, text=True, timeout=FLAGS.timeout_s)
  wall_s = time.perf_counter() - start
  if done.returncode:
    raise RuntimeError(f"main.py exit {done.returncode}: "
                       f"{done.stderr[-2000:]}")
  return dict(compiles(done.stderr), wall_s=wall_s)


def spread(values: list[float]) -> dict:
  return {"median": statistics.median(values), "min": min(values),
          "max": max(values)}


def measure() -> dict:
  """--samples pairs of a cold run and its restart."""
  samples = []
  for _ in range(FLAGS.samples):
    with tempfile.TemporaryDirectory() as model_dir:
      cold = timed_run(model_dir, 2)
      cache = os.path.join(model_dir, CACHE_FOLDER)
      cold["cached_steps"] = len([
          name for name in (os.listdir(cache) if os.path.isdir(cache) else ())
          if name.startswith("jit__replica_step")])
      samples.append({"cold": cold, "restarted": timed_run(model_dir, 4)})
      print(json.dumps(samples[-1]), flush=True)
  summary = {}
  for key in ("step_compile_s", "all_compile_s", "wall_s"):
    summary[key] = {kind: spread([s[kind][key] for s in samples])
                    for kind in ("cold", "restarted")}
    summary[key]["restarted_over_cold"] = (
        summary[key]["restarted"]["median"] / summary[key]["cold"]["median"])
  return {"what": "first-step compile seconds, cold and restarted, with "
                  "JAX's persistent compilation cache "
                  "(lab/bench_compile_cache.py; issue 60)",
          "config": {name: getattr(FLAGS, name) for name in (
              "samples", "resnet_depth", "image_size", "replicas")},
          "summary": summary, "samples": samples,
          "rerun": "python -m lab.bench_compile_cache "
                   "--output_dir=bench_results"}


def main(argv):
  del argv
  report = measure()
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  path = os.path.join(FLAGS.output_dir, "compile_cache.json")
  with open(path, "w") as f:
    json.dump(report, f, indent=1)
  print(json.dumps(report["summary"], indent=1))
  print("wrote", path)


if __name__ == "__main__":
  app.run(main)
