"""All-reduce cost model: 2-D torus all-reduce (Ying et al. 2018, §3.3).

Three ways to sum ResNet-50's gradient over a rows x cols torus of chips. Each
chip has four full-duplex links (+x, -x, +y, -y); x runs along a row, y along a
column, and both dimensions wrap around.

* `ring_1d`: one ring through all N chips (a Hamiltonian cycle of torus
  links): reduce-scatter, then all-gather. The baseline of Ying et al. §3.3.
  Runs as `--gradient_all_reduce=ring` (gradient_all_reduce.ring_all_reduce),
  where TensorFlow picks the ring.
* `ying_2d`: Ying et al. §3.3. The payload is split in halves reduced
  concurrently. Half A: reduce-scatter along x, reduce-scatter along y,
  all-gather along y, all-gather along x. Half B: the same with y first. In
  every phase one half uses the x links and the other the y links. Runs as
  `--gradient_all_reduce=2d_ying` (gradient_all_reduce.ying_2d_all_reduce).
* `grid_2d`: Mikami et al. 2018, "2D-Torus all-reduce": reduce-scatter along
  rows, all-reduce (reduce-scatter + all-gather) along columns, all-gather
  along rows. One link dimension at a time. Runs as
  `--gradient_all_reduce=2d` (gradient_all_reduce.mikami_2d_torus_all_reduce).

The executable grid X x Y (--all_reduce_grid, X replicas per row) is the
torus rows=Y, cols=X here, with replica r on chip r.
tests/test_gradient_all_reduce.py traces `2d_ying` and `2d` and checks that
each replica's phases, steps (n - 1 for a collective among n replicas) and
values sent along rows (x) and columns (y) equal those of `build_schedule`
and the closed forms below.

Cost model (alpha-beta). The payload is cut into streams: the two halves of
`ying_2d` and, with bidirectional links, a counter-rotating copy of every
stream over the reverse link directions. An algorithm is a sequence of phases
(reduce-scatter, all-gather, per dimension) with a barrier between phases.
Within a phase the streams run independently on disjoint link directions (the
executor checks this) and the phase lasts as long as its slowest stream. A
stream's ring step is a synchronous round in which each chip sends one chunk
to its ring neighbour; it costs `alpha + bytes on the busiest link direction /
B`. Reduction arithmetic, HBM traffic and host overheads are not modelled.

Link parameters (overridable by flags):

* B = 100 GB/s per link per direction, derived from Google Cloud's "TPU v3"
  page (https://cloud.google.com/tpu/docs/v3): a 1024-chip 2-D torus pod with
  6.4 TB/s bisection bandwidth. Cutting a 32x32 torus in half crosses
  2 x 32 = 64 links: 6.4 TB/s / 64 = 100 GB/s, assuming the page counts one
  direction.
* alpha = 1 us per ring step: an assumption. No primary per-hop ICI latency
  for TPU v3 was found; third-party summaries call neighbour latency
  sub-microsecond, and a ring step also pays synchronisation.

`build_schedule` + `execute` run each algorithm message by message on integer
vectors of small tori; tests check the exact sum on every chip and that the
executed rounds and bytes per link direction equal the closed-form model.

Usage: python -m lab.allreduce_sim --output_dir bench_results
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import os
from typing import Iterable, Sequence

from absl import logging
import numpy as np

RESNET50_NUM_VALUES = 25_557_032
# BN channels of ResNet-50 (53 layers): each has a moving mean and variance.
RESNET50_BN_CHANNELS = 26_560
# The ways the moving statistics have been kept across replicas.
STATISTICS_OPTIONS = ("only_first_replica", "mean_per_step",
                      "local_mean_per_loop")
STATISTICS_CHIPS = (8, 32, 128, 512, 1024, 2048, 4096)
STATISTICS_STEPS_PER_LOOP = 100
DTYPE_BYTES = {"fp32": 4, "bf16": 2}
ALGORITHMS = ("ring_1d", "ying_2d", "grid_2d")
ALGORITHM_TITLES = {
    "ring_1d": "1-D ring",
    "ying_2d": "2-D torus (Ying §3.3)",
    "grid_2d": "2-D grid (Mikami)",
}
DEFAULT_SHAPES = ((2, 4), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16), (16, 32),
                  (32, 32), (16, 64), (32, 64), (64, 64))
HEADLINE_SHAPE = (32, 32)
TPU_V3_LINK_GBYTES_PER_S = 100.0
DEFAULT_ALPHA_US = 1.0
SENSITIVITY_ALPHAS_US = (0.0, 0.5, 1.0, 2.0, 5.0)
LINK_SOURCES = (
    "B: Google Cloud, 'TPU v3' (https://cloud.google.com/tpu/docs/v3): "
    "1024-chip pod, 2D torus, 6.4 TB/s bisection bandwidth; the bisection of a "
    "32x32 torus cuts 64 links -> 100 GB/s per link per direction (assumes the "
    "page counts one direction).",
    "alpha: assumption, 1 us per ring step (no primary per-hop ICI latency "
    "figure for TPU v3 found).",
)
_OPPOSITE = {"+x": "-x", "-x": "+x", "+y": "-y", "-y": "+y"}
_STEP = {"+x": (0, 1), "-x": (0, -1), "+y": (1, 0), "-y": (-1, 0)}

Segment = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class LinkModel:
  """Alpha-beta parameters of one torus link direction."""
  alpha_s: float
  bytes_per_s: float
  bidirectional: bool


@dataclasses.dataclass(frozen=True)
class Cost:
  """Modelled or executed time of one all-reduce."""
  rounds: int
  latency_s: float
  bandwidth_s: float

  @property
  def total_s(self) -> float:
    return self.latency_s + self.bandwidth_s


@dataclasses.dataclass(frozen=True)
class Message:
  """Chunk [start, stop) sent by `src` over its `port` link to `dst`."""
  src: int
  dst: int
  port: str
  start: int
  stop: int
  reduce: bool


@dataclasses.dataclass(frozen=True)
class Ring:
  """Chips in ring order; `ports[i]` leads from `chips[i]` to `chips[i + 1]`."""
  chips: tuple[int, ...]
  ports: tuple[str, ...]

  def reversed(self) -> Ring:
    n = len(self.chips)
    ports = tuple(_OPPOSITE[self.ports[(n - 2 - k) % n]] for k in range(n))
    return Ring(self.chips[::-1], ports)


Round = list[Message]
Lane = list[Round]  # One stream's rounds within a phase.
Phase = list[Lane]  # Lanes run concurrently on disjoint link directions.


@dataclasses.dataclass(frozen=True)
class Execution:
  """Final vectors, elements sent per (chip, port), and per phase and lane
  the elements on the busiest link direction of each round."""
  values: np.ndarray
  link_elements: dict[tuple[int, str], int]
  round_max_elements: tuple[tuple[tuple[int, ...], ...], ...]


def _check(algorithm: str, rows: int, cols: int) -> None:
  if algorithm not in ALGORITHMS:
    raise ValueError(f"algorithm {algorithm!r}: expected one of {ALGORITHMS}")
  if rows < 2 or cols < 2:
    raise ValueError(
        f"torus {rows}x{cols}: expected at least 2 chips per dimension")


def _slowest(lanes: Iterable[tuple[int, float]],
             link: LinkModel) -> tuple[int, float]:
  """The (rounds, busiest-link bytes) lane of a phase that finishes last."""
  def finish(lane: tuple[int, float]) -> tuple[float, int]:
    rounds, volume = lane
    return rounds * link.alpha_s + volume / link.bytes_per_s, rounds
  return max(lanes, key=finish)


def _phases(algorithm: str, rows: int, cols: int,
            stream: float) -> list[list[tuple[int, float]]]:
  """Per phase, (rounds, chunk bytes) of each concurrent stream's rings."""
  n = rows * cols
  if algorithm == "ring_1d":
    return [[(n - 1, stream / n)]] * 2
  if algorithm == "grid_2d":
    outer, inner = [(cols - 1, stream / cols)], [(rows - 1, stream / n)]
  else:
    outer = [(cols - 1, stream / cols), (rows - 1, stream / rows)]
    inner = [(rows - 1, stream / n), (cols - 1, stream / n)]
  return [outer, inner, inner, outer]


