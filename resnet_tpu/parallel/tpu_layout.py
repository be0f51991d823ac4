"""Where each replica runs on a TPU slice, and its BN group (Ying et al. §3.1).

Distributed BN (§3.1) sums per-channel statistics over a small group of
replicas; on TPU that sum is a CrossReplicaSum whose `group_assignment`
lists the replica ids of each group. `slice_layout` takes them from the
chip coordinates of the replicas in the device assignment actually used, so
each group is a compact tile (topology.py's `tile_shape`) under either
`--tpu_device_assignment`:

  default  TensorFlow's own: TPUStrategy without
           `experimental_device_assignment`, the path TPU users run. Replica
           r runs on TPU device r % k of task r // k (k devices per task):
           TPUStrategy (tensorflow/python/distribute/tpu_strategy.py) lists
           the TPU devices sorted by task, then device index
           (tensorflow/python/tpu/tpu_system_metadata.py) and calls
           tpu.replicate with device_assignment=None, which sets no topology
           attribute; the TPU bridge's
           GetFullMeshTPUExecutionDeviceAssignment
           (tensorflow/compiler/mlir/tensorflow/utils/
           tpu_rewrite_device_util.cc) then runs replica i on
           tpu_devices[i / num_tpus_per_task][i % num_tpus_per_task]. The
           groups are whichever replica ids sit in each tile.
           `DeviceAssignment.build(topology, num_replicas=N)` is another,
           geometric order, not this default.
  ring     topology.py's snake through the torus, opt in: consecutive
           replicas are neighbours and the groups are [k*g, (k+1)*g). It has
           never run on a TPU, so it is not the default.

Each group lists its replica ids in increasing order, and groups are ordered
by their first replica. A CrossReplicaSum group is a set, so this canonical
form changes no sum, and under `ring` it equals the contiguous ranges.
"""
import dataclasses
from typing import Sequence

from absl import logging
import numpy as np
import tensorflow as tf

from resnet_tpu.parallel import topology as topology_lib
from resnet_tpu.parallel.topology import Chip, Core, box_text

Topology = tf.tpu.experimental.Topology
DeviceAssignment = tf.tpu.experimental.DeviceAssignment


@dataclasses.dataclass(frozen=True)
class SliceLayout:
  """Where each replica runs and which replicas share a BN group."""
  assignment: str                       # one of TPU_DEVICE_ASSIGNMENTS
  mesh: Chip                            # chips along x, y, z
  cores_per_chip: int
  host_box: Chip                        # chips of one host along x, y, z
  group_size: int
  tile: Chip                            # chips of one BN group along x, y, z
  replica_cores: tuple[Core, ...]       # (x, y, z, core) of replica r
  groups: tuple[tuple[int, ...], ...]   # replica ids of each BN group

  @property
  def num_replicas(self) -> int:
    return len(self.replica_cores)

  @property
  def group_assignment(self) -> list[list[int]]:
    """The CrossReplicaSum group_assignment of the BN groups."""
    return [list(group) for group in self.groups]


def default_replica_cores(topology: Topology) -> tuple[Core, ...]:
  """TensorFlow's own assignment: replica r on device r % k of task r // k."""
  return tuple(tuple(int(v) for v in core)
               for core in topology.device_coordinates.reshape(-1, 4))


def ring_replica_cores(topology: Topology, group_size: int
                       ) -> tuple[Core, ...]:
  """The torus ring: a snake over tiles of `group_size` replicas."""
  mesh, cores_per_chip = _mesh(topology)
  tile = topology_lib.tile_shape(mesh, cores_per_chip,
                                 topology_lib.host_box_of(topology),
                                 group_size)
  return tuple(chip + (core,)
               for chip in topology_lib.ring_chip_order(mesh, tile)
               for core in range(cores_per_chip))


