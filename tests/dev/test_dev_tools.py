"""The developer profilers (tools/dev) run at their tiniest setting, so none
can rot; `make test-dev`. No timing is asserted."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
HEADLINES = {"cpu_kernels.json": ("onednn_vs_eigen_fp32",),
             "collectives.json": (
                 "collectives_bn_step_masked_over_collective",
                 "collectives_group_all_reduce_masked_over_collective")}


def _run(module: str, *args, timeout=600) -> str:
  result = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  out = tmp_path_factory.mktemp("bench_dev")
  _run("tools.dev.bench_collectives", f"--output_dir={out}", "--tiny")
  _run("tools.dev.bench_cpu_kernels", f"--output_dir={out}", "--tiny")
  _run("tools.bench_report", f"--output_dir={out}")
  return out


def test_dev_benchmarks_write_summary_keys_and_their_ranges(results):
  summary = json.loads((results / "summary.json").read_text())
  for name, keys in HEADLINES.items():
    ranges = json.loads((results / name).read_text())["headline_ranges"]
    for key in keys:
      assert isinstance(summary[key], float) and summary[key] > 0, key
      # With one or two repetitions the ratio of medians lies in the range.
      low, high = ranges[key]
      assert low * (1 - 1e-9) <= summary[key] <= high * (1 + 1e-9), key


def test_report_holds_the_developer_tables(results):
  text = (results / "REPORT.md").read_text()
  assert "CPU kernels: oneDNN vs Eigen" in text
  assert "Distributed-BN group all-reduce: collective vs masked" in text
  assert "(train.md missing: run `make bench`.)" in text


def test_profile_step_runs_a_workload_in_a_loop():
  stdout = _run("tools.dev.profile_step", "--workload=matmul",
                "--precision=float32", "--matmul_size=64", "--seconds=0.2",
                timeout=120)
  assert "matmul float32:" in stdout


@pytest.mark.parametrize("workload", ["input", "input_ceiling"])
def test_profile_step_runs_an_input_workload_in_a_loop(workload):
  stdout = _run("tools.dev.profile_step", f"--workload={workload}",
                "--num_images=4", "--image_size=32", "--input_batch_size=2",
                "--seconds=0.2", timeout=120)
  assert f"{workload}: " in stdout


def test_input_profile_table_groups_perf_lines_by_stage():
  from tools.dev import input_profile_table as table
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
