"""Gradient all-reduce across replicas (Ying et al. §3.3; Mikami et al.).

Every collective runs for real on 8 (a 4x4 grid: 16) virtual CPU replicas,
with a timeout so a key mismatch fails instead of hanging.
"""
import collections
import dataclasses
import graphlib

import keras
import numpy as np
import pytest
import tensorflow as tf

from collective_helpers import op_counts as _op_counts
from collective_helpers import per_replica as _per_replica
from collective_helpers import TIMEOUT_S
from conftest import cpu_strategy
from resnet_tpu.parallel.tensorflow import gradient_all_reduce
from resnet_tpu.config import ConfigError
from resnet_tpu.config import parse_grid
from resnet_tpu.optim.optimizers import build_optimizer
from resnet_tpu.parallel.replica_groups import Subgroup
from resnet_tpu.clock import EpochClock
from lab import allreduce_sim as sim

REPLICAS = 8


def _id(value):
  """Test ids: grids as 4x2."""
  return "x".join(map(str, value)) if isinstance(value, tuple) else None


# --- gradient all-reduce ------------------------------------------------------


def _traced_all_reduce(algorithm, grid, x):
  """A tf.function in which replica r sums x[r] by `algorithm` on `grid`."""
  strategy = cpu_strategy(len(x))
  summation = gradient_all_reduce.GradientSummation(algorithm, grid, TIMEOUT_S)

  @tf.function
  def step():
    def replica_fn():
      ctx = tf.distribute.get_replica_context()
      return summation.all_reduce(tf.gather(x, ctx.replica_id_in_sync_group),
                                  ctx)
    return strategy.run(replica_fn)

  return strategy, step


@pytest.mark.parametrize("algorithm,grid",
                         [("2d", (2, 4)), ("2d", (4, 2)), ("2d", (1, 8)),
                          ("ring", None), ("2d_ying", (2, 4)),
                          ("2d_ying", (4, 2)), ("2d_ying", (4, 4)),
                          ("2d_ying", (1, 8)), ("2d_ying", (8, 1))],
                         ids=_id)
def test_gradient_all_reduce_equals_a_plain_sum(algorithm, grid):
  replicas = grid[0] * grid[1] if grid else REPLICAS
  # 45 values: a multiple of no row length, nor of 2XY (2d_ying's halves
  # of a padded vector), so padding is exercised.
  x = np.random.default_rng(1).normal(size=(replicas, 45)).astype(np.float32)
  strategy, step = _traced_all_reduce(algorithm, grid, x)
  np.testing.assert_allclose(_per_replica(strategy, step()),
                             np.tile(x.sum(axis=0), (replicas, 1)),
                             rtol=1e-5, atol=1e-6)


def _tiny_model():
  return keras.Sequential([
      keras.Input((6, 6, 3)),
      keras.layers.Conv2D(4, 3, activation="relu"),
      keras.layers.Flatten(),
      keras.layers.Dense(5),
  ])


def _train_one_step(optimizer_name, algorithm, grid, data):
  images, labels = data
  strategy = cpu_strategy(REPLICAS)
  keras.utils.set_random_seed(0)
  with strategy.scope():
    model = _tiny_model()
    optimizer = build_optimizer(
        optimizer_name, 0.5, clock=EpochClock(64, ((0, 16),)),
        rmsprop_warmup_center_epochs=1.0,
        gradient_all_reduce=algorithm, all_reduce_grid=grid,
        collective_timeout_s=TIMEOUT_S)
    optimizer.build(model.trainable_variables)
  global_batch = len(labels)

  @tf.function
  def step():
    def replica_fn():
      r = tf.distribute.get_replica_context().replica_id_in_sync_group
      per = global_batch // REPLICAS
      x = images[r * per:(r + 1) * per]
      y = labels[r * per:(r + 1) * per]
      with tf.GradientTape() as tape:
        logits = model(x, training=True)
        loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(
            y, logits, from_logits=True)) / global_batch
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
    strategy.run(replica_fn)

  step()
  return [v.numpy() for v in model.trainable_variables], _op_counts(step)


# The explicit summation's collectives of each replica, by op type.
EXPLICIT_OPS = {"2d": ("CollectiveAllToAllV2", 1),
                "2d_ying": ("CollectiveAllToAllV2", 4),
                "ring": (("ours", REPLICAS), 1)}