def _stream_bytes(algorithm: str, payload_bytes: float,
                  bidirectional: bool) -> float:
  halves = 2 if algorithm == "ying_2d" else 1
  return payload_bytes / (halves * (2 if bidirectional else 1))


def model_cost(algorithm: str, rows: int, cols: int, payload_bytes: float,
               link: LinkModel) -> Cost:
  """Closed-form time of one all-reduce of `payload_bytes` on a torus.

  A bidirectional run's counter-rotating stream uses the reverse link
  directions with the same chunk sizes, so it adds no time; it halves the
  bytes per stream.
  """
  _check(algorithm, rows, cols)
  stream = _stream_bytes(algorithm, payload_bytes, link.bidirectional)
  rounds, volume = 0, 0.0
  for phase in _phases(algorithm, rows, cols, stream):
    lanes = [(steps, steps * chunk) for steps, chunk in phase]
    phase_rounds, phase_volume = _slowest(lanes, link)
    rounds, volume = rounds + phase_rounds, volume + phase_volume
  return Cost(rounds, rounds * link.alpha_s, volume / link.bytes_per_s)


def model_link_loads(algorithm: str, rows: int, cols: int,
                     payload_bytes: float,
                     bidirectional: bool) -> dict[float, int]:
  """Bytes a used link direction carries -> number of such link directions.

  ring_1d: each ring link direction carries 2(N-1)/N of its stream. ying_2d:
  an x link carries half A's x traffic plus half B's, which the y phase has
  already cut by `rows` (symmetrically for y links).
  """
  _check(algorithm, rows, cols)
  n = rows * cols
  p = _stream_bytes(algorithm, payload_bytes, bidirectional)
  if algorithm == "ring_1d":
    per_link = [2 * (n - 1) * p / n]
  elif algorithm == "grid_2d":
    per_link = [2 * (cols - 1) * p / cols, 2 * (rows - 1) * p / n]
  else:
    per_link = [2 * (cols - 1) * p * (1 / cols + 1 / n),
                2 * (rows - 1) * p * (1 / rows + 1 / n)]
  loads: collections.Counter[float] = collections.Counter()
  for value in per_link:
    loads[value] += n * (2 if bidirectional else 1)
  return dict(loads)


