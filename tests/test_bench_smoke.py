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


@pytest.mark.parametrize("workload", ["input", "input_ceiling"])
def test_profile_step_runs_an_input_workload_in_a_loop(workload):
  result = subprocess.run(
      [sys.executable, "-m", "tools.profile_step", f"--workload={workload}",
       "--num_images=4", "--image_size=32", "--input_batch_size=2",
       "--seconds=0.2"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr[-3000:]
  assert f"{workload}: " in result.stdout


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


def test_input_profile_table_groups_perf_lines_by_stage():
  from tools import input_profile_table as table
  report = """
# Samples: 33K of event 'cpu-clock:ppp'
    48.24%  libtensorflow_cc.so.2   [.] decode_mcu
     9.51%  libtensorflow_cc.so.2   [.] tensorflow::(anonymous namespace)::resize_image<float>
     5.11%  libc.so.6               [.] __memmove_avx_unaligned_erms
     2.54%  [kernel.kallsyms]       [k] finish_task_switch.isra.0
     1.47%  libtensorflow_cc.so.2   [.] jsimd_ycc_rgb_convert_avx2.columnloop
     0.93%  libtensorflow_framework.so.2  [.] tensorflow::ExecutorState::Process
     0.50%  libpython3.11.so.1.0    [.] _PyEval_EvalFrameDefault
"""
  shares = table.stage_shares(report)
  assert shares["JPEG entropy decoding (decode_mcu)"] == 48.24
  assert shares["bilinear resize"] == 9.51
  assert shares["memory copies, malloc/free"] == 5.11
  assert shares["OS kernel (scheduling, faults, syscalls)"] == 2.54
  assert shares["JPEG IDCT, upsampling, colour conversion"] == 1.47
  assert shares["TensorFlow runtime (executor, thread pools, tf.data)"] == 0.93
  assert shares["other"] == 0.5
  text = table.markdown({"fused": shares, "ceiling": shares})
  assert "| bilinear resize | 9.5% | 9.5% |" in text
  with pytest.raises(ValueError, match="no `perf report` sample lines"):
    table.stage_shares("# nothing\n")
