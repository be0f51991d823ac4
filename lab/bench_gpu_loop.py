"""The GPU bench's `loop` workload (lab/bench_gpu.py; issue 60): main.py
itself, on JAX and --use_synthetic_data, through a few host loops and one
checkpoint, at the step workloads' shapes.

From its log (JAX_LOG_COMPILES=1) and metrics.jsonl it reports the host
loops' images/s after the first (the first compiles), the compiles logged
up to the first host loop's line (start-up and the first loop) and after it
(none in a steady run; their names if not), and the checkpoint's seconds:
from the last host loop's log line to the save's ("Saved checkpoint"), by
absl's timestamps, so the device_get and the write. Where TensorFlow is not
installed (the lent H200's image) the checkpoint is a .npz
(engines/jax/npz_checkpoints.py). main.py's log goes to gpu_bench_loop.log.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# ImageNet's training images: only the LR schedule's epochs read it.
NUM_TRAIN_IMAGES = 1281167
# absl's line prefix: level, MMDD, time of day.
STAMP = re.compile(r"^[IWEF]\d{4} (\d\d):(\d\d):(\d\d\.\d+) ")
COMPILING = re.compile(r"Compiling (\S+) with global shapes")
HOST_LOOP = re.compile(r"\] step \d+/\d+: ")
SAVED = re.compile(r"\] Saved checkpoint (\S+)")


def command(model_dir: str, depth: int, batch_size: int, image_size: int,
            num_classes: int, steps_per_loop: int, host_loops: int
            ) -> list[str]:
  """main.py's command line: the `ours` step's network, batch and loss,
  on JAX's default devices, one checkpoint at the end."""
  return [
      sys.executable, os.path.join(ROOT, "main.py"), "--backend=jax",
      "--strategy=auto", "--use_synthetic_data", f"--model_dir={model_dir}",
      f"--resnet_depth={depth}", f"--global_batch_size={batch_size}",
      f"--image_size={image_size}", f"--num_classes={num_classes}",
      "--precision=bfloat16", "--bfloat16_conv_kernels=native",
      f"--num_train_images={NUM_TRAIN_IMAGES}",
      f"--steps_per_loop={steps_per_loop}",
      f"--train_steps={steps_per_loop * host_loops}",
      "--checkpoint_every_minutes=0"]


def _seconds_of_day(line: str) -> float | None:
  match = STAMP.match(line)
  if not match:
    return None
  hours, minutes, seconds = match.groups()
  return 3600 * int(hours) + 60 * int(minutes) + float(seconds)


def read_run(log: str, records: list[dict]) -> dict:
  """The loop's figures from main.py's log and its train records."""
  lines = log.splitlines()
  loops = [i for i, line in enumerate(lines) if HOST_LOOP.search(line)]
  first = loops[0] if loops else len(lines)
  compiles = [(i, m.group(1)) for i, m in (
      (i, COMPILING.search(line)) for i, line in enumerate(lines)) if m]
  after = [name for i, name in compiles if i > first]
  out = {"compiles_through_first_loop": len(compiles) - len(after),
         "compiles_after_first_loop": len(after),
         "compiled_after_first_loop": sorted(set(after))}
  if records:
    out["first_loop_s"] = records[0]["examples"] / records[0][
        "images_per_sec"]
  rates = [r["images_per_sec"] for r in records[1:]]
  if rates:
    out.update({"images_per_s": statistics.median(rates),
                "images_per_s_range": [min(rates), max(rates)],
                "loop_images_per_s": rates})
  saved = [(i, m.group(1)) for i, m in (
      (i, SAVED.search(line)) for i, line in enumerate(lines)) if m]
  if saved and loops:
    i, path = saved[-1]
    before = max(j for j in loops if j < i)
    seconds = _seconds_of_day(lines[i]) - _seconds_of_day(lines[before])
    out.update({"checkpoint": os.path.basename(path),
                "checkpoint_s": seconds % 86400})
  return out


def output_text(output: bytes | str | None) -> str:
  """A subprocess's captured output as text (TimeoutExpired holds bytes)."""
  if isinstance(output, bytes):
    return output.decode(errors="replace")
  return output or ""


def _write(log_path: str | None, log: bytes | str | None) -> None:
  """main.py's log to `log_path`."""
  if log_path:
    with open(log_path, "w") as f:
      f.write(output_text(log))


def run(timeout_s: float, log_path: str | None = None, **shape) -> dict:
  """main.py with command(**shape) in a temporary model_dir, at most
  `timeout_s`; its figures (read_run), or why there are none. Its log goes
  to `log_path`, also where it runs out of time."""
  with tempfile.TemporaryDirectory() as model_dir:
    argv = command(model_dir, **shape)
    start = time.perf_counter()
    try:
      done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT,
                            timeout=timeout_s,
                            env=dict(os.environ, JAX_LOG_COMPILES="1"))
    except subprocess.TimeoutExpired as e:
      _write(log_path, e.stderr)
      return {"skipped": f"over its {timeout_s:.0f} s"}
    wall_s = time.perf_counter() - start
    _write(log_path, done.stderr)
    if done.returncode:
      tail = done.stderr.strip().splitlines()[-3:]
      return {"skipped": f"exit {done.returncode}: " + " | ".join(tail)}
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
      records = [r for r in map(json.loads, f) if r["split"] == "train"]
    out = read_run(done.stderr, records)
  out.update({"wall_s": wall_s, "host_loops": len(records),
              "command": " ".join(["main.py", *(
                  a for a in argv[2:] if not a.startswith("--model_dir"))])})
  return out