def neighbour(rows: int, cols: int, chip: int, port: str) -> int:
  """Chip reached from `chip` (row-major id) over `port` on the torus."""
  dr, dc = _STEP[port]
  r, c = divmod(chip, cols)
  return ((r + dr) % rows) * cols + (c + dc) % cols


def _hamiltonian_ports(rows: int, cols: int) -> list[str]:
  """Ports of a cycle from chip 0 through every chip over torus links."""
  if rows % 2 == 0:
    ports: list[str] = []
    for r in range(rows):
      ports += ["+x" if r % 2 == 0 else "-x"] * (cols - 1) + ["+y"]
    return ports
  # Odd rows: cross row 0, snake the other rows over columns 1..cols-1, wrap
  # to column 0 and climb it back to chip 0.
  ports = ["+x"] * (cols - 1)
  for r in range(1, rows):
    ports += ["+y"] + ["-x" if r % 2 else "+x"] * (cols - 2)
  return ports + ["+x"] + ["-y"] * (rows - 1)


def hamiltonian_ring(rows: int, cols: int) -> Ring:
  """The ring of `ring_1d`: each hop is one torus link, each chip once."""
  _check("ring_1d", rows, cols)
  ports = _hamiltonian_ports(rows, cols)
  chips = [0]
  for port in ports:
    chips.append(neighbour(rows, cols, chips[-1], port))
  if chips[-1] != 0 or sorted(chips[:-1]) != list(range(rows * cols)):
    raise RuntimeError(f"no Hamiltonian cycle built for torus {rows}x{cols}")
  return Ring(tuple(chips[:-1]), tuple(ports))


def _x_rings(rows: int, cols: int) -> list[Ring]:
  return [Ring(tuple(r * cols + c for c in range(cols)), ("+x",) * cols)
          for r in range(rows)]


def _y_rings(rows: int, cols: int) -> list[Ring]:
  return [Ring(tuple(r * cols + c for r in range(rows)), ("+y",) * rows)
          for c in range(cols)]


def _split(segment: Segment, parts: int) -> list[Segment]:
  start, stop = segment
  size = (stop - start) // parts
  return [(start + i * size, start + (i + 1) * size) for i in range(parts)]


