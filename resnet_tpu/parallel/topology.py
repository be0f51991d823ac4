"""TPU slice geometry: chip meshes, host boxes, BN tiles, a torus ring.

A TPU slice is a mesh of chips (a 2-D torus on v2/v3, 3-D on v4) with one or
two TensorCores per chip as TensorFlow sees them; each host drives a box of
chips (2x2x1 on v2, v3 and v4). Ying et al. §3.1 sums the distributed-BN
statistics over a small group of replicas; `tile_shape` gives the most
compact box of chips for such a group (the cores of one chip first, then a
box of neighbouring chips on one host, then a box of whole hosts), so that
its CrossReplicaSum stays on the shortest links, as the MLPerf TPU SSD
distributed BN's physical_shape / tile_shape group assignment does.

`ring_chip_order` is the opt-in torus ring: a snake over the grid of tiles
and, inside each tile, over its chips from the chip next to where the
previous tile ended, so consecutive replicas are neighbours (§3.3) and the
BN groups [k*g, (k+1)*g) are tiles. tpu_layout.py places replicas with it
or with TensorFlow's own assignment. Everything here is plain Python on
topology coordinates, tested on CPU on simulated slices
(tests/simulated_slices.py).
"""
import itertools
import math
from typing import Sequence

import tensorflow as tf

from resnet_tpu.config import ConfigError

Chip = tuple[int, int, int]
Core = tuple[int, int, int, int]


def _divide(mesh: Sequence[int], box: Sequence[int]) -> Chip:
  return tuple(m // b for m, b in zip(mesh, box))


def host_box_of(topology: tf.tpu.experimental.Topology) -> Chip:
  """The box of chips every host drives; ValueError if hosts are not boxes."""
  boxes = set()
  for task_coordinates in topology.device_coordinates:
    chips = {tuple(int(v) for v in c[:3]) for c in task_coordinates}
    low = [min(c[a] for c in chips) for a in range(3)]
    box = tuple(max(c[a] for c in chips) - low[a] + 1 for a in range(3))
    if math.prod(box) != len(chips) or any(lo % b for lo, b in zip(low, box)):
      raise ValueError(f"TPU host chips {sorted(chips)} are not an aligned "
                       "box: the BN tiles need hosts that drive aligned "
                       "boxes of chips.")
    boxes.add(box)
  if len(boxes) != 1:
    raise ValueError(f"TPU hosts drive boxes of different shapes: {boxes}.")
  return boxes.pop()


def tile_shape(mesh: Chip, cores_per_chip: int, host_box: Chip,
               group_size: int) -> Chip:
  """The most compact box of chips holding one BN group.

  Groups of at most one host's cores tile the host box; larger groups are
  boxes of whole hosts. Ties prefer tiles long along x, the ring's fast
  axis.
  """
  if group_size < 1:
    raise ConfigError(f"--bn_group_size={group_size} must be at least 1.")
  if group_size <= cores_per_chip:
    if cores_per_chip % group_size:
      raise ConfigError(f"--bn_group_size={group_size} must divide the "
                        f"{cores_per_chip} cores of a chip.")
    return (1, 1, 1)
  if group_size % cores_per_chip:
    raise ConfigError(f"--bn_group_size={group_size} must be a multiple of "
                      f"the {cores_per_chip} cores of a chip.")
  chips = group_size // cores_per_chip
  within_host = chips <= math.prod(host_box)
  candidates = [box for box in itertools.product(*map(_divisors, mesh))
                if math.prod(box) == chips and
                _fits_hosts(box, host_box, within_host)]
  if not candidates:
    raise ConfigError(
        f"--bn_group_size={group_size} cannot tile a {box_text(mesh)} slice "
        f"with {cores_per_chip} cores per chip and {box_text(host_box)} chips "
        "per host: use a power of two up to the replica count.")
  return min(candidates, key=lambda box: (sum(box), box[::-1]))


def _fits_hosts(box: Chip, host_box: Chip, within_host: bool) -> bool:
  """Inside one host's box, or made of whole host boxes (both aligned)."""
  if within_host:
    return all(h % b == 0 for b, h in zip(box, host_box))
  return all(b % h == 0 for b, h in zip(box, host_box))


def _divisors(n: int) -> list[int]:
  return [d for d in range(1, n + 1) if n % d == 0]


def _snake(shape: Sequence[int]) -> list[tuple[int, ...]]:
  """Boustrophedon through a box, first axis fastest: steps of one link."""
  order = [()]
  for size in shape:
    order = [cell + (i,) for i in range(size)
             for cell in (order if i % 2 == 0 else order[::-1])]
  return order


def _tile_paths(tile: Chip) -> list[list[Chip]]:
  """Snakes through a tile from each corner, along each axis order."""
  paths = set()
  for axes in itertools.permutations(range(3)):
    base = _snake([tile[a] for a in axes])
    for flips in itertools.product((False, True), repeat=3):
      path = []
      for cell in base:
        chip = [0, 0, 0]
        for value, axis in zip(cell, axes):
          chip[axis] = tile[axis] - 1 - value if flips[axis] else value
        path.append(tuple(chip))
      paths.add(tuple(path))
  return [list(p) for p in sorted(paths)]


def _adjacent(a: Chip, b: Chip) -> bool:
  return sum(abs(x - y) for x, y in zip(a, b)) == 1


def ring_chip_order(mesh: Chip, tile: Chip) -> list[Chip]:
  """All chips, tile after tile, each step one link (depth-first search)."""
  origins = [tuple(c * t for c, t in zip(cell, tile))
             for cell in _snake(_divide(mesh, tile))]
  paths = _tile_paths(tile)

  def placed(i: int, choice: int) -> list[Chip]:
    return [tuple(o + c for o, c in zip(origins[i], chip))
            for chip in paths[choice]]

  def inside(chip: Chip, i: int) -> bool:
    return all(o <= c < o + t for c, o, t in zip(chip, origins[i], tile))

  def fits(i: int, choices: list[int]) -> bool:
    path = placed(i, choices[i])
    if i and not _adjacent(placed(i - 1, choices[i - 1])[-1], path[0]):
      return False
    if i + 1 == len(origins):
      return True
    return any(_adjacent(path[-1], chip) and inside(chip, i + 1)
               for chip in _neighbours(path[-1]))

  choices = [-1] * len(origins)
  i = 0
  while 0 <= i < len(origins):
    choices[i] += 1
    while choices[i] < len(paths) and not fits(i, choices):
      choices[i] += 1
    if choices[i] == len(paths):
      choices[i] = -1
      i -= 1
    else:
      i += 1
  if i < 0:
    raise ValueError(f"No neighbour-to-neighbour order of {box_text(mesh)} "
                     f"chips in tiles of {box_text(tile)}.")
  return [chip for i, c in enumerate(choices) for chip in placed(i, c)]


def _neighbours(chip: Chip) -> list[Chip]:
  return [tuple(v + (d if a == axis else 0) for a, v in enumerate(chip))
          for axis in range(3) for d in (-1, 1)]


def box_text(box: Sequence[int]) -> str:
  return "x".join(str(int(b)) for b in box)
