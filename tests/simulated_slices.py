"""The Topology of a TPU slice such as "v3-32", built without a TPU.

Tests place replicas and BN tiles (resnet_tpu/parallel/topology.py,
tpu_layout.py) on these slices, and simulated_tpu.py traces a TPUStrategy
over them. The library reads only what TensorFlow's Topology holds, so
nothing here ships with it.
"""
import math
import re

import numpy as np
import tensorflow as tf

from resnet_tpu.parallel.topology import Chip

# Chips per host on v2, v3 and v4 slices (a 2x2 board).
HOST_BOX: Chip = (2, 2, 1)
_SLICE_NAME = re.compile(r"v([234])-(\d+)$")


def simulated_topology(name: str) -> tf.tpu.experimental.Topology:
  """The Topology of a v2/v3/v4 slice such as "v3-32", without a TPU.

  The number counts TensorCores, two per chip. v2/v3 chips expose both cores
  on a 2-D mesh (v3-8: 2x2 chips, v3-1024: 16x32); v4 chips expose one fused
  core on a 3-D mesh (v4-32: 2x2x4). Hosts are 2x2x1 boxes of chips.
  """
  match = _SLICE_NAME.match(name)
  cores = int(match.group(2)) if match else 0
  if not match or cores < 8 or cores & (cores - 1):
    raise ValueError(f"Unknown TPU slice {name!r}: expected v2-N, v3-N or "
                     "v4-N with N a power of two >= 8.")
  version = int(match.group(1))
  mesh = _mesh_shape(cores // 2, axes=3 if version == 4 else 2)
  cores_per_chip = 1 if version == 4 else 2
  hosts = tuple(m // b for m, b in zip(mesh, HOST_BOX))
  coordinates = [
      [host + (core,) for host in _host_chips(origin) for core in
       range(cores_per_chip)]
      for origin in _box_origins(hosts, HOST_BOX)]
  return tf.tpu.experimental.Topology(
      mesh_shape=list(mesh) + [cores_per_chip],
      device_coordinates=np.array(coordinates, np.int32))


def _mesh_shape(chips: int, axes: int) -> Chip:
  """Slices grow from 2x2x1 by doubling the last of their shortest axes."""
  shape = [2, 2, 1]
  while math.prod(shape) < chips:
    shortest = min(shape[:axes])
    last = max(a for a in range(axes) if shape[a] == shortest)
    shape[last] *= 2
  return tuple(shape)


def _host_chips(origin: Chip) -> list[Chip]:
  return [tuple(o + d for o, d in zip(origin, offset))
          for offset in _box_order(HOST_BOX)]


def _box_order(shape: Chip) -> list[Chip]:
  """Every coordinate of a box, x fastest (row-major from z)."""
  return [(x, y, z) for z in range(shape[2]) for y in range(shape[1])
          for x in range(shape[0])]


def _box_origins(grid: Chip, box: Chip) -> list[Chip]:
  """First chip of each box of a grid of boxes, x fastest (task order)."""
  return [tuple(c * b for c, b in zip(cell, box))
          for cell in _box_order(grid)]
