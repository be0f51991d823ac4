"""lab/dev/op_profile.py: op categories, trace parsing, and a tiny run."""
import json
import os
import subprocess
import sys

import pytest
from tensorflow.tsl.profiler.protobuf import xplane_pb2

from lab.dev import op_profile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEP = "while/body/_1/while/"
GRAD = "while/body/_1/gradient_tape/while/"


@pytest.mark.parametrize("node, op_type, expected", [
    (STEP + "resnet50_v1_5_1/stage1_block1_conv2_1/convolution",
     "_MklNativeConv2D", "conv forward"),
    (STEP + "resnet50_1/conv2_block1_1_conv/BiasAdd", "_MklNativeFusedConv2D",
     "conv forward"),
    (GRAD + "resnet50_1/conv2_block1_1_conv/convolution/Conv2DBackpropFilter",
     "_MklNativeConv2DBackpropFilterWithBias", "conv backprop to filter"),
    (GRAD + "resnet50_v1_5_1/stem_conv_1/convolution/Conv2DBackpropInput",
     "_MklNativeConv2DBackpropInput", "conv backprop to input"),
    (STEP + "resnet50_v1_5_1/stage1_block1_bn1_1/FusedBatchNormV3",
     "_MklNativeFusedBatchNormEx", "batch norm"),
    # Keras's BN: a chain of separate ops inside the layer, and their grads.
    (STEP + "resnet50_1/conv2_block1_1_bn/moments/mean", "Mean", "batch norm"),
    (GRAD + "resnet50_1/conv4_block2_3_bn/batchnorm/mul/Mul", "Mul",
     "batch norm"),
    (STEP + "replica_3/group_batch_norm_grad/mul_2", "Mul", "batch norm"),
    (STEP + "replica_1/resnet18_1/stage1_block1_bn1_1/CollectiveReduceV2",
     "CollectiveReduceV2", "BN group all-reduce"),
    (STEP + "replica_5/group_batch_norm_grad/CollectiveReduceV2",
     "CollectiveReduceV2", "BN group all-reduce"),
    (STEP + "sgd/CollectiveReduceV2_3", "CollectiveReduceV2",
     "gradient all-reduce"),
    (STEP + "CollectiveReduceV2", "CollectiveReduceV2",
     "other all-reduce (loss, metrics)"),
    (STEP + "L2Loss_12", "L2Loss", "weight decay (L2 term)"),
    (STEP + "sgd/update_0_3/AssignAddVariableOp", "AssignAddVariableOp",
     "optimizer update"),
    (STEP + "resnet50_v1_5_1/stage1_block1_add_1/add", "AddV2", "other"),
    (STEP + "IsFinite_3", "IsFinite", "other"),
])
def test_each_op_lands_in_its_category(node, op_type, expected):
  assert op_profile.category(node, op_type) == expected


def _xspace(events_by_line: dict[str, list[tuple[str, int]]]):
  """One host plane; events given as (metadata name, duration in us)."""
  xspace = xplane_pb2.XSpace()
  plane = xspace.planes.add(name="/host:CPU")
  ids = {}
  for line_name, events in events_by_line.items():
    line = plane.lines.add(name=line_name)
    for name, micros in events:
      if name not in ids:
        ids[name] = len(ids) + 1
        plane.event_metadata[ids[name]].name = name
      line.events.add(metadata_id=ids[name], duration_ps=micros * 10**6)
  return xspace


def test_op_times_sums_op_kernels_of_the_op_threads_only():
  conv = (STEP + "m/conv/convolution", "_MklNativeConv2D")
  reduce = (STEP + "sgd/CollectiveReduceV2", "CollectiveReduceV2")
  xspace = _xspace({
      "tf_Compute/1": [(":".join(conv), 300), ("ExecutorState::Process", 999),
                       (STEP + "while:While", 5000), (":".join(conv), 200)],
      "tf_Compute/2": [(":".join(conv), 100)],
      "collective_ops/7": [(":".join(reduce), 40),
                           ("CollectiveExecutor::RunClosure", 999)],
      "python": [(":".join(conv), 999)],
  })
  times = op_profile.op_times(xspace)
  assert times == {conv: pytest.approx(600e-6), reduce: pytest.approx(40e-6)}
  totals = op_profile.by_category(times)
  assert totals["conv forward"] == pytest.approx(600e-6)
  assert totals["gradient all-reduce"] == pytest.approx(40e-6)
  assert sum(totals.values()) == pytest.approx(640e-6)


def test_tiny_profile_finds_the_step_s_ops(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "lab.dev.op_profile", "--tiny", "--steps=1",
       "--workloads=ours,bn_group4", "--repetitions=2",
       f"--output_dir={tmp_path}"],
      cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  with open(tmp_path / "op_profile_ours_bn_group4.json") as f:
    results = json.load(f)["results"]
  ours, group4 = results["ours"]["op_ms"], results["bn_group4"]["op_ms"]
  for cat in ("conv forward", "conv backprop to filter", "batch norm",
              "optimizer update"):
    assert ours[cat] > 0, cat
  assert ours["BN group all-reduce"] == 0
  assert group4["BN group all-reduce"] > 0
  assert group4["gradient all-reduce"] > 0
  # The backward group all-reduce is named as BN too (group_batch_norm_grad).
  assert group4["other all-reduce (loss, metrics)"] == 0
  assert results["ours"]["op_ms_total"] == pytest.approx(sum(ours.values()))
  assert len(results["bn_group4"]["op_ms_runs"]) == 2
  assert "| BN group all-reduce |" in result.stdout


@pytest.mark.parametrize("args, named", [
    (["--workloads=ours,resnet"], ["resnet", "--workloads"]),
    (["--repetitions=0"], ["--repetitions"]),
])
def test_bad_flags_are_named(args, named):
  result = subprocess.run(
      [sys.executable, "-m", "lab.dev.op_profile", *args],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  for text in named:
    assert text in result.stderr
