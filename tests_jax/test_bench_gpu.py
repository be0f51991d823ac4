"""The GPU bench (lab/bench_gpu.py) on JAX CPU devices: its virtual
replicas are the step on real ones (at 8 images a replica: BN over 2 values
per channel magnifies rounding past any tolerance), and a tiny run writes
its report."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from lab import bench_gpu
from resnet_tpu.config import ModelConfig
from resnet_tpu.model.resnet import build_model
from resnet_tpu.optim.optimizers import build_optimizer
from resnet_tpu.parallel.bn_all_reduce_jax import build_mesh
from resnet_tpu.train.jax_step import JaxTrainStep
from resnet_tpu.train.jax_step import LossConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _steps(group_size: int) -> tuple[JaxTrainStep, JaxTrainStep]:
  """The step on 8 devices and on 1, from the same weights."""
  steps = []
  for devices in (8, 1):
    model = build_model(ModelConfig(resnet_depth=18, image_size=32,
                                    num_classes=10, bn_group_size=group_size,
                                    zero_init_gamma=False))
    if steps:
      model.set_weights(steps[0].model.get_weights())
    steps.append(JaxTrainStep(
        model, build_optimizer("momentum", 0.1),
        build_mesh(group_size if devices > 1 else 1, jax.devices()[:devices]),
        LossConfig(10, 64, 0.1, 1e-4)))
  return steps[0], steps[1]


@pytest.mark.parametrize("group_size", [1, 2])
def test_virtual_replicas_are_the_step_on_as_many_devices(group_size):
  rng = np.random.RandomState(0)
  images = rng.uniform(0, 255, (64, 32, 32, 3)).astype(np.float32)
  labels = rng.randint(0, 10, 64).astype(np.int32)
  real, one = _steps(group_size)
  want, want_sums = real.step(real.state(), *real.shard_batch(images, labels))
  virtual = bench_gpu.virtual_replicas_step(one, 8, group_size)
  got, got_sums = virtual(one.state(), images, labels)
  np.testing.assert_allclose(got_sums[0, 0], np.stack(
      [want_sums[k] for k in ("loss", "top1", "top5", "examples")]),
                             rtol=1e-5)
  for a, b in zip(got.trainable + got.non_trainable,
                  want.trainable + want.non_trainable):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


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
