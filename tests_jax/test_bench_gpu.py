"""The GPU bench (lab/bench_gpu.py) on JAX CPU devices: its virtual
replicas are the step on real ones and run ordinary convolutions, its
budget lets the first workloads finish and bounds a hang, its model FLOPs
are torchvision's and (without padding) XLA's, its main.py run is read as
it is logged, and a tiny run of make bench-gpu without TensorFlow writes
its report (a Python without Keras or its wheels is told what to do by
lab/bench_gpu.sh, the script the target runs).

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
import re
import subprocess
import sys

import jax
import jaxlib
import keras
import numpy as np
import pytest

import engine_cases as cases
from lab import bench_gpu
from lab import bench_gpu_loop
from lab import model_flops
from x64 import enable_x64
from resnet_tpu.optim.optimizers import build_optimizer
from resnet_tpu.parallel.jax.bn_all_reduce import build_mesh
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
  with enable_x64(True):
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
      np.testing.assert_allclose(got_sums, np.stack(
          [want_sums[k] for k in ("loss", "top1", "top5", "examples")]),
                                 rtol=1e-6, err_msg=f"group {group_size}")
      changes[group_size] = _changes(want, start)
      worst = _worst(_changes(got, start), changes[group_size])
      assert worst <= 1, f"group {group_size}: {worst:.2e} of the tolerance"
  assert _worst(changes[2], changes[8]) > 1


def _convolutions(hlo: str) -> list[str]:
  """The convolution instructions of an HLO module's text."""
  return [line for line in hlo.splitlines()
          if re.search(r"= \S+ convolution\(", line)]


def test_virtual_replicas_take_ordinary_convolutions():
  """The grouped step's compiled HLO holds no feature-grouped convolution:
  its kernel gradients are the ones one GPU of a real step runs, not the
  batched form vmap gives a gradient taken per replica (jax-ml/jax#13800;
  issue 60)."""
  cfg = cases.step_config("float32", 2)
  one = JaxTrainStep(
      cases.build_network("float32", cfg),
      build_optimizer("momentum", cases.LEARNING_RATE),
      build_mesh(1, jax.devices()[:1]),
      LossConfig(cfg.model.num_classes, cfg.run.global_batch_size,
                 cfg.optim.label_smoothing, cfg.optim.weight_decay))
  step = bench_gpu.virtual_replicas_step(one, cases.REPLICAS, 2)
  hlo = step.lower(one.state(), *cases.batch()).compile().as_text()
  convolutions = _convolutions(hlo)
  # ResNet-18's 20 convolutions, forward and backward.
  assert len(convolutions) > 40
  grouped = [c for c in convolutions
             if re.search(r"(feature|batch)_group_count=([2-9]|\d\d)", c)]
  assert not grouped, f"{len(grouped)} grouped, e.g. {grouped[0][:300]}"


class FakeClock:
  """A clock that the fake workloads move on."""

  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


def _drive(takes: dict, budget_s: float) -> tuple[dict, dict, list]:
  """bench_gpu.drive over workloads that each take takes[name] seconds (at
  most their timeout: a hang). Returns the results, the timeouts given and
  the workloads each on_result call saw."""
  clock, given, seen = FakeClock(), {}, []

  def run_one(workload, timeout_s):
    given[workload] = timeout_s
    clock.now += min(takes[workload], timeout_s)
    if takes[workload] > timeout_s:
      return {"skipped": f"over its {timeout_s:.0f} s"}
    return {"images_per_s": 1.0}

  results = bench_gpu.drive(list(takes), budget_s, run_one,
                            lambda r: seen.append(list(r)), clock)
  return results, given, seen


def test_the_first_workloads_take_all_they_need_and_a_hang_is_bounded():
  """No time is held back for later workloads: the first two get what is
  left (at most WORKLOAD_TIMEOUT_S), so slow ResNet-50 compiles still
  finish; a hang costs WORKLOAD_TIMEOUT_S, less than half the budget; the
  last, left under MIN_SLOT_S, is skipped and says why; the report is
  written after every workload."""
  budget = bench_gpu.FLAGS["budget_s"].default
  assert bench_gpu.WORKLOAD_TIMEOUT_S < budget / 2
  takes = {"ours": 120, "loop": 150, "hang": 1e9, "last": 10}
  results, given, seen = _drive(takes, budget)
  assert given["ours"] == bench_gpu.WORKLOAD_TIMEOUT_S
  assert given["loop"] == bench_gpu.WORKLOAD_TIMEOUT_S
  assert results["ours"] == results["loop"] == {"images_per_s": 1.0}
  assert given["hang"] == budget - 270
  assert "over its" in results["hang"]["skipped"]
  assert "last" not in given
  assert "time budget spent" in results["last"]["skipped"]
  assert seen == [list(takes)[:i + 1] for i in range(len(takes))]


