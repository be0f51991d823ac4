"""tools/accelerator_check.py: the first command on a TPU VM or a GPU host,
kept alive by running it at CI size on CPU replicas; every row is made to
fail once by a real fault (the throughput row by measured rates below its
floor, given to its verdict), so a PASS means something."""
import json
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu.parallel.tensorflow import bn_all_reduce
from tools import accelerator_rows
from tools import accelerator_report
from tools import bench_common
from simulated_slices import simulated_topology

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROWS = ("devices", "group_bn", "replicas_equal_one_device", "bfloat16_step",
        "xla_compile", "throughput")
TINY = accelerator_report.TINY


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
  assert report["chips"] == 1  # virtual CPU replicas share the host
  assert {"versions", "devices", "topology", "sizes", "checks",
          "tpu_runtime"} <= set(report)
  assert {"tensorflow", "keras", "python"} <= set(report["versions"])
  assert list(report["checks"]) == sorted(ROWS)  # json sort_keys
  checks = report["checks"]
  assert checks["group_bn"]["group_size"] == 2
  assert checks["replicas_equal_one_device"]["update_error"] < 1e-2
  assert checks["bfloat16_step"]["nonfinite_steps"] == 0
  assert checks["xla_compile"]["convolutions"] >= 40
  assert checks["xla_compile"]["compiled_for"].endswith("device:CPU:0")
  assert "lowered only, not run" in checks["xla_compile"]["detail"]
  throughput = checks["throughput"]
  assert set(throughput["images_per_sec_per_chip"]) == {"ours", "keras"}
  assert throughput["ours_vs_keras"] >= throughput["min_ratio"] == 0.8


@pytest.mark.parametrize("strategy,fix", [
    ("tpu", "requirements/tpu-vm-tensorflow.txt"), ("gpu", "requirements/gpu-tensorflow.txt")])
def test_a_missing_accelerator_stops_within_seconds_naming_the_fix(
    tmp_path, strategy, fix):
  start = time.time()
  done = _run(f"--strategy={strategy}", f"--output={tmp_path}/check.json")
  assert done.returncode == 1
  assert fix in done.stderr
  assert "Traceback" not in done.stderr
  assert not (tmp_path / "check.json").exists()
  assert time.time() - start < 60  # TensorFlow's import is most of it


def test_one_failed_check_fails_the_report_and_a_skipped_one_does_not():
  rows = [accelerator_rows.Check("devices", True, ""),
          accelerator_rows.skipped_on_one_replica("group_bn")]
  strategy = cpu_strategy(1)
  report = accelerator_report.report("cpu", strategy, TINY, {}, rows)
  assert report["passed"]
  assert report["checks"]["group_bn"]["result"] == "SKIP"
  rows.append(accelerator_rows.Check("xla_compile", False, "ValueError: x"))
  report = accelerator_report.report("cpu", strategy, TINY, {}, rows)
  assert not report["passed"]
  table = accelerator_report.table(rows)
  assert "group_bn     SKIP    skipped: one replica" in table
  assert "xla_compile  FAIL    ValueError: x" in table


def test_on_one_replica_the_equivalences_are_skipped_never_passed(tmp_path):
  strategy = cpu_strategy(1)
  group = accelerator_rows.group_bn(strategy, TINY)
  same = accelerator_rows.replicas_equal_one_device(strategy, TINY,
                                                      str(tmp_path))
  assert [group.result, same.result] == ["SKIP", "SKIP"]


def test_devices_fails_when_the_replicas_are_not_on_the_kind_asked_for():
  strategy = cpu_strategy(2)
  assert accelerator_report.devices("cpu", strategy).result == "PASS"
  row = accelerator_report.devices("tpu", strategy)
  assert row.result == "FAIL" and "0 of them on a TPU" in row.detail


def test_group_bn_fails_when_bn_does_not_pool_its_group(monkeypatch):
  strategy = cpu_strategy(2)
  assert accelerator_rows.group_bn(strategy, TINY).result == "PASS"
  # The fault: each replica normalises by its own batch only.
  monkeypatch.setattr(bn_all_reduce, "group_all_reduce",
                      lambda x, *args, **kwargs: x)
  row = accelerator_rows.group_bn(strategy, TINY)
  assert row.result == "FAIL" and row.measured["y_error"] > 1e-2


