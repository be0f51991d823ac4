"""Every collective of the compiled JAX training step, counted (as
tests/test_collective_census.py does for TensorFlow's).

One step of ResNet-18 on 8 CPU devices should communicate through two
kinds of all-reduce and nothing else (engines/jax/step.py):
- one over all replicas, carrying every gradient, every BN moving statistic
  and the metric sums as one variadic all-reduce (Ying et al. §3.3's sum,
  the moving statistics' average of moving_statistics.py);
- the BN group sums over the mesh's in-group axis (§3.1): per BN layer one
  forward ([sum, sum of squares, count]) and one backward. XLA may merge
  independent ones (a block's projection BN and its first BN) into one
  variadic all-reduce, so both the ops and their operands are pinned.
No all-gather, reduce-scatter, all-to-all, collective-permute, broadcast,
send or receive of any kind.
"""
import re

import numpy as np
import pytest

from resnet_tpu.config import ModelConfig
from resnet_tpu.model.resnet import build_model
from resnet_tpu.optim.optimizers import build_optimizer
from resnet_tpu.parallel.bn_all_reduce_jax import build_mesh
from resnet_tpu.parallel.bn_all_reduce_jax import GROUPS_AXIS
from resnet_tpu.parallel.bn_all_reduce_jax import IN_GROUP_AXIS
from resnet_tpu.engines.jax.step import JaxTrainStep
from resnet_tpu.engines.jax.state import LossConfig

DEVICES = 8
BN_LAYERS = 20  # ResNet-18
TRAINABLE = 62  # 20 conv kernels, 20 gammas and betas, the logits' 2
# A projection BN's beta gradient is the sum of the same dy as the block's
# last BN's (both feed the residual Add): XLA passes that tensor once.
SHARED_GRADIENTS = 3
# Every HLO instruction that moves data between devices, as XLA names
# them (sync and async forms).
COLLECTIVE = re.compile(
    r"^\s*(?:ROOT )?%?[\w.-]+ = [^\n]*? (all-reduce|all-reduce-start|"
    r"all-gather|all-gather-start|reduce-scatter|all-to-all|"
    r"ragged-all-to-all|collective-permute|collective-permute-start|"
    r"collective-broadcast|send|recv)\((.*)$", re.M)
# What an asynchronous collective's start op counts as.
ASYNC_STARTS = {"all-reduce-start": "all-reduce",
                "all-gather-start": "all-gather",
                "collective-permute-start": "collective-permute"}
GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}")
# Pinned: group size -> (BN all-reduce ops, their operands). Groups of 1
# need no BN sum. XLA merges 6 pairs of independent group sums (the
# projection BN of stages 2-4 with the block's first BN, forward and back).
BN_ALL_REDUCES = {1: (0, 0), 2: (34, 40), 4: (34, 40), 8: (34, 40)}


def census(group_size: int) -> list[tuple[str, int, str, tuple[str, ...]]]:
  """(kind, operands, mesh shape, reduced axes) of every collective in the
  compiled step at BN groups of `group_size`."""
  model = build_model(ModelConfig(resnet_depth=18, image_size=32,
                                  num_classes=10, bn_group_size=group_size))
  step = JaxTrainStep(model, build_optimizer("momentum", 0.1),
                      build_mesh(group_size), LossConfig(10, 16, 0.1, 1e-4))
  images = np.zeros((16, 32, 32, 3), np.float32)
  labels = np.zeros(16, np.int32)
  return collectives(step.step.lower(
      step.state(), *step.shard_batch(images, labels)).compile().as_text())


def collectives(hlo: str) -> list[tuple[str, int, str, tuple[str, ...]]]:
  """(kind, operands, mesh shape, reduced axes) of every collective of
  `hlo`. An asynchronous pair (GPU's and TPU's all-reduce-start ... -done)
  is one all-reduce, counted at its start, which holds the operands."""
  found = []
  for kind, rest in COLLECTIVE.findall(hlo):
    operands = rest.split(")", 1)[0].count("%")
    groups = GROUPS.search(rest)
    mesh, axes = groups.groups() if groups else ("", "")
    found.append((ASYNC_STARTS.get(kind, kind), operands, mesh,
                  tuple(a.strip(" '") for a in axes.split(","))))
  return found


@pytest.mark.parametrize("group_size", [1, 2, 4, 8])
def test_the_step_communicates_only_through_its_all_reduces(group_size):
  found = census(group_size)
  assert {kind for kind, *_ in found} <= {"all-reduce"}, found
  mesh = f"'{GROUPS_AXIS}'={DEVICES // group_size},'{IN_GROUP_AXIS}'={group_size}"
  assert {m for _, _, m, _ in found} == {mesh}
  everyone = [f for f in found if set(f[3]) == {GROUPS_AXIS, IN_GROUP_AXIS}]
  in_group = [f for f in found if f[3] == (IN_GROUP_AXIS,)]
  assert len(everyone) + len(in_group) == len(found), found
  # One gradient all-reduce: every gradient, 2 moving statistics per BN
  # layer, the metric sums.
  assert [operands for _, operands, _, _ in everyone] == [
      TRAINABLE - SHARED_GRADIENTS + 2 * BN_LAYERS + 1]
  assert (len(in_group), sum(f[1] for f in in_group)) == (
      BN_ALL_REDUCES[group_size])
  # Per BN layer a forward and a backward group sum, whatever XLA merged.
  if group_size > 1:
    assert sum(f[1] for f in in_group) == 2 * BN_LAYERS


def test_the_census_sees_collectives_it_was_not_told_of():
  """Guards the census: its pattern matches each kind in XLA's syntax."""
  for kind in ("all-gather", "reduce-scatter", "all-to-all",
               "collective-permute", "all-reduce-start", "send", "recv"):
    line = f"  %x.1 = f32[4]{{0}} {kind}(%y), channel_id=2"
    assert [k for k, _ in COLLECTIVE.findall(line)] == [kind]


def test_an_asynchronous_all_reduce_counts_once_with_its_operands():
  """GPU and TPU compile the step's all-reduces as -start/-done pairs; CPU
  (these tests) as all-reduce: the census reads both the same."""
  groups = f"replica_groups=mesh['{GROUPS_AXIS}'=4,'{IN_GROUP_AXIS}'=2]"
  sync = (f"  %all-reduce.3 = (f32[8]{{0}}, f32[]) all-reduce(%p.1, %p.2), "
          f"channel_id=1, {groups} {{'{IN_GROUP_AXIS}'}}, to_apply=%add")
  start = sync.replace("%all-reduce.3", "%all-reduce-start.3").replace(
      "all-reduce(", "all-reduce-start(")
  done = ("  %all-reduce-done.3 = (f32[8]{0}, f32[]) "
          "all-reduce-done(%all-reduce-start.3)")
  assert collectives(start + "\n" + done) == collectives(sync) == [
      ("all-reduce", 2, f"'{GROUPS_AXIS}'=4,'{IN_GROUP_AXIS}'=2",
       (IN_GROUP_AXIS,))]