@pytest.mark.parametrize("optimizer_name,algorithm,grid", [
    ("momentum", "2d", (2, 4)),
    ("lars", "2d", (4, 2)),
    ("rmsprop_warmup", "ring", None),
    ("momentum", "2d_ying", (4, 2)),
    ("lars", "2d_ying", (2, 4)),
], ids=_id)
def test_training_step_with_explicit_summation_equals_default_summation(
    optimizer_name, algorithm, grid):
  rng = np.random.default_rng(2)
  data = (tf.constant(rng.normal(size=(16, 6, 6, 3)), tf.float32),
          tf.constant(rng.integers(0, 5, size=16)))
  default, default_ops = _train_one_step(optimizer_name, "auto", None, data)
  explicit, explicit_ops = _train_one_step(optimizer_name, algorithm, grid,
                                           data)
  for got, want in zip(explicit, default):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # Keras still sums in one replaceable place (compat.py): the explicit
  # collectives are in the step (per replica), and equal weights show
  # Keras did not sum a second time.
  explicit_op, per_replica = EXPLICIT_OPS[algorithm]
  assert explicit_ops[explicit_op] == per_replica * REPLICAS
  assert default_ops[explicit_op] == 0


def test_gradient_all_reduce_options_name_their_flags():
  assert parse_grid("4x2") == (4, 2)
  assert parse_grid("") is None
  assert gradient_all_reduce.default_grid(8) == (4, 2)
  assert gradient_all_reduce.default_grid(7) == (7, 1)
  with pytest.raises(ConfigError, match="--all_reduce_grid"):
    parse_grid("4by2")


# --- the collectives each replica runs, phase by phase ------------------------

