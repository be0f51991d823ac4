"""TPU slice layout (Ying et al. §3.1, §3.3) on simulated v2/v3/v4 slices."""
import itertools
import math

from absl import logging
import numpy as np
import pytest
import tensorflow as tf

from resnet_tpu import topology

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


@pytest.mark.parametrize("name,expected_mesh,cores_per_chip", [
    ("v3-8", (2, 2, 1), 2), ("v3-32", (4, 4, 1), 2),
    ("v3-128", (8, 8, 1), 2), ("v3-1024", (16, 32, 1), 2),
    ("v4-32", (2, 2, 4), 1)])
def test_simulated_slices_have_the_published_chip_meshes(
    name, expected_mesh, cores_per_chip):
  topo = topology.simulated_topology(name)
  assert tuple(topo.mesh_shape) == expected_mesh + (cores_per_chip,)
  # Every host drives a 2x2 board of chips.
  assert topo.num_tpus_per_task == 4 * cores_per_chip
  assert sorted(_all_cores(topo)) == sorted(
      itertools.product(*(range(m) for m in topo.mesh_shape)))


@pytest.mark.parametrize("name,group_size", CASES)
def test_device_assignment_is_a_neighbour_ring_with_compact_bn_tiles(
    name, group_size):
  topo = topology.simulated_topology(name)
  layout = topology.slice_layout(topo, group_size)
  cores = list(layout.replica_cores)

  # A permutation: every core exactly once.
  assert sorted(cores) == sorted(_all_cores(topo))
  # Consecutive replicas: the same chip or chips one link apart.
  for a, b in zip(cores, cores[1:]):
    assert sum(abs(p - q) for p, q in zip(a[:3], b[:3])) <= 1, (a, b)

  cores_per_host = topo.num_tpus_per_task
  chips = max(1, group_size // layout.cores_per_chip)
  for group in layout.groups:
    members = [cores[r] for r in group]
    hosts = {_host(topo, core) for core in members}
    assert len(hosts) == max(1, group_size // cores_per_host)
    # The group's chips fill their bounding box (no holes) ...
    group_chips = {core[:3] for core in members}
    box = [max(c[a] for c in group_chips) - min(c[a] for c in group_chips) + 1
           for a in range(3)]
    assert len(group_chips) == chips == math.prod(box)
    # ... and the box is as compact as any box of that many chips.
    assert sum(box) == _minimal_tile_sides(layout.mesh, chips)

  assignment = topology.device_assignment(topo, layout)
  assert assignment.num_replicas == len(cores)
  for r in (0, len(cores) - 1):
    assert tuple(int(v) for v in assignment.coordinates(r, 0)) == cores[r]


def test_groups_are_contiguous_replica_ranges_for_cross_replica_sum():
  layout = topology.slice_layout(topology.simulated_topology("v3-32"), 8)
  assert layout.groups == [list(range(k, k + 8)) for k in range(0, 32, 8)]


def test_layout_log_shows_every_replica_and_its_group(monkeypatch):
  lines = []
  monkeypatch.setattr(logging, "info",
                      lambda fmt, *args: lines.append(fmt % args))
  topo = topology.simulated_topology("v3-8")
  assignment = topology.tpu_device_assignment(topo, 4, log_topology=True)
  assert assignment.num_replicas == 8
  text = "\n".join(lines)
  assert "2x2x1 chips x 2 cores = 8 replicas" in text
  assert "BN groups of 4 replicas on tiles of 2x1x1 chips" in text
  # Chip rows list replicas "r0,r1[group]": 8 replicas, groups 0 and 1.
  cells = [cell for line in lines[2:] for cell in line.split()]
  assert sorted(int(r) for cell in cells
                for r in cell.split("[")[0].split(",")) == list(range(8))
  assert {cell.split("[")[1] for cell in cells} == {"0]", "1]"}
  count = len(lines)
  topology.tpu_device_assignment(topo, 4)
  assert len(lines) == count  # nothing is logged without log_topology


@pytest.mark.parametrize("name,group_size,message", [
    ("v3-8", 3, "--bn_group_size=3"),
    ("v3-8", 16, "--bn_group_size=16"),
    ("v4-32", 6, "--bn_group_size=6"),
])
def test_untileable_group_sizes_name_the_flag(name, group_size, message):
  with pytest.raises(ValueError, match=message):
    topology.slice_layout(topology.simulated_topology(name), group_size)


def test_unknown_slice_name_is_refused():
  with pytest.raises(ValueError, match="v5-8"):
    topology.simulated_topology("v5-8")


def test_real_topology_with_non_box_hosts_is_refused():
  coords = np.array([[[0, 0, 0, 0], [1, 1, 0, 0]],
                     [[1, 0, 0, 0], [0, 1, 0, 0]]], np.int32)
  topo = tf.tpu.experimental.Topology(mesh_shape=[2, 2, 1, 1],
                                      device_coordinates=coords)
  with pytest.raises(ValueError, match="not an aligned box"):
    topology.slice_layout(topo, 2)
