"""JAX's persistent compilation cache (--jax_compilation_cache_dir; issue
60): where auto puts it, and that a restarted run loads its step from it
(lab/bench_compile_cache.py's runs, once, in a child process: importing it
here would define its absl flags beside lab/bench_gpu.py's in the same
pytest worker)."""
import json
import os
import subprocess
import sys

import jax

from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.jax import startup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_auto_is_in_a_local_model_dir_else_the_users_cache(monkeypatch):
  monkeypatch.delenv(startup.JAX_CACHE_ENV, raising=False)
  local = TrainConfig("/runs/a")
  assert startup.compilation_cache_dir(local) == (
      "/runs/a/jax_compilation_cache")
  monkeypatch.setenv("XDG_CACHE_HOME", "/home/u/.cache")
  assert startup.compilation_cache_dir(TrainConfig("gs://bucket/a")) == (
      "/home/u/.cache/resnet_tpu/jax_compilation_cache")
  assert startup.compilation_cache_dir(local.replace(
      jax_compilation_cache_dir="/cache")) == "/cache"
  assert startup.compilation_cache_dir(local.replace(
      jax_compilation_cache_dir="")) == ""


def test_auto_is_jaxs_own_setting_where_the_user_made_one(monkeypatch):
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/shared/cache")
  local = TrainConfig("/runs/a")
  assert startup.compilation_cache_dir(local) == "/shared/cache"
  assert startup.compilation_cache_dir(TrainConfig("gs://bucket/a")) == (
      "/shared/cache")
  assert startup.compilation_cache_dir(local.replace(
      jax_compilation_cache_dir="/cache")) == "/cache"
  assert startup.compilation_cache_dir(local.replace(
      jax_compilation_cache_dir="")) == ""


def test_each_run_in_a_process_keeps_its_own_cache(tmp_path, monkeypatch):
  """JAX opens its cache once a process: a second run in the same process
  (as these tests, or a notebook) writes in its own folder, and '' turns
  the cache off."""
  monkeypatch.setattr(startup, "CACHE_MIN_COMPILE_S", 0.0)
  x = jax.numpy.ones(3)
  try:
    for i, name in enumerate(("a", "b", "")):
      startup.use_compilation_cache(str(tmp_path / name) if name else "")
      jax.jit(lambda v, i=i: v * (i + 2.0))(x).block_until_ready()
  finally:
    startup.use_compilation_cache("")
  assert len(os.listdir(tmp_path / "a")) == 1
  assert len(os.listdir(tmp_path / "b")) == 1


def test_a_restarted_run_loads_its_step_from_the_cache(tmp_path):
  """A cold run compiles its step and keeps it in <model_dir>/
  jax_compilation_cache; its restart loads it, in less than half the
  seconds."""
  subprocess.run(
      [sys.executable, "-m", "lab.bench_compile_cache",
       f"--output_dir={tmp_path}", "--samples=1"],
      cwd=ROOT, check=True, timeout=900,
      env=dict(os.environ, PYTHONPATH=ROOT))
  report = json.load(open(tmp_path / "compile_cache.json"))
  (sample,) = report["samples"]
  assert sample["cold"]["cached_steps"] == 1
  assert not sample["cold"]["step_cache_hit"]
  assert sample["restarted"]["step_cache_hit"]
  step = report["summary"]["step_compile_s"]
  assert step["restarted_over_cold"] <= 0.5, step
