"""TPU replica placement and BN tiles (Ying §3.1) on simulated slices."""
import collections
import itertools
import math

from absl import logging
import numpy as np
import pytest
import tensorflow as tf

from resnet_tpu.parallel.tensorflow import bn_all_reduce
from resnet_tpu.parallel.tensorflow import strategy as strategy_lib
from resnet_tpu.config import TPU_DEVICE_ASSIGNMENTS
from resnet_tpu.parallel import tpu_layout
from simulated_slices import simulated_topology

SLICES = ("v3-8", "v3-32", "v3-128", "v3-1024", "v4-32")
# (slice, group size) for every power-of-two group up to 64 replicas.
CASES = [(name, g) for name in SLICES for g in (1, 2, 4, 8, 16, 32, 64)
         if g <= int(name.split("-")[1]) // (2 if name[1] == "4" else 1)]


def _all_cores(topo) -> list[tuple[int, ...]]:
  return [tuple(int(v) for v in c)
          for c in topo.device_coordinates.reshape(-1, 4)]


def _host(topo, core) -> int:
  return int(topo.task_ordinal_at_coordinates(core))


def _minimal_tile_sides(mesh, chips: int) -> int:
  """Smallest x + y + z of a box of `chips` chips that fits the mesh."""
  return min(sum(box) for box in itertools.product(
      *(range(1, m + 1) for m in mesh)) if math.prod(box) == chips)


def _tensorflow_device(topo, replica: int) -> str:
  """Where TPUStrategy without a device assignment runs `replica`."""
  k = topo.num_tpus_per_task
  return f"/job:worker/replica:0/task:{replica // k}/device:TPU:{replica % k}"


@pytest.mark.parametrize("name,expected_mesh,cores_per_chip", [
    ("v3-8", (2, 2, 1), 2), ("v3-32", (4, 4, 1), 2),
    ("v3-128", (8, 8, 1), 2), ("v3-1024", (16, 32, 1), 2),
    ("v4-32", (2, 2, 4), 1)])
def test_simulated_slices_have_the_published_chip_meshes(
    name, expected_mesh, cores_per_chip):
  topo = simulated_topology(name)
  assert tuple(topo.mesh_shape) == expected_mesh + (cores_per_chip,)
  # Every host drives a 2x2 board of chips.
  assert topo.num_tpus_per_task == 4 * cores_per_chip
  assert sorted(_all_cores(topo)) == sorted(
      itertools.product(*(range(m) for m in topo.mesh_shape)))


@pytest.mark.parametrize("assignment", TPU_DEVICE_ASSIGNMENTS)
@pytest.mark.parametrize("name,group_size", CASES)
def test_bn_groups_are_compact_tiles_on_every_simulated_slice(
    name, group_size, assignment):
  topo = simulated_topology(name)
  layout = tpu_layout.slice_layout(topo, group_size, assignment)
  cores = layout.replica_cores
  assert sorted(cores) == sorted(_all_cores(topo))
  # The groups partition the replicas into groups of group_size.
  assert sorted(r for g in layout.groups for r in g) == list(
      range(layout.num_replicas))
  assert {len(g) for g in layout.groups} == {group_size}

  cores_per_host = topo.num_tpus_per_task
  chips = max(1, group_size // layout.cores_per_chip)
  for group in layout.groups:
    members = [cores[r] for r in group]
    # Inside one host, or whole hosts: every core of each host it touches.
    per_host = collections.Counter(_host(topo, core) for core in members)
    if group_size <= cores_per_host:
      assert len(per_host) == 1
    else:
      assert set(per_host.values()) == {cores_per_host}
    # The group's chips fill a box of the tile shape (no holes) ...
    group_chips = {core[:3] for core in members}
    box = tuple(max(c[a] for c in group_chips) -
                min(c[a] for c in group_chips) + 1 for a in range(3))
    assert len(group_chips) == chips == math.prod(box)
    assert box == layout.tile
    # ... and the box is as compact as any box of that many chips.
    assert sum(box) == _minimal_tile_sides(layout.mesh, chips)


@pytest.mark.parametrize("name,group_size", CASES)
def test_ring_assignment_is_a_neighbour_ring_with_contiguous_bn_groups(
    name, group_size):
  topo = simulated_topology(name)
  assignment, layout = tpu_layout.tpu_device_assignment(topo, "ring",
                                                        group_size)
  cores = layout.replica_cores
  # Consecutive replicas: the same chip or chips one link apart.
  for a, b in zip(cores, cores[1:]):
    assert sum(abs(p - q) for p, q in zip(a[:3], b[:3])) <= 1, (a, b)
  assert layout.group_assignment == bn_all_reduce.group_assignment(
      len(cores), group_size)
  # TPUStrategy gets this explicit assignment, replica r on core r.
  assert assignment.num_replicas == len(cores)
  np.testing.assert_array_equal(assignment.core_assignment[:, 0, :], cores)


@pytest.mark.parametrize("name", SLICES)
def test_default_assignment_is_tensorflows_own_task_by_task_order(name):
  topo = simulated_topology(name)
  assignment, layout = tpu_layout.tpu_device_assignment(topo, "default", 4)
  # None: TPUStrategy takes its own path, which runs replica r on TPU
  # device r % k of task r // k (k devices per task).
  assert assignment is None
  k = topo.num_tpus_per_task
  for replica, core in enumerate(layout.replica_cores):
    assert _host(topo, core) == replica // k
    assert topo.tpu_device_ordinal_at_coordinates(core) == replica % k
  tpu_layout.check_replica_devices(
      topo, layout, [_tensorflow_device(topo, r)
                     for r in range(layout.num_replicas)])


def test_device_assignment_build_is_not_tensorflows_default():
  """Why `default` is not DeviceAssignment.build: a row-major order."""
  topo = simulated_topology("v3-32")
  built = tf.tpu.experimental.DeviceAssignment.build(topo, num_replicas=32)
  assert [tuple(built.coordinates(r, 0)) for r in range(4)] == [
      (0, 0, 0, 0), (0, 0, 0, 1), (1, 0, 0, 0), (1, 0, 0, 1)]
  assert tuple(built.coordinates(4, 0)) == (2, 0, 0, 0)  # the next host
  assert tpu_layout.default_replica_cores(topo)[4] == (0, 1, 0, 0)


def test_default_assignment_groups_of_four_hosts_are_2x2_blocks_of_tasks():
  # v3-128: 8x8 chips, a 4x4 grid of hosts numbered x fastest. A group of
  # 32 replicas is a 4x4-chip tile: hosts 0, 1, 4 and 5, not 0..3.
  layout = tpu_layout.slice_layout(simulated_topology("v3-128"), 32)
  assert layout.tile == (4, 4, 1)
  assert layout.group_assignment[0] == list(range(16)) + list(range(32, 48))
  assert layout.group_assignment[1] == list(range(16, 32)) + list(
      range(48, 64))


@pytest.mark.parametrize("assignment", TPU_DEVICE_ASSIGNMENTS)
def test_device_assignment_runs_replica_r_on_the_layouts_core_r(assignment):
  topo = simulated_topology("v3-32")
  layout = tpu_layout.slice_layout(topo, 8, assignment)
  explicit = tpu_layout.device_assignment(topo, layout)
  assert explicit.num_replicas == 32
  assert [tuple(explicit.coordinates(r, 0)) for r in range(32)] == list(
      layout.replica_cores)


@pytest.mark.parametrize("assignment", TPU_DEVICE_ASSIGNMENTS)
def test_replica_device_check_refuses_devices_that_break_the_groups(
    assignment):
  topo = simulated_topology("v3-32")
  layout = tpu_layout.slice_layout(topo, 4, assignment)
  explicit = tpu_layout.device_assignment(topo, layout)
  names = [explicit.tpu_device(r, job="worker")
           for r in range(layout.num_replicas)]
  tpu_layout.check_replica_devices(topo, layout, names)
  names[1], names[2] = names[2], names[1]
  with pytest.raises(ValueError,
                     match=f"replica 1 .*--tpu_device_assignment={assignment}"):
    tpu_layout.check_replica_devices(topo, layout, names)


class _FakeTPUStrategy:
  """TPUStrategy's device list: its own order, or the assignment's."""

  def __init__(self, topo, experimental_device_assignment):
    self.device_assignment = experimental_device_assignment
    n = topo.num_tasks * topo.num_tpus_per_task
    names = [experimental_device_assignment.tpu_device(r, job="worker")
             if experimental_device_assignment else _tensorflow_device(topo, r)
             for r in range(n)]
    self.extended = type("Extended", (), {"worker_devices": tuple(names)})


@pytest.mark.parametrize("assignment", TPU_DEVICE_ASSIGNMENTS)
def test_tpu_strategy_uses_the_assignment_and_returns_its_bn_groups(
    monkeypatch, assignment):
  topo = simulated_topology("v3-128")
  monkeypatch.setattr(tf.distribute.cluster_resolver, "TPUClusterResolver",
                      lambda tpu: "resolver")
  monkeypatch.setattr(tf.config, "experimental_connect_to_cluster",
                      lambda resolver: None)
  monkeypatch.setattr(tf.tpu.experimental, "initialize_tpu_system",
                      lambda resolver: topo)
  monkeypatch.setattr(tf.distribute, "TPUStrategy",
                      lambda resolver, **kw: _FakeTPUStrategy(topo, **kw))
  setup = strategy_lib._tpu_strategy("local", 32, False, assignment)
  layout = tpu_layout.slice_layout(topo, 32, assignment)
  assert setup.bn_groups == layout.group_assignment
  if assignment == "default":
    assert setup.strategy.device_assignment is None
  else:
    np.testing.assert_array_equal(
        setup.strategy.device_assignment.core_assignment[:, 0, :],
        layout.replica_cores)


@pytest.mark.parametrize("assignment", TPU_DEVICE_ASSIGNMENTS)
def test_layout_log_shows_every_replica_and_its_group(monkeypatch,
                                                      assignment):
  lines = []
  monkeypatch.setattr(logging, "info",
                      lambda fmt, *args: lines.append(fmt % args))
  topo = simulated_topology("v3-8")
  tpu_layout.tpu_device_assignment(topo, assignment, 4, log_topology=True)
  assert lines[0].startswith(
      "BN groups of 4 replicas on tiles of 2x1x1 chips (assignment: "
      f"{assignment}); 8 replicas on 2x2x1 chips x 2 cores")
  # Chip rows list replicas "r0,r1[group]": 8 replicas, groups 0 and 1.
  cells = [cell for line in lines[2:] for cell in line.split()]
  assert sorted(int(r) for cell in cells
                for r in cell.split("[")[0].split(",")) == list(range(8))
  assert {cell.split("[")[1] for cell in cells} == {"0]", "1]"}
  lines.clear()
  tpu_layout.tpu_device_assignment(topo, assignment, 4)
  assert len(lines) == 1  # the summary only, without log_topology


def test_layout_log_shows_both_groups_of_a_chip_with_groups_of_one():
  layout = tpu_layout.slice_layout(simulated_topology("v3-8"), 1)
  assert "0,1[0,1]" in tpu_layout.format_layout(layout).split()


@pytest.mark.parametrize("assignment", TPU_DEVICE_ASSIGNMENTS)
@pytest.mark.parametrize("name,group_size", [
    ("v3-8", 0), ("v3-8", 3), ("v3-8", 16), ("v4-32", 6)])
def test_untileable_group_sizes_name_the_flag(name, group_size, assignment):
  topo = simulated_topology(name)
  with pytest.raises(ValueError, match=f"--bn_group_size={group_size} "):
    tpu_layout.slice_layout(topo, group_size, assignment)


def test_unknown_slice_name_is_refused():
  with pytest.raises(ValueError, match="v5-8"):
    simulated_topology("v5-8")


def test_real_topology_with_non_box_hosts_is_refused():
  coords = np.array([[[0, 0, 0, 0], [1, 1, 0, 0]],
                     [[1, 0, 0, 0], [0, 1, 0, 0]]], np.int32)
  topo = tf.tpu.experimental.Topology(mesh_shape=[2, 2, 1, 1],
                                      device_coordinates=coords)
  with pytest.raises(ValueError, match="not an aligned box"):
    tpu_layout.slice_layout(topo, 2)
