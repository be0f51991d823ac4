"""Every benchmark runs at its tiniest setting, so none can rot.

No timing is asserted here: performance lives in `make bench`.
"""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(module: str, output_dir, *args, timeout=600):
  result = subprocess.run(
      [sys.executable, "-m", module, f"--output_dir={output_dir}", *args],
      cwd=ROOT, capture_output=True, text=True, timeout=timeout)
  assert result.returncode == 0, result.stderr[-3000:]
  return result


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench")
  _run("tools.bench_train", out, "--tiny",
       f"--scratch_dir={out}/scratch_train")
  _run("tools.bench_bn_groups", out, "--tiny",
       f"--scratch_dir={out}/scratch_bn")
  _run("tools.bench_collectives", out, "--tiny")
  _run("tools.bench_cpu_kernels", out, "--tiny")
  _run("tools.bench_report", out)
  return out


def test_training_benchmarks_write_the_summary_keys(results):
  with open(results / "summary.json") as f:
    summary = json.load(f)
  for key in ("ours_vs_keras_fp32", "ours_vs_keras_bf16", "mfu_bf16",
              "bn_group4_vs_group1", "onednn_vs_eigen_fp32"):
    assert isinstance(summary[key], float) and summary[key] > 0, key


def test_report_holds_every_table(results):
  text = (results / "REPORT.md").read_text()
  for heading in ("ours vs keras.applications.ResNet50",
                  "Model FLOP utilisation", "Host loop",
                  "Distributed BN: group size",
                  "CPU kernels: oneDNN vs Eigen"):
    assert heading in text


def test_profile_step_runs_a_workload_in_a_loop():
  result = subprocess.run(
      [sys.executable, "-m", "tools.profile_step", "--workload=matmul",
       "--precision=float32", "--matmul_size=64", "--seconds=0.2"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "matmul float32:" in result.stdout


def test_alternate_gives_slow_variants_only_the_first_repetitions():
  from tools import bench_common
  calls = []
  variants = {name: (lambda name=name: calls.append(name) or len(calls))
              for name in ("a", "slow", "b")}
  runs = bench_common.alternate(variants, 3, fewer={"slow": 1})
  assert calls == ["a", "slow", "b", "a", "b", "a", "b"]
  assert runs == {"a": [1, 4, 6], "slow": [2], "b": [3, 5, 7]}


def test_report_names_the_command_of_a_part_make_bench_does_not_run(tmp_path):
  (tmp_path / "summary.json").write_text('{"bn_group4_vs_group1": 1.2}')
  _run("tools.bench_report", tmp_path)
  text = (tmp_path / "REPORT.md").read_text()
  assert "(cpu_kernels.md missing: run `make bench-cpu-kernels`.)" in text
  assert "(train.md missing: its benchmark did not run.)" in text
  assert "| `bn_group4_vs_group1` | 1.200 | <= 1.10 | **NO** |" in text


def test_kept_timers_outlive_their_benchmark_function():
  import gc
  import weakref
  from tools import bench_common

  class Timers(dict):
    pass

  def bench():
    timers = Timers(a=lambda: 1.0)
    bench_common.keep_until_exit(timers)
    return weakref.ref(timers)

  ref = bench()
  gc.collect()
  assert ref() is not None