def test_after_a_hang_the_rest_still_run():
  budget = bench_gpu.FLAGS["budget_s"].default
  takes = {"hang": 1e9, "ours": 60, "loop": 90}
  results, given, _ = _drive(takes, budget)
  assert given["hang"] == bench_gpu.WORKLOAD_TIMEOUT_S
  assert results["ours"] == results["loop"] == {"images_per_s": 1.0}


def test_the_v15_network_has_torchvisions_multiply_adds():
  """ResNet-50 v1.5 at 224 px: 4.09 G multiply-adds an image, torchvision's
  figure for its resnet50 ("GFLOPS": 4.09, ResNet50_Weights; the network
  torch_eager and torch_compile run, whose MFU takes this count), and
  keras.applications' v1 the 3.86 G of its layout (stride 2 on the first
  1x1 conv of a stage, not the 3x3)."""
  for workload, giga in (("ours", 4.09), ("stock_layers", 4.09),
                         ("keras_app", 3.86)):
    model = bench_gpu.keras_model(workload, 50, 224, 1000)
    macs = model_flops.forward_flops(model) / 2
    assert round(macs / 1e9, 2) == giga, (workload, macs)


def test_the_model_flops_are_xlas_where_no_padding_is_skipped():
  """On a network without padding (valid convolutions, strided and not, a
  dense layer), a training step's FLOPs as model_flops counts them (3 x the
  forward pass) against XLA's count on the CPU, where the convolutions are
  XLA's own ops: within 5 % (XLA adds the element-wise work)."""
  inputs = keras.Input((17, 17, 8))
  x = keras.layers.Conv2D(16, 3, strides=2, padding="valid")(inputs)
  x = keras.layers.Conv2D(32, 3, padding="valid")(x)
  x = keras.layers.Conv2D(24, 1, padding="valid")(x)
  x = keras.layers.GlobalAveragePooling2D()(x)
  logits = keras.layers.Dense(10)(x)
  model = keras.Model(inputs, logits)
  batch = 4

  def loss(trainable, images):
    out, _ = model.stateless_call(trainable, [], images)
    return (out ** 2).sum()

  trainable = [v.value for v in model.trainable_variables]
  images = np.ones((batch, 17, 17, 8), np.float32)
  # The images' gradient too, so that the first convolution's backward pass
  # is whole, as every later one's is.
  step = jax.jit(jax.grad(loss, argnums=(0, 1)))
  xla = bench_gpu._xla_flops(step.lower(trainable, images).compile())
  counted = model_flops.training_flops(model, batch)
  assert counted == pytest.approx(xla, rel=0.05), (counted, xla)


# An absl log of main.py with JAX_LOG_COMPILES=1: compiles before and
# after the first host loop's line, a save 1.25 s after the last one's.
LOG = """\
W1206 23:59:50.000000 1 pxla.py:712] Compiling step with global shapes
I1206 23:59:58.500000 1 loop_report.py:105] step 2/4: loss 2.2 top-1 0.1
W1206 23:59:59.000000 1 pxla.py:712] Compiling gather with global shapes
I1206 23:59:59.250000 1 loop_report.py:105] step 4/4: loss 2.0 top-1 0.2
I1207 00:00:00.500000 1 npz_checkpoints.py:82] Saved checkpoint /r/ckpt-4.npz
"""


def test_the_loop_counts_compiles_after_its_first_loop_and_times_the_save():
  records = [{"examples": 16, "images_per_sec": 2.0},
             {"examples": 16, "images_per_sec": 32.0}]
  got = bench_gpu_loop.read_run(LOG, records)
  assert got["compiles_through_first_loop"] == 1
  assert got["compiles_after_first_loop"] == 1
  assert got["compiled_after_first_loop"] == ["gather"]
  assert got["checkpoint"] == "ckpt-4.npz"
  assert got["checkpoint_s"] == pytest.approx(1.25)
  assert got["first_loop_s"] == 8.0
  assert got["images_per_s"] == 32.0


# On PYTHONPATH: every process of the run, the bench's parent, its workers
# and its main.py, as on the H200's image: no TensorFlow, so that Keras
# cannot import without KERAS_BACKEND (the workers set it) and the JAX
# engine checkpoints to .npz.
HIDE_TENSORFLOW = os.path.join(ROOT, "tests_jax", "hide_tensorflow")