def _ring_rounds(ring: Ring, segment: Segment, offset: int,
                 reduce: bool) -> Lane:
  """Round s: position i sends chunk (i + offset - s) mod n to position i+1."""
  n, chunks = len(ring.chips), _split(segment, len(ring.chips))
  return [[Message(ring.chips[i], ring.chips[(i + 1) % n], ring.ports[i],
                   *chunks[(i + offset - s) % n], reduce)
           for i in range(n)] for s in range(n - 1)]


def _reduce_scatter(ring: Ring, segment: Segment) -> Lane:
  """After n-1 rounds, position i holds the full sum of chunk i+1."""
  return _ring_rounds(ring, segment, offset=0, reduce=True)


def _all_gather(ring: Ring, segment: Segment) -> Lane:
  """Spreads the chunks `_reduce_scatter` left: position i starts with i+1."""
  return _ring_rounds(ring, segment, offset=1, reduce=False)


def _owned(ring: Ring, segment: Segment) -> dict[int, Segment]:
  chunks = _split(segment, len(ring.chips))
  return {chip: chunks[(i + 1) % len(chunks)]
          for i, chip in enumerate(ring.chips)}


def _merge(rings: Iterable[Lane]) -> Lane:
  """One stream's rings of equal length in one lane: round k of each."""
  return [list(itertools.chain.from_iterable(rounds))
          for rounds in zip(*rings)]


def _shard(ring: Ring, owned: dict[int, Segment]) -> Segment:
  """The shard every chip of a second-dimension ring owns after phase 1."""
  shards = {owned[chip] for chip in ring.chips}
  if len(shards) != 1:
    raise RuntimeError(f"chips {ring.chips} own different shards {shards}")
  return shards.pop()


def _two_level(first: list[Ring], second: list[Ring],
               segment: Segment) -> list[Lane]:
  """Reduce-scatter dim 1, reduce-scatter dim 2, all-gather dim 2, dim 1."""
  owned = {}
  for ring in first:
    owned.update(_owned(ring, segment))
  inner = [(ring, _shard(ring, owned)) for ring in second]
  return [_merge(_reduce_scatter(ring, segment) for ring in first),
          _merge(_reduce_scatter(ring, shard) for ring, shard in inner),
          _merge(_all_gather(ring, shard) for ring, shard in inner),
          _merge(_all_gather(ring, segment) for ring in first)]


def _streams(algorithm: str, rows: int, cols: int, segments: list[Segment],
             reverse: bool) -> list[list[Lane]]:
  """Phases of the streams circulating one way (reverse: reverse links)."""
  def orient(rings: list[Ring]) -> list[Ring]:
    return [ring.reversed() for ring in rings] if reverse else rings

  x, y = orient(_x_rings(rows, cols)), orient(_y_rings(rows, cols))
  if algorithm == "ring_1d":
    (ring,) = orient([hamiltonian_ring(rows, cols)])
    return [[_reduce_scatter(ring, segments[0]),
             _all_gather(ring, segments[0])]]
  if algorithm == "grid_2d":
    return [_two_level(x, y, segments[0])]
  return [_two_level(x, y, segments[0]), _two_level(y, x, segments[1])]


def build_schedule(algorithm: str, rows: int, cols: int, num_values: int,
                   bidirectional: bool) -> list[Phase]:
  """Every message of one all-reduce of `num_values`: phases of lanes."""
  _check(algorithm, rows, cols)
  directions = (False, True) if bidirectional else (False,)
  per_direction = 2 if algorithm == "ying_2d" else 1
  multiple = len(directions) * per_direction * rows * cols
  if num_values % multiple:
    raise ValueError(
        f"num_values={num_values}: exact execution of {algorithm} on "
        f"{rows}x{cols} needs a multiple of {multiple}")
  segments = _split((0, num_values), len(directions) * per_direction)
  streams = []
  for k, reverse in enumerate(directions):
    own = segments[k * per_direction:(k + 1) * per_direction]
    streams += _streams(algorithm, rows, cols, own, reverse)
  return [list(lanes) for lanes in zip(*streams)]


