"""Distributed BN's group sum on JAX (Ying et al. 2018 §3.1): the mesh and
the psum.

The JAX step runs per replica under `shard_map` over a two-axis device mesh,
(GROUPS_AXIS, IN_GROUP_AXIS) of shape (N / g, g): a BN group is one row of
g devices, and its sum is one `psum` over IN_GROUP_AXIS, which XLA compiles
to an all-reduce with replica_groups of the rows. The gradient of that psum
is the same group psum of the upstream gradient, as on TensorFlow
(bn_all_reduce.py).

Why shard_map and not global-view statistics under jax.sharding (statistics
of each group's slice of the global batch, a reshape to [N / g, B g / N,
...], left to XLA's partitioner):
- the step is then the same per-replica program as TensorFlow's
  (strategy.run): local loss scaled by the global batch, gradients summed
  once, replica-local BN moving statistics;
- each replica's moving statistics can be averaged over all replicas inside
  the one gradient all-reduce (engines/jax/step.py). In the global view they
  are one variable updated with the mean over groups: one more all-reduce,
  across groups, per BN layer and step;
- every collective is one that the step names, so their census is exact
  (tests_jax/test_collective_census.py);
- with one group (or one device) the layer is Keras's own BN; on an H200
  the reshape form over 8 groups ran at 0.88x of it (issue 48).

On TPUs the mesh follows the physical layout
(jax.experimental.mesh_utils.create_device_mesh), so that a group's devices
are neighbours, as the TF path takes its groups from the topology's tiles
(topology.py).
"""
from typing import Sequence

import jax
from jax.experimental import mesh_utils
import numpy as np

GROUPS_AXIS = "groups"
IN_GROUP_AXIS = "in_group"
# The axes the batch is split over: every device is one replica.
REPLICA_AXES = (GROUPS_AXIS, IN_GROUP_AXIS)


def build_mesh(group_size: int,
               devices: Sequence[jax.Device] | None = None
               ) -> jax.sharding.Mesh:
  """The (N / group_size, group_size) mesh of `devices` (default: all).

  TPU devices are laid out by their physical coordinates; others in the
  order given, so that group k is devices [k g, (k + 1) g).
  """
  devices = list(jax.devices() if devices is None else devices)
  if group_size < 1 or len(devices) % group_size:
    raise ValueError(f"--bn_group_size={group_size} must divide the number "
                     f"of devices ({len(devices)}).")
  shape = (len(devices) // group_size, group_size)
  if devices[0].platform == "tpu":
    grid = mesh_utils.create_device_mesh(shape, devices)
  else:
    grid = np.array(devices, dtype=object).reshape(shape)
  return jax.sharding.Mesh(grid, REPLICA_AXES)


def replica_groups(mesh: jax.sharding.Mesh) -> list[list[int]]:
  """The device ids of each BN group of `mesh` (its rows)."""
  return [[device.id for device in row] for row in mesh.devices]


def group_all_reduce(x: jax.Array, group_size: int) -> jax.Array:
  """Sums `x` over the replicas of the caller's BN group.

  Inside the step's shard_map: one psum over IN_GROUP_AXIS, which must have
  `group_size` devices. Outside it (one replica, or no mesh) and with
  group_size 1: the identity, as TensorFlow's outside a replica context.
  """
  if group_size == 1:
    return x
  try:
    size = jax.lax.psum(1, IN_GROUP_AXIS)
  except NameError:  # unbound axis: not inside the step's shard_map
    return x
  if size != group_size:
    raise ValueError(f"--bn_group_size={group_size}, but the device mesh's "
                     f"BN groups have {size} devices.")
  return jax.lax.psum(x, IN_GROUP_AXIS)