def _tile_groups(cores: Sequence[Core], tile: Chip,
                 cores_per_group_chip: int) -> list[list[int]]:
  """Replicas keyed by their tile (and core slot when groups split chips)."""
  tiles: dict[tuple[int, ...], list[int]] = {}
  for replica, (x, y, z, core) in enumerate(cores):
    key = (x // tile[0], y // tile[1], z // tile[2],
           core // cores_per_group_chip)
    tiles.setdefault(key, []).append(replica)
  return sorted(tiles.values())


def _mesh(topology: Topology) -> tuple[Chip, int]:
  shape = [int(m) for m in topology.mesh_shape]
  return tuple(shape[:3]), shape[3]


def slice_layout(topology: Topology, group_size: int,
                 assignment: str = "default") -> SliceLayout:
  """Replica cores and BN groups under `assignment`, one core per replica."""
  mesh, cores_per_chip = _mesh(topology)
  host_box = topology_lib.host_box_of(topology)
  tile = topology_lib.tile_shape(mesh, cores_per_chip, host_box, group_size)
  cores = (default_replica_cores(topology) if assignment == "default" else
           ring_replica_cores(topology, group_size))
  groups = _tile_groups(cores, tile, min(group_size, cores_per_chip))
  return SliceLayout(assignment, mesh, cores_per_chip, host_box, group_size,
                     tile, cores, tuple(tuple(g) for g in groups))


def device_assignment(topology: Topology,
                      layout: SliceLayout) -> DeviceAssignment:
  """The DeviceAssignment of `layout`: logical replica r on its core."""
  cores = np.array(layout.replica_cores, np.int32)
  return DeviceAssignment(topology, cores.reshape(layout.num_replicas, 1, 4))


def tpu_device_assignment(topology: Topology, kind: str, group_size: int,
                          log_topology: bool = False
                          ) -> tuple[DeviceAssignment | None, SliceLayout]:
  """For TPUStrategy(experimental_device_assignment=...) at start-up.

  The assignment is None for `default`, so TPUStrategy takes its own path;
  the layout's groups are those of the assignment TPUStrategy will use.
  """
  layout = slice_layout(topology, group_size, kind)
  logging.info("%s", summary(layout))
  if log_topology:
    for line in format_layout(layout).splitlines():
      logging.info("%s", line)
  if kind == "default":
    return None, layout
  return device_assignment(topology, layout), layout


def check_replica_devices(topology: Topology, layout: SliceLayout,
                          device_names: Sequence[str]) -> None:
  """Fails unless replica r runs on the TPU device of `layout`'s core r.

  `device_names` is TPUStrategy's `extended.worker_devices`: this checks on
  the real slice that the BN groups describe the replicas TPUStrategy runs.
  """
  if len(device_names) != layout.num_replicas:
    raise ValueError(f"TPUStrategy runs {len(device_names)} replicas; the "
                     f"BN groups assume {layout.num_replicas}.")
  for replica, (name, core) in enumerate(zip(device_names,
                                             layout.replica_cores)):
    spec = tf.DeviceSpec.from_string(name)
    task = int(topology.task_ordinal_at_coordinates(core))
    device = int(topology.tpu_device_ordinal_at_coordinates(core))
    if (spec.task or 0, spec.device_index) != (task, device):
      raise ValueError(
          f"TPUStrategy runs replica {replica} on {name}, but the BN groups "
          f"of --tpu_device_assignment={layout.assignment} place it on task "
          f"{task} TPU:{device} (core {core}).")


def summary(layout: SliceLayout) -> str:
  """The one start-up line about the BN groups."""
  return (f"BN groups of {layout.group_size} replicas on tiles of "
          f"{box_text(layout.tile)} chips (assignment: {layout.assignment}); "
          f"{layout.num_replicas} replicas on {box_text(layout.mesh)} chips "
          f"x {layout.cores_per_chip} cores, hosts of "
          f"{box_text(layout.host_box)} chips.")


def format_layout(layout: SliceLayout) -> str:
  """Each chip's replicas with their BN groups in brackets, row by row."""
  group_of = {r: k for k, group in enumerate(layout.groups) for r in group}
  at = {core: r for r, core in enumerate(layout.replica_cores)}
  x_size, y_size, z_size = layout.mesh
  lines = []
  for z in range(z_size):
    lines.append(f"z={z}: replicas[BN groups] per chip, x across, y down "
                 f"(assignment: {layout.assignment})")
    for y in range(y_size):
      cells = []
      for x in range(x_size):
        replicas = [at[(x, y, z, c)] for c in range(layout.cores_per_chip)]
        groups = dict.fromkeys(group_of[r] for r in replicas)
        cells.append(",".join(map(str, replicas)) +
                     "[" + ",".join(map(str, groups)) + "]")
      lines.append(" ".join(cell.rjust(12) for cell in cells))
  return "\n".join(lines)
