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
send or receive of any kind. Where XLA combines no all-reduces (jaxlib
0.6.2 on CPU: COMBINED), the same sums are each their own all-reduce.
"""
import re

import jax
import numpy as np
import pytest

from resnet_tpu.config import ModelConfig
from resnet_tpu.model.resnet import build_model
from resnet_tpu.optim.optimizers import build_optimizer
from resnet_tpu.parallel.jax.bn_all_reduce import build_mesh
from resnet_tpu.parallel.jax.bn_all_reduce import GROUPS_AXIS
from resnet_tpu.parallel.jax.bn_all_reduce import IN_GROUP_AXIS
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
# XLA prints a collective's device groups three ways, by version: over a
# named mesh (jax 0.11: replica_groups=mesh['groups'=4,'in_group'=2]
# {'in_group'}), as an iota (replica_groups=[4,2]<=[8], with an optional
# transpose T(1,0) of the reshaped iota), or listed (jax 0.10 and 0.6:
# replica_groups={{0,1},{2,3},...}).
MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\] \{([^}]*)\}")
IOTA_GROUPS = re.compile(
    r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
LISTED_GROUPS = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
# Pinned: group size -> (BN all-reduce ops, their operands). Groups of 1
# need no BN sum. XLA merges 6 pairs of independent group sums (the
# projection BN of stages 2-4 with the block's first BN, forward and back).
BN_ALL_REDUCES = {1: (0, 0), 2: (34, 40), 4: (34, 40), 8: (34, 40)}
# XLA:CPU as jaxlib 0.6.2 (the last JAX for Python 3.10) builds it combines
# no all-reduces: each tensor is summed on its own, every gradient (the
# shared ones too), moving statistic, metric sum and BN group sum; 0.10.2
# and 0.11.2 combine them as pinned above.
COMBINED = jax.__version_info__ >= (0, 10)


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


def device_groups(text: str) -> tuple[tuple[int, ...], ...]:
  """The device groups that one collective's `replica_groups=` names, in
  any of XLA's three forms; () where it names none."""
  mesh = MESH_GROUPS.search(text)
  if mesh:
    axes = [a.split("=") for a in mesh.group(1).split(",")]
    names = [name.strip(" '") for name, _ in axes]
    devices = np.arange(np.prod([int(n) for _, n in axes])).reshape(
        [int(n) for _, n in axes])
    reduced = [names.index(a.strip(" '")) for a in mesh.group(2).split(",")]
    kept = [i for i in range(len(names)) if i not in reduced]
    rows = devices.transpose(kept + reduced).reshape(-1, np.prod(
        [devices.shape[i] for i in reduced]))
    return tuple(tuple(int(d) for d in row) for row in rows)
  iota = IOTA_GROUPS.search(text)
  if iota:
    shape, reshape, transpose = (
        [int(n) for n in g.split(",")] if g else None for g in iota.groups())
    devices = np.arange(np.prod(reshape)).reshape(reshape)
    if transpose:
      devices = devices.transpose(transpose)
    return tuple(tuple(int(d) for d in row)
                 for row in devices.reshape(shape))
  listed = LISTED_GROUPS.search(text)
  if listed:
    return tuple(tuple(int(d) for d in group.split(",") if d)
                 for group in re.findall(r"\{([\d,]*)\}", listed.group(1)))
  return ()


def collectives(hlo: str) -> list[tuple[str, int, tuple]]:
  """(kind, operands, device groups) of every collective of `hlo`. An
  asynchronous pair (GPU's and TPU's all-reduce-start ... -done) is one
  all-reduce, counted at its start, which holds the operands."""
  return [(ASYNC_STARTS.get(kind, kind),
           rest.split(")", 1)[0].count("%"), device_groups(rest))
          for kind, rest in COLLECTIVE.findall(hlo)]


def mesh_groups(group_size: int, over: str) -> tuple[tuple[int, ...], ...]:
  """Device groups of a sum over `over` ("all" or IN_GROUP_AXIS) on
  build_mesh(group_size)'s mesh: its devices in order, in-group fastest."""
  devices = np.arange(DEVICES).reshape(DEVICES // group_size, group_size)
  rows = devices.reshape(1, -1) if over == "all" else devices
  return tuple(tuple(int(d) for d in row) for row in rows)


@pytest.mark.parametrize("group_size", [1, 2, 4, 8])
def test_the_step_communicates_only_through_its_all_reduces(group_size):
  found = census(group_size)
  assert {kind for kind, *_ in found} <= {"all-reduce"}, found
  # One gradient all-reduce: every gradient, 2 moving statistics per BN
  # layer, the metric sums.
  gradient_sum = TRAINABLE - SHARED_GRADIENTS + 2 * BN_LAYERS + 1
  everyone = [f for f in found if f[2] == mesh_groups(group_size, "all")]
  in_group = [f for f in found
              if f[2] == mesh_groups(group_size, IN_GROUP_AXIS)]
  if not COMBINED:
    bn_sums = 2 * BN_LAYERS if group_size > 1 else 0
    assert {f[1] for f in found} == {1}, found
    assert len(found) == TRAINABLE + 2 * BN_LAYERS + 1 + bn_sums, found
    if group_size < DEVICES:
      assert (len(everyone), len(in_group)) == (len(found) - bn_sums,
                                                bn_sums)
    return
  if group_size == DEVICES:  # a BN group is everyone: told apart by size
    in_group = [f for f in everyone if f[1] != gradient_sum]
    everyone = [f for f in everyone if f[1] == gradient_sum]
  assert len(everyone) + len(in_group) == len(found), found
  assert [operands for _, operands, _ in everyone] == [gradient_sum]
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
      ("all-reduce", 2, ((0, 1), (2, 3), (4, 5), (6, 7)))]


@pytest.mark.parametrize("printed", [
    f"replica_groups=mesh['{GROUPS_AXIS}'=4,'{IN_GROUP_AXIS}'=2] "
    f"{{'{IN_GROUP_AXIS}'}}",
    "replica_groups=[4,2]<=[8]",
    "replica_groups={{0,1},{2,3},{4,5},{6,7}}"])
def test_every_form_of_replica_groups_reads_as_the_same_devices(printed):
  """jax 0.11 prints the mesh form, jax 0.10 and 0.6 list the groups: the
  census reads both, so make test passes on each Python's JAX."""
  assert device_groups(printed + ", to_apply=%add") == mesh_groups(
      2, IN_GROUP_AXIS)
  everyone = {"replica_groups=[1,8]<=[8]",
              "replica_groups={{0,1,2,3,4,5,6,7}}",
              f"replica_groups=mesh['{GROUPS_AXIS}'=4,'{IN_GROUP_AXIS}'=2] "
              f"{{'{GROUPS_AXIS}','{IN_GROUP_AXIS}'}}"}
  assert {device_groups(e) for e in everyone} == {mesh_groups(2, "all")}
  assert device_groups("replica_groups=[2,4]<=[4,2]T(1,0)") == (
      (0, 2, 4, 6), (1, 3, 5, 7))
