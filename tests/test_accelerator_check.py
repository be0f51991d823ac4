"""tools/accelerator_check.py: the first command on a TPU VM or a GPU host,
kept alive by running it at CI size on CPU replicas."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import cpu_strategy
from tools import accelerator_check
from tools import accelerator_checks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = ("devices", "group_bn", "replicas_equal_one_device", "bfloat16_step",
        "xla_compile", "throughput")


def _run(*args: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
  return subprocess.run([sys.executable, "-m", "tools.accelerator_check",
                         *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=900)


def test_tiny_check_on_2_cpu_replicas_passes_every_row(tmp_path):
  output = tmp_path / "check.json"
  done = _run("--tiny", "--strategy=cpu", "--num_cpu_replicas=2",
              f"--output={output}")
  assert done.returncode == 0, done.stderr[-3000:]
  table = done.stdout.splitlines()
  assert [line.split()[:2] for line in table[1:]] == [
      [name, "PASS"] for name in ROWS]
  report = json.loads(output.read_text())
  assert report["passed"] and report["replicas"] == 2
  assert {"versions", "devices", "topology", "sizes", "checks"} <= set(report)
  assert {"tensorflow", "keras", "python"} <= set(report["versions"])
  assert list(report["checks"]) == sorted(ROWS)  # json sort_keys
  checks = report["checks"]
  assert checks["group_bn"]["group_size"] == 2
  assert checks["replicas_equal_one_device"]["update_error"] < 1e-2
  assert checks["bfloat16_step"]["nonfinite_steps"] == 0
  assert checks["xla_compile"]["convolutions"] >= 40
  throughput = checks["throughput"]
  assert throughput["chips"] == 1  # virtual CPU replicas share the host
  assert set(throughput["images_per_sec_per_chip"]) == {"ours", "keras"}
  assert throughput["ours_vs_keras"] > 0


@pytest.mark.parametrize("strategy,fix", [
    ("tpu", "requirements-tpu.txt"), ("gpu", "requirements-gpu.txt")])
def test_a_missing_accelerator_stops_within_seconds_naming_the_fix(
    tmp_path, strategy, fix):
  start = time.time()
  done = _run(f"--strategy={strategy}", f"--output={tmp_path}/check.json")
  assert done.returncode == 1
  assert fix in done.stderr
  assert "Traceback" not in done.stderr
  assert not (tmp_path / "check.json").exists()
  assert time.time() - start < 60  # TensorFlow's import is most of it


def test_one_failed_check_fails_the_report():
  rows = [accelerator_checks.Check("devices", True, ""),
          accelerator_checks.Check("group_bn", False, "ValueError: x")]
  report = accelerator_check.report("cpu", cpu_strategy(1),
                                    accelerator_check.TINY, None, rows)
  assert not report["passed"]
  assert "group_bn  FAIL    ValueError: x" in accelerator_check.table(rows)