def _check_disjoint(phase: Phase) -> None:
  owner: dict[tuple[int, str], int] = {}
  for index, lane in enumerate(phase):
    for m in itertools.chain.from_iterable(lane):
      first = owner.setdefault((m.src, m.port), index)
      if first != index:
        raise ValueError(f"lanes {first} and {index} of a phase share link "
                         f"{m.port} of chip {m.src}")


def _apply(data: np.ndarray, messages: list[Message], rows: int,
           cols: int) -> None:
  """Delivers one round: every message carries what its sender held before."""
  payloads = [data[m.src, m.start:m.stop].copy() for m in messages]
  for m, payload in zip(messages, payloads):
    if neighbour(rows, cols, m.src, m.port) != m.dst:
      raise ValueError(f"{m} does not follow a link of the {rows}x{cols} "
                       "torus")
    if m.reduce:
      data[m.dst, m.start:m.stop] += payload
    else:
      data[m.dst, m.start:m.stop] = payload


def execute(schedule: Sequence[Phase], rows: int, cols: int,
            values: np.ndarray) -> Execution:
  """Runs the schedule message by message on one vector per chip."""
  if values.shape[0] != rows * cols:
    raise ValueError(f"values has {values.shape[0]} rows: expected one per "
                     f"chip ({rows * cols})")
  data = values.copy()
  sent: collections.Counter[tuple[int, str]] = collections.Counter()
  record = []
  for phase in schedule:
    _check_disjoint(phase)
    lane_max: list[list[int]] = [[] for _ in phase]
    for rounds in itertools.zip_longest(*phase):
      active = [(i, r) for i, r in enumerate(rounds) if r is not None]
      _apply(data, [m for _, r in active for m in r], rows, cols)
      for index, messages in active:
        load = collections.Counter()
        for m in messages:
          load[(m.src, m.port)] += m.stop - m.start
        sent.update(load)
        lane_max[index].append(max(load.values()))
    record.append(tuple(map(tuple, lane_max)))
  return Execution(data, dict(sent), tuple(record))


def executed_cost(execution: Execution, itemsize: int,
                  link: LinkModel) -> Cost:
  """Per phase, the slowest lane: per round alpha + busiest link bytes / B."""
  rounds, volume = 0, 0.0
  for phase in execution.round_max_elements:
    lanes = [(len(lane), sum(lane) * itemsize) for lane in phase]
    phase_rounds, phase_volume = _slowest(lanes, link)
    rounds, volume = rounds + phase_rounds, volume + phase_volume
  return Cost(rounds, rounds * link.alpha_s, volume / link.bytes_per_s)


def simulate(shapes: Sequence[tuple[int, int]], num_values: int,
             link: LinkModel) -> list[dict]:
  """Models every algorithm on every torus for fp32 and bf16 gradients."""
  results = []
  for (rows, cols), (dtype, itemsize), algorithm in itertools.product(
      shapes, DTYPE_BYTES.items(), ALGORITHMS):
    payload = num_values * itemsize
    cost = model_cost(algorithm, rows, cols, payload, link)
    loads = model_link_loads(algorithm, rows, cols, payload,
                             link.bidirectional)
    results.append({
        "torus": f"{rows}x{cols}", "rows": rows, "cols": cols,
        "chips": rows * cols, "dtype": dtype, "payload_bytes": payload,
        "algorithm": algorithm, "rounds": cost.rounds,
        "latency_s": cost.latency_s, "bandwidth_s": cost.bandwidth_s,
        "total_s": cost.total_s, "busiest_link_bytes": max(loads),
    })
  return results


def speedups(shape: tuple[int, int], num_values: int,
             link: LinkModel) -> dict[str, dict[str, float]]:
  """Modelled speed-up of each 2-D algorithm over the 1-D ring, per dtype."""
  out = {}
  for dtype, itemsize in DTYPE_BYTES.items():
    times = {a: model_cost(a, *shape, num_values * itemsize, link).total_s
             for a in ALGORITHMS}
    out[dtype] = {a: times["ring_1d"] / times[a]
                  for a in ("ying_2d", "grid_2d")}
  return out


