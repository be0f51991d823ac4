"""One smoke per lab entry point (lab/), so none rots unseen by `make test`:
each starts and prints its usage, or renders what it renders. Their runs at
their tiniest settings are tests/lab (`make test-lab`)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The lab's scripts that take flags; bench_report and input_profile_table
# are smoked below on their real inputs.
ENTRY_POINTS = ("lab.bench_train", "lab.bench_bn_groups", "lab.bench_eval",
                "lab.bench_input", "lab.bench_handoff", "lab.bench_engines_cpu",
                "lab.allreduce_sim", "lab.study", "lab.study_fine_tune",
                "lab.dev.bench_collectives",
                "lab.dev.bench_cpu_kernels", "lab.dev.op_profile",
                "lab.dev.profile_step", "lab.dev.cfg_walk")


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_entry_point_starts_and_prints_its_usage(module):
  result = subprocess.run([sys.executable, "-m", module, "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
  # absl's --help exits 1 after the usage; argparse's exits 0.
  assert result.returncode in (0, 1), result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert f"python -m {module}" in result.stdout + result.stderr


def test_committed_report_is_the_rendering_of_the_committed_run():
  from lab import bench_report
  with open(os.path.join(ROOT, "bench_results", "REPORT.md")) as f:
    committed = f.read()
  assert bench_report.report(os.path.join(ROOT, "bench_results")) == committed, (
      "bench_results/REPORT.md is stale: python -m lab.bench_report")


def test_input_profile_table_groups_perf_lines_by_stage():
  from lab.dev import input_profile_table as table
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


def test_the_engines_bench_reads_the_loop_line_the_loop_logs(caplog):
  """lab/bench_engines_cpu.py times the demo from main.py's loop lines."""
  from lab import bench_engines_cpu
  from resnet_tpu.train import loop_report
  from resnet_tpu.train.loop_result import LoopResult
  # absl's own logger, whose level a test that parsed absl flags in this
  # process may have set to WARNING.
  with caplog.at_level("INFO", logger="absl"):
    loop_report.train_record(LoopResult(0.5, 0.9, 1.0, 64), 50, 75, 205.8,
                             10.0, 5.0, 0.06)
  assert bench_engines_cpu.LOOP_LINE.findall(caplog.text) == [("50", "205.8")]


def test_the_committed_engines_table_renders_the_committed_run():
  import json
  from lab import bench_engines_cpu
  with open(os.path.join(ROOT, "bench_results", "engines_cpu.json")) as f:
    report = json.load(f)
  with open(os.path.join(ROOT, "bench_results", "engines_cpu.md")) as f:
    assert bench_engines_cpu.markdown(report) == f.read()


def test_the_engines_figures_in_the_docs_are_the_committed_runs():
  """docs/jax.md and docs/performance.md quote bench_results/engines_cpu.json."""
  import json
  with open(os.path.join(ROOT, "bench_results", "engines_cpu.json")) as f:
    report = json.load(f)
  with open(os.path.join(ROOT, "docs", "jax.md")) as f:
    jax_doc = " ".join(f.read().split())
  with open(os.path.join(ROOT, "docs", "performance.md")) as f:
    performance = " ".join(f.read().split())
  demo, stock = report["engines"], report["stock"]
  for name in ("tensorflow_onednn", "tensorflow_eigen", "jax"):
    s = demo[name]["images_per_s"]
    assert f"{s['median']} ({s['min']}-{s['max']})" in jax_doc, name
  for ratios in (demo["ratios"], stock["ratios"]):
    assert (f"{ratios['tensorflow_onednn_vs_jax']:.2f}x with oneDNN, "
            f"{ratios['tensorflow_eigen_vs_jax']:.2f}x" in jax_doc) or (
                f"{ratios['tensorflow_onednn_vs_jax']:.2f}x JAX with oneDNN, "
                f"{ratios['tensorflow_eigen_vs_jax']:.2f}x" in jax_doc)
  assert f"{report['loop']['loop_vs_step']:.2f} of its step" in jax_doc
  assert (f"{report['step']['ours_vs_stock_layers']:.2f} of the same "
          "ResNet-50") in jax_doc
  assert (f"{demo['ratios']['onednn_vs_eigen']:.2f}x faster, and that is why "
          f"the demo trains {demo['ratios']['tensorflow_onednn_vs_jax']:.2f}x"
          in performance)