def test_a_tiny_run_reports_every_workload(tmp_path):
  # No XLA_FLAGS: main.py's --strategy=auto takes JAX's one CPU device, as
  # on the H200 its one GPU.
  env = {k: v for k, v in os.environ.items()
         if k not in ("KERAS_BACKEND", "XLA_FLAGS")}
  env["PYTHONPATH"] = HIDE_TENSORFLOW
  # Through the make target the lent GPU runs (make adds the repository to
  # PYTHONPATH); this Python has Keras, so it installs no wheels.
  subprocess.run(
      ["make", "-s", "-C", ROOT, "bench-gpu", f"BENCH_PYTHON={sys.executable}",
       f"BENCH_OUT={tmp_path}", "BENCH_FLAGS=" + " ".join([
           "--depth=18", "--image_size=32", "--batch_size=16",
           "--num_classes=10", "--bn_images=4", "--steps=2",
           "--warmup_steps=1", "--loop_steps_per_loop=2",
           "--loop_host_loops=3", "--budget_s=400", "--torch_device=cpu",
           "--workloads=ours,loop,stock_layers,ours_bn32,torch_eager,"
           "torch_compile"])],
      cwd=ROOT, check=True, timeout=600, env=env)
  report = json.load(open(tmp_path / "gpu_bench.json"))
  assert report["finished"]
  workloads = report["workloads"]
  for name in ("ours", "stock_layers", "ours_bn32"):
    result = workloads[name]
    assert len(result["window_s"]) == 5, name
    assert result["images_per_s"] > 0 and result["step_ms"] > 0, name
    low, high = result["images_per_s_range"]
    assert low <= result["images_per_s"] <= high
    assert result["model_flops_per_step"] > 0 and 0 < result["mfu"], name
    assert result["xla_flops_per_step"] > 0, name
    assert result["compile_s"] > 0
  # Where torch is not installed the workloads say so, and the run goes on;
  # where it is, they run on the CPU.
  for name in ("torch_eager", "torch_compile"):
    torch = workloads[name]
    assert ("No module named 'torch'" in torch.get("skipped", "") or
            len(torch["window_s"]) == 5 and torch["images_per_s"] > 0
            and torch["platform"] == "cpu"), (name, torch)
  versions = report["versions"]
  assert versions["keras"] == keras.__version__
  assert versions["jax"] == jax.__version__
  assert versions["jaxlib"] == jaxlib.__version__
  assert versions["device"] == jax.devices()[0].device_kind
  assert set(versions) >= {"torch", "torchvision", "python"}
  assert set(report["ratios"]) >= {"ours_vs_stock_layers",
                                   "ours_bn32_vs_ours", "loop_vs_ours"}
  loop = workloads["loop"]
  assert loop["host_loops"] == 3 and len(loop["loop_images_per_s"]) == 2
  assert loop["images_per_s"] > 0 and loop["first_loop_s"] > 0
  assert report["ratios"]["loop_vs_ours"] == pytest.approx(
      loop["images_per_s"] / workloads["ours"]["images_per_s"])
  assert loop["compiles_through_first_loop"] > 0  # JAX_LOG_COMPILES read
  assert loop["compiles_after_first_loop"] == 0, loop[
      "compiled_after_first_loop"]
  assert loop["checkpoint"] == "ckpt-6.npz"  # TensorFlow was hidden
  assert 0 < loop["checkpoint_s"] < loop["wall_s"]
  assert (tmp_path / "gpu_bench_loop.log").is_file()
  workers_log = (tmp_path / "gpu_bench_workers.log").read_text()
  for name in ("ours", "stock_layers", "ours_bn32", "torch_eager"):
    assert f"==== {name}: the last" in workers_log
  assert report["ratios"]["ours_vs_stock_layers"] == pytest.approx(
      workloads["ours"]["images_per_s"] /
      workloads["stock_layers"]["images_per_s"])


def test_bench_gpu_without_keras_or_its_wheels_says_what_to_do(tmp_path):
  """A Python without Keras (-S: no site-packages) and no wheels to install
  it from: one line names both and the command that fetches them, before
  any workload starts. Through the script that make bench-gpu runs, as a
  machine without make runs it (the tiny run above goes through make)."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(BENCH_PYTHON=f"{sys.executable} -S", BENCH_OUT=str(tmp_path),
             BENCH_WHEELS=f"{tmp_path}/none")
  done = subprocess.run(
      ["sh", os.path.join(ROOT, "lab", "bench_gpu.sh")], cwd=tmp_path,
      capture_output=True, text=True, timeout=60, env=env)
  assert done.returncode != 0
  assert "has no Keras" in done.stderr and "make bench-gpu-wheels" in (
      done.stderr), done.stderr
  assert not (tmp_path / "gpu_bench.json").exists()
