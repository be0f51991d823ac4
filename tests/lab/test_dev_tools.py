"""The developer profilers (lab/dev) run at their tiniest setting, so none
can rot; `make test-lab`. No timing is asserted."""
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
  _run("lab.dev.bench_collectives", f"--output_dir={out}", "--tiny")
  _run("lab.dev.bench_cpu_kernels", f"--output_dir={out}", "--tiny")
  _run("lab.bench_report", f"--output_dir={out}")
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
  stdout = _run("lab.dev.profile_step", "--workload=matmul",
                "--precision=float32", "--matmul_size=64", "--seconds=0.2",
                timeout=120)
  assert "matmul float32:" in stdout


@pytest.mark.parametrize("workload", ["input", "input_ceiling"])
def test_profile_step_runs_an_input_workload_in_a_loop(workload):
  stdout = _run("lab.dev.profile_step", f"--workload={workload}",
                "--num_images=4", "--image_size=32", "--input_batch_size=2",
                "--seconds=0.2", timeout=120)
  assert f"{workload}: " in stdout


def test_cfg_walk_counts_stops_modules_and_returns():
  from lab.dev import cfg_walk
  from resnet_tpu import config as config_lib
  from resnet_tpu import preflight
  cfg = config_lib.TrainConfig.tiny("model", use_synthetic_data=True)

  def three_stops():
    config_lib.validate(cfg)
    config_lib.validate(cfg)  # the same module again: still one stop
    preflight.input_notes(cfg)
    cfg.flat()  # the config's own method: reading it, not a stop
    preflight.input_notes(cfg)
    config_lib.validate(cfg)

  stops = cfg_walk.walk(three_stops, (config_lib.TrainConfig,))
  assert stops == ["resnet_tpu.config", "resnet_tpu.preflight",
                   "resnet_tpu.config"]
  assert cfg_walk.summary(stops) == {"stops": 3, "modules": 2, "returns": 1}
  assert config_lib.RunConfig in cfg_walk.part_types(config_lib.TrainConfig)