def _table(results: list[dict], dtype: str) -> list[str]:
  rows = {(r["torus"], r["algorithm"]): r
          for r in results if r["dtype"] == dtype}
  lines = ["| torus | chips | "
           + " | ".join(f"{ALGORITHM_TITLES[a]} (ms)" for a in ALGORITHMS)
           + " | 2-D torus / 1-D | 2-D grid / 1-D |",
           "|---|---:|---:|---:|---:|---:|---:|"]
  for torus in dict.fromkeys(r["torus"] for r in results):
    t = {a: rows[(torus, a)]["total_s"] for a in ALGORITHMS}
    lines.append(
        f"| {torus} | {rows[(torus, 'ring_1d')]['chips']} | "
        + " | ".join(f"{t[a] * 1e3:.3f}" for a in ALGORITHMS)
        + f" | {t['ring_1d'] / t['ying_2d']:.2f}x"
        f" | {t['ring_1d'] / t['grid_2d']:.2f}x |")
  return lines


def _sensitivity_table(num_values: int, link: LinkModel) -> list[str]:
  lines = ["| alpha (us) | 2-D torus fp32 | 2-D torus bf16 | 2-D grid fp32 "
           "| 2-D grid bf16 |", "|---:|---:|---:|---:|---:|"]
  for alpha in sorted(set(SENSITIVITY_ALPHAS_US) | {link.alpha_s * 1e6}):
    s = speedups(HEADLINE_SHAPE, num_values,
                 dataclasses.replace(link, alpha_s=alpha * 1e-6))
    lines.append(
        f"| {alpha:g} | {s['fp32']['ying_2d']:.2f}x | "
        f"{s['bf16']['ying_2d']:.2f}x | {s['fp32']['grid_2d']:.2f}x | "
        f"{s['bf16']['grid_2d']:.2f}x |")
  return lines


def _explanation(num_values: int, link: LinkModel) -> list[str]:
  rows, cols = HEADLINE_SHAPE
  payload = num_values * DTYPE_BYTES["fp32"]
  ring = model_cost("ring_1d", rows, cols, payload, link)
  torus = model_cost("ying_2d", rows, cols, payload, link)
  rect = model_cost("ying_2d", 16, 64, payload, link)
  return [
      "- Bandwidth alone (alpha = 0) gives exactly 2x on a square torus: the "
      "1-D ring moves 2(N-1)/N of the payload over one link per chip and "
      "direction, the 2-D torus moves the same volume over the x and y links "
      f"at once ({ring.bandwidth_s * 1e3:.3f} ms vs "
      f"{torus.bandwidth_s * 1e3:.3f} ms, fp32, {rows}x{cols}). This is the "
      "doubling Ying et al. §3.3 describe.",
      "- The rest of the modelled gain is latency: the 1-D ring takes "
      f"2(N-1) = {ring.rounds} steps ({ring.latency_s * 1e3:.3f} ms at "
      f"alpha = {link.alpha_s * 1e6:g} us), the 2-D torus "
      f"4(sqrt(N)-1) = {torus.rounds} ({torus.latency_s * 1e3:.3f} ms). "
      "Ying et al. report about 2x, which suggests a much smaller effective "
      "cost per ring step than the assumed alpha (the table above gives 2x "
      "at alpha = 0). Real runs also sum many tensors and overlap summation "
      "with the backward pass; neither is modelled.",
      "- Mikami's 2-D grid cuts the steps to 2(rows-1) + 2(cols-1) but keeps "
      "the 1-D ring's bandwidth term, one link dimension at a time, so its "
      "gain vanishes as alpha -> 0.",
      "- Rectangular tori are worse for the 2-D torus than square ones "
      "with the same chips: the long dimension's links carry more bytes and "
      f"its rings take more steps (16x64, fp32: {rect.rounds} steps, "
      f"{rect.total_s * 1e3:.3f} ms vs {torus.rounds} steps, "
      f"{torus.total_s * 1e3:.3f} ms at 32x32).",
  ]


def statistics_bytes_per_step(option: str, chips: int,
                              steps_per_loop: int = STATISTICS_STEPS_PER_LOOP,
                              channels: int = RESNET50_BN_CHANNELS) -> float:
  """Float32 bytes one chip sends per step for the BN moving statistics.

  only_first_replica: ON_WRITE variables, as TPUExtended._broadcast_to
    applies them: an AllToAll of N copies of each value, of which a chip
    sends N - 1 (tensorflow/python/distribute/tpu_strategy.py);
  mean_per_step: ON_WRITE with aggregation "mean": one bandwidth-optimal
    all-reduce of every value per step, 2 (N - 1) / N of it sent;
  local_mean_per_loop: replica-local (ON_READ), averaged by one such
    all-reduce per host loop of `steps_per_loop` steps (today's form).
  """
  values = 2 * channels * 4.0
  all_reduce = 2 * (chips - 1) / chips * values
  return {"only_first_replica": (chips - 1) * values,
          "mean_per_step": all_reduce,
          "local_mean_per_loop": all_reduce / steps_per_loop}[option]


