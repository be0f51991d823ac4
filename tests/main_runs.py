"""Runs of main.py as a user starts them, in processes of their own, on
either engine: for the demo on both engines (test_demo_on_both_engines.py)
and JAX's runs of several hosts and without TensorFlow (tests_jax/)."""
import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_TIMEOUT_S = 900
# The demo's eval top-1 on JAX and on TensorFlow, after the same 100 steps
# of the same data from different initial weights (each engine draws its
# own): within 0.03 (8 of its 250 images). Measured: 1.000 on both.
TOP1_TOLERANCE = 0.03
# A tiny run on synthetic data: 2 virtual CPU devices, no eval set.
TINY = ("--strategy=cpu", "--num_cpu_replicas=2", "--use_synthetic_data",
        "--resnet_depth=18", "--image_size=32", "--num_classes=10",
        "--global_batch_size=8", "--num_train_images=800",
        "--warmup_epochs=0", "--checkpoint_every_minutes=0")


# The test session's JAX compilation cache: one folder that every main.py
# run of the session's pytest processes keeps its compiled programs in, as
# a user's runs do who sets JAX's own JAX_COMPILATION_CACHE_DIR (what
# --jax_compilation_cache_dir=auto takes first). A run whose program an
# earlier run compiled loads it instead of compiling it again.
# tests_jax/test_compilation_cache.py measures cold and restarted runs in
# folders of their own.
SESSION_JAX_CACHE = "RESNET_TPU_TEST_JAX_CACHE"


def env(**extra: str) -> dict:
  """This process's environment without the test session's engine settings
  (main.py sets its own from --strategy and --backend, and chooses the CPU
  kernels), with the session's JAX compilation cache, plus `extra`."""
  kept = {k: v for k, v in os.environ.items()
          if k not in ("XLA_FLAGS", "JAX_PLATFORMS", "KERAS_BACKEND",
                       "TF_ENABLE_ONEDNN_OPTS", SESSION_JAX_CACHE)}
  if os.environ.get(SESSION_JAX_CACHE):
    kept["JAX_COMPILATION_CACHE_DIR"] = os.environ[SESSION_JAX_CACHE]
  return {**kept, **extra}


# main.py as where TensorFlow is not installed (without_tensorflow.py).
WITHOUT_TENSORFLOW = os.path.join(ROOT, "tests_jax", "without_tensorflow.py")
# main.py's --backend=jax where this environment has JAX (.venv has, on
# every Python; the TPU build's has not: make test-tpu-build).
HAS_JAX = importlib.util.find_spec("jax") is not None
needs_jax = pytest.mark.skipif(
    not HAS_JAX, reason="no JAX in this environment (the TPU build's: "
    "requirements/tpu-vm-tensorflow.txt)")
BACKENDS = ("tensorflow", pytest.param("jax", marks=needs_jax))


def main(*flags: str, backend: str = "jax", environ: dict | None = None,
         script: str = "main.py") -> subprocess.CompletedProcess:
  """main.py (or `script`, which runs it) with `flags`, to its end."""
  return subprocess.run(
      [sys.executable, script, f"--backend={backend}", *flags], cwd=ROOT,
      env=environ or env(), capture_output=True, text=True,
      timeout=RUN_TIMEOUT_S)


def stopped_after(line: str, *flags: str,
                  script: str = "main.py") -> tuple[int, str]:
  """Runs main.py (or `script`) on JAX with `flags` until it logs `line`,
  then sends it SIGTERM; returns its exit code and log."""
  code, log, _ = timed_stop(re.escape(line), *flags, script=script)
  return code, log


def timed_stop(pattern: str, *flags: str,
               script: str = "main.py") -> tuple[int, str, float]:
  """stopped_after's run, stopped at the first line that matches the
  regular expression `pattern`; returns its exit code, its log and the
  seconds from the SIGTERM to the exit."""
  process = subprocess.Popen(
      [sys.executable, script, "--backend=jax", *flags], cwd=ROOT,
      env=env(), stderr=subprocess.PIPE, text=True)
  seen, sent = [], None
  deadline = time.time() + RUN_TIMEOUT_S
  for text in process.stderr:
    seen.append(text)
    if time.time() > deadline:
      process.kill()
      raise AssertionError(f"no line matched {pattern!r} in "
                           f"{RUN_TIMEOUT_S} s: {''.join(seen)[-3000:]}")
    if re.search(pattern, text):
      process.send_signal(signal.SIGTERM)
      sent = time.time()
      break
  seen.extend(process.stderr)
  code = process.wait(timeout=RUN_TIMEOUT_S)
  return code, "".join(seen), time.time() - (sent or time.time())


def records(model_dir: str, split: str) -> list[dict]:
  """metrics.jsonl's records of `split`."""
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    return [r for r in map(json.loads, f) if r["split"] == split]


def ok(done: subprocess.CompletedProcess) -> str:
  """The log of a run that must have succeeded."""
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stderr


def make_demo_data(out: str) -> str:
  """make demo's TFRecords in `out`: 10 classes, 2,000 train and 250
  validation images of 40 px; returns their folder."""
  steps = [["data.make_synthetic", f"--output_dir={out}/images",
            "--num_classes=10", "--images_per_class=200",
            "--validation_images_per_class=25", "--image_size=40"]]
  for split, shards in (("train", 4), ("validation", 2)):
    steps.append(["data.build_tfrecords", f"--input_dir={out}/images/{split}",
                  f"--output_dir={out}/tfrecords", f"--split={split}",
                  f"--num_shards={shards}"])
  for step in steps:
    subprocess.run([sys.executable, "-m", *step], cwd=ROOT, env=env(),
                   check=True, capture_output=True, timeout=RUN_TIMEOUT_S)
  return f"{out}/tfrecords"


def free_port() -> int:
  """A free TCP port on 127.0.0.1 (for jax.distributed's coordinator)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def hosts(args: list[list[str]], devices: int, logs: str,
          first: int = 0) -> list[subprocess.Popen]:
  """One process per `args` (its argv after the interpreter), each with
  `devices` virtual CPU devices, logging to logs/process_{first + i}.log."""
  environ = env(JAX_PLATFORMS="cpu", KERAS_BACKEND="jax",
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
  processes = []
  for i, argv in enumerate(args, first):
    with open(os.path.join(logs, f"process_{i}.log"), "w") as log:
      processes.append(subprocess.Popen(
          [sys.executable, *argv], cwd=ROOT, env=environ, text=True,
          stdout=log, stderr=subprocess.STDOUT))
  return processes


def wait_all(processes: list[subprocess.Popen], logs: str,
             first: int = 0) -> list[str]:
  """Waits for `processes` (killing them all when one outlasts
  RUN_TIMEOUT_S); returns their logs."""
  try:
    for process in processes:
      process.wait(timeout=RUN_TIMEOUT_S)
  finally:
    for process in processes:
      process.kill()
  texts = []
  for i in range(first, first + len(processes)):
    with open(os.path.join(logs, f"process_{i}.log")) as f:
      texts.append(f.read())
  return texts