def test_replicas_equal_one_device_fails_on_local_bn(tmp_path, monkeypatch):
  monkeypatch.setattr(bn_all_reduce, "group_all_reduce",
                      lambda x, *args, **kwargs: x)
  row = accelerator_rows.replicas_equal_one_device(cpu_strategy(2), TINY,
                                                     str(tmp_path))
  assert row.result == "FAIL" and row.measured["update_error"] > 1e-2


def _nan_images(n, image_size, seed=0):
  images = np.full((n, image_size, image_size, 3), np.nan, np.float32)
  return images, np.zeros(n, np.int32)


def test_bfloat16_step_fails_on_a_non_finite_loss(tmp_path, monkeypatch):
  monkeypatch.setattr(
      accelerator_rows, "_synthetic_iterator",
      lambda trainer: iter(trainer.strategy.distribute_datasets_from_function(
          lambda ctx: tf.data.Dataset.from_tensors(_nan_images(
              ctx.get_per_replica_batch_size(
                  trainer.cfg.run.global_batch_size),
              trainer.cfg.model.image_size)).repeat())))
  row = accelerator_rows.bfloat16_step(cpu_strategy(1), TINY, str(tmp_path))
  assert row.result == "FAIL" and row.measured["nonfinite_steps"] == 1


def test_xla_compile_fails_when_the_compiled_step_is_not_finite(
    tmp_path, monkeypatch):
  ran = accelerator_rows.Sizes(**{**TINY.__dict__, "run_xla": True})
  monkeypatch.setattr(accelerator_rows, "_examples", _nan_images)
  row = accelerator_rows.xla_step(cpu_strategy(1), ran, str(tmp_path),
                                    "float32")
  assert row.result == "FAIL" and row.measured["nonfinite"] > 0
  assert "NON-FINITE" in row.detail


def test_throughput_fails_below_its_floor(tmp_path, monkeypatch):
  # Ours measured at half Keras's images/s (the tiny check above measures
  # them for real): below a floor of 0.8, above one of 0.4.
  rates = {None: 10.0, bench_common.keras_resnet50: 20.0}  # by model_fn
  monkeypatch.setattr(accelerator_rows, "TensorFlowEngine",
                      lambda cfg, strategy, model_fn: model_fn)
  monkeypatch.setattr(accelerator_rows, "_images_per_second",
                      lambda model_fn, steps: lambda: rates[model_fn])
  for floor, result in ((0.8, "FAIL"), (0.4, "PASS")):
    row = accelerator_rows.throughput(cpu_strategy(1), TINY, str(tmp_path),
                                      "float32", 1, min_ratio=floor)
    assert row.result == result
    assert row.measured["ours_vs_keras"] == 0.5
    assert "10.0 vs 20.0 images/s per chip, ours/Keras 0.50x" in row.detail


def test_a_tpu_slices_chips_come_from_its_topology():
  # v3-32: 16 chips of 2 cores on 4 hosts; v4-32: 16 chips of one core.
  for name, chips, hosts in (("v3-32", 16, 4), ("v4-32", 16, 4),
                             ("v3-8", 4, 1)):
    summary = accelerator_report.topology_summary(simulated_topology(name))
    assert (summary["num_chips"], summary["num_hosts"]) == (chips, hosts)
  assert accelerator_report.chips("tpu", None, summary) == 4


@pytest.mark.parametrize("capability,arches,native,says", [
    ((8, 9), ["sm_80", "sm_89", "compute_90"], True, None),
    ((9, 0), ["sm_80", "sm_89", "compute_90"], False, "JIT-compiled from "
     "compute_90 PTX"),
    ((10, 0), ["sm_80", "sm_89", "compute_90"], False, "not supported"),
    ((7, 0), ["sm_80", "compute_90"], False, "not supported")])
def test_a_gpu_without_native_code_is_warned_about(capability, arches,
                                                   native, says):
  warning = accelerator_report.gpu_native_code(capability, arches)
  assert (warning is None) == native
  if says:
    assert says in warning