def _statistics_table() -> list[str]:
  lines = ["| chips | " + " | ".join(f"`{o}` (KB)" for o in
                                     STATISTICS_OPTIONS) + " |",
           "|---:|" + "---:|" * len(STATISTICS_OPTIONS)]
  for chips in STATISTICS_CHIPS:
    lines.append(f"| {chips} | " + " | ".join(
        f"{statistics_bytes_per_step(o, chips) / 1e3:,.1f}"
        for o in STATISTICS_OPTIONS) + " |")
  return lines


def render_markdown(results: list[dict], num_values: int,
                    link: LinkModel) -> str:
  """Report: parameters and sources, tables per dtype, 1024-chip speed-up."""
  head = speedups(HEADLINE_SHAPE, num_values, link)
  shape = "x".join(map(str, HEADLINE_SHAPE))
  mode = "bidirectional" if link.bidirectional else "unidirectional"
  lines = [
      f"# All-reduce cost model: ResNet-50 gradient ({num_values:,} values)",
      "",
      f"Alpha-beta model: alpha = {link.alpha_s * 1e6:g} us per ring step, "
      f"B = {link.bytes_per_s / 1e9:g} GB/s per link per direction, {mode} "
      "rings.", "",
      *[f"- {source}" for source in LINK_SOURCES], "",
      f"**Modelled 2-D torus / 1-D ring speed-up at {shape} (1024 chips): "
      f"{head['fp32']['ying_2d']:.2f}x fp32, "
      f"{head['bf16']['ying_2d']:.2f}x bf16** (2-D grid: "
      f"{head['fp32']['grid_2d']:.2f}x fp32, "
      f"{head['bf16']['grid_2d']:.2f}x bf16).", "",
  ]
  for dtype, itemsize in DTYPE_BYTES.items():
    megabytes = num_values * itemsize / 1e6
    lines += [f"## {dtype} gradient ({megabytes:.1f} MB)", "",
              *_table(results, dtype), ""]
  lines += [f"## Speed-up over the 1-D ring at {shape} vs alpha", "",
            *_sensitivity_table(num_values, link), "",
            "## Reading the numbers", "", *_explanation(num_values, link), "",
            "## BN moving statistics: bytes each chip sends per step", "",
            f"ResNet-50's {2 * RESNET50_BN_CHANNELS:,} moving-statistics "
            "values in float32 (statistics_bytes_per_step). "
            "`only_first_replica`: ON_WRITE, replica 0's value broadcast by "
            "an AllToAll per variable and step; `mean_per_step`: an "
            "all-reduce per variable and step; `local_mean_per_loop`: each "
            "replica its own, one all-reduce per host loop of "
            f"{STATISTICS_STEPS_PER_LOOP} steps (moving_statistics.py). For "
            "scale, the float32 gradient all-reduce sends "
            f"{2 * RESNET50_NUM_VALUES * 4 / 1e6:.0f} MB per chip and step.",
            "", *_statistics_table(), "",
            "The formulas' step counts and bytes per link direction equal "
            "those of an exact message-by-message execution on 2x2, 2x4, "
            "4x4 and 3x5 tori (tests/test_allreduce_sim.py).", ""]
  return "\n".join(lines)


def _squarest_per_chip_count(rows: list[dict]) -> list[dict]:
  best = {}
  for r in sorted(rows, key=lambda r: abs(r["rows"] - r["cols"]),
                  reverse=True):
    best[r["chips"]] = r
  return sorted(best.values(), key=lambda r: r["chips"])