# Op type -> (collective, values a member sends to the others: from the
# group size n and the op's static input shape).
_COLLECTIVES = {
    "CollectiveAllToAllV2": ("reduce_scatter", lambda n, shape: (
        (n - 1) * shape[1])),
    "CollectiveGatherV2": ("all_gather", lambda n, shape: (n - 1) * shape[0]),
    "CollectiveReduceV2": ("all_reduce", lambda n, shape: (
        2 * (n - 1) * shape[0] // n)),
}


@dataclasses.dataclass(frozen=True, order=True)
class _Collective:
  """One collective of one replica; `half` names its chain by the grid
  dimension of the chain's first collective."""
  half: str
  kind: str
  dim: str
  group_size: int
  sent: int


def _grid_dims(grid, replica):
  """Group key -> "row" or "column" for `replica` of `grid` = (X, Y)."""
  cols, rows = grid
  row, col = divmod(replica, cols)
  return {Subgroup(tuple(members), replica, "").key: dim for dim, members in
          (("row", range(row * cols, (row + 1) * cols)),
           ("column", range(col, cols * rows, cols)))}


def _collective_phases(function, grid):
  """Per replica, its collectives by phase: phase k holds those with k - 1
  collectives before them on their longest chain of data and control
  dependences (tf.function's ordering tokens show as control inputs)."""
  graph = function.get_concrete_function().graph
  preds = {op: [t.op for t in op.inputs] + op.control_inputs
           for op in graph.get_operations()}
  depth, roots, phases = {}, {}, collections.defaultdict(dict)
  for op in graphlib.TopologicalSorter(preds).static_order():
    depth[op] = max((depth[p] for p in preds[op]), default=0)
    roots[op] = set().union(*(roots[p] for p in preds[op]))
    if op.type not in _COLLECTIVES:
      continue
    depth[op] += 1
    replica = tf.DeviceSpec.from_string(op.device).device_index
    size, key = (int(tf.get_static_value(t)) for t in op.inputs[1:3])
    dim = _grid_dims(grid, replica)[key]
    roots[op] = roots[op] or {dim}
    kind, sent = _COLLECTIVES[op.type]
    (half,) = roots[op]  # Each collective hangs from one chain.
    phases[replica].setdefault(depth[op], []).append(_Collective(
        f"{half}s_first", kind, dim, size, sent(size, op.inputs[0].shape)))
  return {r: [sorted(p[k]) for k in sorted(p)] for r, p in phases.items()}


@pytest.mark.parametrize("grid", [(4, 2), (2, 4), (4, 4)], ids=_id)
def test_2d_ying_sums_one_half_rows_first_and_the_other_columns_first_at_once(
    grid):
  """Ying et al. §3.3: in each of 4 phases one half works along rows and the
  other along columns, and no collective waits for the other half."""
  replicas = grid[0] * grid[1]
  _, step = _traced_all_reduce("2d_ying", grid,
                               np.zeros((replicas, 45), np.float32))
  counts = _op_counts(step)
  assert counts["CollectiveAllToAllV2"] == 4 * replicas
  assert counts["CollectiveGatherV2"] == 4 * replicas
  assert counts["CollectiveReduceV2"] == 0
  # The halves, by the grid dimension each reduces first.
  rows, columns = "rows_first", "columns_first"
  expected = [  # Per phase, (half, collective, grid dimension), sorted.
      [(columns, "reduce_scatter", "column"), (rows, "reduce_scatter", "row")],
      [(columns, "reduce_scatter", "row"), (rows, "reduce_scatter", "column")],
      [(columns, "all_gather", "row"), (rows, "all_gather", "column")],
      [(columns, "all_gather", "column"), (rows, "all_gather", "row")],
  ]
  phases = _collective_phases(step, grid)
  assert sorted(phases) == list(range(replicas))
  for replica_phases in phases.values():
    assert [sorted((c.half, c.kind, c.dim) for c in phase)
            for phase in replica_phases] == expected


# Executable option -> its model in lab/allreduce_sim.py.
SIM_ALGORITHM = {"2d_ying": "ying_2d", "2d": "grid_2d"}
_PORT_DIMS = {"x": "row", "y": "column"}  # x runs along a row.


def _sim_phases(schedule, chip):
  """Per phase, (dimension, ring steps, values `chip` sends) of each lane."""
  return [sorted((_PORT_DIMS[lane[0][0].port[1]], len(lane),
                  sum(m.stop - m.start for messages in lane
                      for m in messages if m.src == chip))
                 for lane in phase) for phase in schedule]


def _as_ring_phases(phases):
  """The simulator's view of executed phases: a collective among n members
  takes n - 1 ring steps, and an all-reduce is a reduce-scatter phase and an
  all-gather phase of half its values each."""
  out = []
  for phase in phases:
    lanes = [(c.dim, c.group_size - 1, c.sent) for c in phase]
    if any(c.kind == "all_reduce" for c in phase):
      ((dim, steps, sent),) = lanes
      out += [[(dim, steps, sent // 2)]] * 2
    else:
      out.append(sorted(lanes))
  return out


@pytest.mark.parametrize("algorithm", sorted(SIM_ALGORITHM))
@pytest.mark.parametrize("grid", [(4, 2), (2, 4), (4, 4)], ids=_id)
def test_simulator_counts_the_values_and_steps_the_executable_sends(algorithm,
                                                                   grid):
  """The ying_2d and grid_2d models of lab.allreduce_sim are 2d_ying and
  2d: the traced graph's phases, ring steps and values sent by each replica
  along rows and along columns equal the simulator's, chip by chip."""
  cols, rows = grid
  # A multiple of 2XY: no padding, which the simulator does not model.
  replicas, num_values = cols * rows, 2 * cols * rows * 3
  _, step = _traced_all_reduce(algorithm, grid,
                               np.zeros((replicas, num_values), np.float32))
  executed = {r: _as_ring_phases(p)
              for r, p in _collective_phases(step, grid).items()}
  name = SIM_ALGORITHM[algorithm]
  schedule = sim.build_schedule(name, rows, cols, num_values,
                                bidirectional=False)
  for replica in range(replicas):
    assert executed[replica] == _sim_phases(schedule, replica)
  # The closed forms: steps on the critical path and values per link.
  latency_bound = sim.LinkModel(1.0, 1e30, bidirectional=False)
  cost = sim.model_cost(name, rows, cols, num_values, latency_bound)
  assert cost.rounds == sum(max(lane[1] for lane in phase)
                            for phase in executed[0])
  per_link = collections.Counter()
  for replica, phases in executed.items():
    for phase in phases:
      for dim, _, sent in phase:
        per_link[replica, dim] += sent
  loads = sim.model_link_loads(name, rows, cols, num_values, False)
  assert sorted(per_link.values()) == pytest.approx(sorted(
      b for b, count in loads.items() for _ in range(count)), rel=1e-12)
