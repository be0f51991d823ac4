"""The GPU bench (lab/bench_gpu.py) on JAX CPU devices: its virtual
replicas are the step on real ones, and a tiny run writes its report.

The step is compared in float64, as test_engines.py compares the engines.
In float32, BN over few values per channel magnifies rounding: in this
test's first form (ResNet-18 at 32 px, 8 images a replica, float32), a
change of one unit in the last place of the images moved a weight's update
by up to 0.9 %, and how the virtual and the real step round depends on the
CPU's kernels: they agreed to 1.2e-7 on an AMD EPYC and differed by 1.5e-4
(stem kernel) on CI's machine, where that form's tolerance (1e-4 relative
plus 1e-5) failed. In float64, from seed 0, the virtual step's changes are
within 0.8 % (group 2) and 0.6 % (group 8) of the tolerance, and the two
groupings' steps differ by 8e3 times it."""
import json
import os
import subprocess
import sys

import jax
import keras
import numpy as np
import pytest

import engine_cases as cases
from lab import bench_gpu
from resnet_tpu.optim.optimizers import build_optimizer
from resnet_tpu.parallel.bn_all_reduce_jax import build_mesh
from resnet_tpu.engines.jax.step import JaxTrainStep
from resnet_tpu.engines.jax.state import LossConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# As test_engines.TOLERANCES: 1e-3 relative plus 2e-4 of the tensor's
# largest magnitude, on each weight's and moving statistic's change.
RTOL, ATOL_OF_MAX = 1e-3, 2e-4


def _step(group_size: int, devices: int, weights: list) -> JaxTrainStep:
  """engine_cases' float64 step case at `group_size` on `devices` devices,
  from `weights` (None: the builder's own)."""
  cfg = cases.step_config("float64", group_size)
  model = cases.build_network("float64", cfg)
  if weights is not None:
    model.set_weights(weights)
  return JaxTrainStep(
      model, build_optimizer("momentum", cases.LEARNING_RATE),
      build_mesh(group_size if devices > 1 else 1, jax.devices()[:devices]),
      LossConfig(cfg.model.num_classes, cfg.run.global_batch_size,
                 cfg.optim.label_smoothing, cfg.optim.weight_decay))


def _changes(state, start) -> list:
  return [np.asarray(after, np.float64) - before for after, before in zip(
      state.trainable + state.non_trainable, start)]


def _worst(got: list, want: list) -> float:
  """The largest difference over its tolerance: at most 1 where they agree."""
  return max(float(np.max(np.abs(g - w) / (
      RTOL * np.abs(w) + ATOL_OF_MAX * max(np.abs(w).max(), 1e-30))))
             for g, w in zip(got, want))


def test_virtual_replicas_are_the_step_on_as_many_devices():
  """At BN groups of 2 (4 groups) and of 8 (one), from the same weights and
  batch; the two groupings' own steps disagree (the control: the tolerance
  tells groupings apart)."""
  keras.utils.set_random_seed(0)
  images, labels = cases.batch("float64")
  changes = {}
  with jax.enable_x64(True):
    weights = start = None
    for group_size in (2, 8):
      real = _step(group_size, cases.REPLICAS, weights)
      if weights is None:
        weights = real.model.get_weights()
        first = jax.device_get(real.state())
        start = [np.asarray(v, np.float64)
                 for v in first.trainable + first.non_trainable]
      want, want_sums = real.step(real.state(),
                                  *real.shard_batch(images, labels))
      one = _step(group_size, 1, weights)
      virtual = bench_gpu.virtual_replicas_step(one, cases.REPLICAS,
                                                group_size)
      got, got_sums = virtual(one.state(), images, labels)
      np.testing.assert_allclose(got_sums[0, 0], np.stack(
          [want_sums[k] for k in ("loss", "top1", "top5", "examples")]),
                                 rtol=1e-6, err_msg=f"group {group_size}")
      changes[group_size] = _changes(want, start)
      worst = _worst(_changes(got, start), changes[group_size])
      assert worst <= 1, f"group {group_size}: {worst:.2e} of the tolerance"
  assert _worst(changes[2], changes[8]) > 1


def test_a_tiny_run_reports_every_workload(tmp_path):
  subprocess.run(
      [sys.executable, "-m", "lab.bench_gpu", f"--output_dir={tmp_path}",
       "--depth=18", "--image_size=32", "--batch_size=16",
       "--num_classes=10", "--bn_images=4", "--steps=2", "--repeats=2",
       "--warmup_steps=1", "--budget_s=400",
       "--workloads=ours,stock_layers,ours_bn32,torch_eager"],
      cwd=ROOT, check=True, timeout=600,
      env=dict(os.environ, PYTHONPATH=ROOT))
  report = json.load(open(tmp_path / "gpu_bench.json"))
  workloads = report["workloads"]
  for name in ("ours", "stock_layers", "ours_bn32"):
    result = workloads[name]
    assert result["images_per_s"] > 0 and result["step_ms"] > 0, name
    low, high = result["images_per_s_range"]
    assert low <= result["images_per_s"] <= high
    assert result["flops_per_step"] > 0 and 0 < result["mfu"], name
    assert result["compile_s"] > 0
  # Where torch is not installed the workload says so, and the run goes on.
  torch = workloads["torch_eager"]
  assert "images_per_s" in torch or "No module named 'torch'" in torch[
      "skipped"]
  assert set(report["ratios"]) >= {"ours_vs_stock_layers",
                                   "ours_bn32_vs_ours"}
  assert report["ratios"]["ours_vs_stock_layers"] == pytest.approx(
      workloads["ours"]["images_per_s"] /
      workloads["stock_layers"]["images_per_s"])