def plot(results: list[dict], path: str) -> None:
  """Time vs chips per dtype; lines join the squarest torus per chip count."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  fig, axes = plt.subplots(1, len(DTYPE_BYTES), figsize=(11, 4.5),
                           sharey=True)
  for ax, dtype in zip(axes, DTYPE_BYTES):
    for algorithm in ALGORITHMS:
      rows = [r for r in results
              if r["dtype"] == dtype and r["algorithm"] == algorithm]
      line = _squarest_per_chip_count(rows)
      others = [r for r in rows if r not in line]
      (handle,) = ax.plot([r["chips"] for r in line],
                          [r["total_s"] * 1e3 for r in line], "o-",
                          label=ALGORITHM_TITLES[algorithm])
      ax.plot([r["chips"] for r in others],
              [r["total_s"] * 1e3 for r in others], "s", mfc="none",
              color=handle.get_color())
    ax.set(xscale="log", yscale="log", title=dtype,
           xlabel="chips (hollow squares: rectangular torus)")
    ax.grid(True, which="both", alpha=0.3)
  axes[0].set_ylabel("modelled all-reduce time (ms)")
  axes[0].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def _parse_shapes(text: str) -> list[tuple[int, int]]:
  shapes = []
  for item in text.split(","):
    try:
      rows, cols = (int(v) for v in item.lower().split("x"))
    except ValueError:
      raise argparse.ArgumentTypeError(
          f"--shapes entry {item!r}: expected ROWSxCOLS, e.g. 32x32") from None
    if rows < 2 or cols < 2:
      raise argparse.ArgumentTypeError(
          f"--shapes entry {item!r}: expected at least 2 chips per dimension")
    shapes.append((rows, cols))
  return shapes


def _parser() -> argparse.ArgumentParser:
  # argparse rather than absl flags: importing this tool must not register
  # names in the global flag namespace that main.py owns.
  p = argparse.ArgumentParser(prog="python -m lab.allreduce_sim",
                              description=__doc__.splitlines()[0])
  p.add_argument("--output_dir", default="bench_results",
                 help="Directory for allreduce_sim.md, .json and .png.")
  p.add_argument("--alpha_us", type=float, default=DEFAULT_ALPHA_US,
                 help="Latency of one ring step, microseconds.")
  p.add_argument("--link_gbytes_per_s", type=float,
                 default=TPU_V3_LINK_GBYTES_PER_S,
                 help="Bandwidth of one link in one direction, GB/s.")
  p.add_argument("--bidirectional", action=argparse.BooleanOptionalAction,
                 default=True,
                 help="Use both directions of every link (counter-rotating "
                 "rings).")
  p.add_argument("--num_values", type=int, default=RESNET50_NUM_VALUES,
                 help="Number of gradient values summed.")
  p.add_argument("--shapes", type=_parse_shapes, default=list(DEFAULT_SHAPES),
                 help="Comma-separated ROWSxCOLS tori, e.g. 2x4,32x32.")
  return p


def main(argv: Sequence[str] | None = None) -> int:
  """Writes allreduce_sim.md/.json/.png and prints the markdown report."""
  parser = _parser()
  args = parser.parse_args(argv)
  if args.alpha_us < 0 or args.link_gbytes_per_s <= 0 or args.num_values <= 0:
    parser.error("expected --alpha_us >= 0, --link_gbytes_per_s > 0 and "
                 "--num_values > 0")
  link = LinkModel(args.alpha_us * 1e-6, args.link_gbytes_per_s * 1e9,
                   args.bidirectional)
  results = simulate(args.shapes, args.num_values, link)
  report = render_markdown(results, args.num_values, link)
  os.makedirs(args.output_dir, exist_ok=True)
  path = os.path.join(args.output_dir, "allreduce_sim")
  with open(path + ".md", "w") as f:
    f.write(report)
  with open(path + ".json", "w") as f:
    json.dump({"parameters": dataclasses.asdict(link)
                             | {"num_values": args.num_values},
               "sources": list(LINK_SOURCES),
               "speedup_over_ring_1d_at_32x32": speedups(
                   HEADLINE_SHAPE, args.num_values, link),
               "moving_statistics_bytes_per_chip_per_step": {
                   str(chips): {o: statistics_bytes_per_step(o, chips)
                                for o in STATISTICS_OPTIONS}
                   for chips in STATISTICS_CHIPS},
               "results": results}, f, indent=1)
  plot(results, path + ".png")
  print(report)
  logging.info("Wrote %s.{md,json,png}", path)
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
