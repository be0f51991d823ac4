"""Gradient summation across replicas (Ying et al. 2018 §3.3; Mikami et al.).

By default ("auto") gradients are summed inside the Keras optimizer: one
all-reduce per gradient over all replicas, which XLA runs on the TPU torus.
On GPU/CPU replicas `use_gradient_all_reduce` replaces it with an explicit
algorithm over one flat vector of every gradient:

  ring:    one all-reduce over all replicas (TF's ring reducer on CPU,
           NCCL's ring on GPU);
  2d:      Mikami et al. 2018's 2D-Torus all-reduce over an X x Y replica
           grid: reduce-scatter along rows, all-reduce along columns,
           all-gather along rows, one grid dimension at a time;
  2d_ying: Ying et al. 2018 §3.3's 2-D gradient summation over the same
           grid: two halves of the vector, one reduced rows first and the
           other columns first, at the same time, so both dimensions work
           in every phase.

lab/allreduce_sim.py models the link traffic of each: its grid_2d is
`2d`, its ying_2d is `2d_ying`.
"""
import dataclasses

import keras
import tensorflow as tf

from resnet_tpu.runtime import compat
from resnet_tpu.parallel import replica_groups

Grid = tuple[int, int]


def default_grid(num_replicas: int) -> Grid:
  """The squarest X x Y = num_replicas grid with X >= Y."""
  rows = max(d for d in range(1, int(num_replicas ** 0.5) + 1)
             if num_replicas % d == 0)
  return num_replicas // rows, rows


def _grid_position(grid: Grid, ctx: tf.distribute.ReplicaContext
                   ) -> tuple[int, int]:
  """(row, column) of the calling replica: a row is X consecutive replicas
  (typically one host)."""
  cols, rows = grid
  if cols * rows != ctx.num_replicas_in_sync:
    raise ValueError(f"--all_reduce_grid={cols}x{rows} must multiply to the "
                     f"number of replicas ({ctx.num_replicas_in_sync}).")
  return divmod(replica_groups.static_replica_id(ctx), cols)


def mikami_2d_torus_all_reduce(x: tf.Tensor, grid: Grid,
                        ctx: tf.distribute.ReplicaContext,
                        timeout_seconds: float = 0.0) -> tf.Tensor:
  """2D-Torus all-reduce (Mikami et al. 2018) of a 1-D tensor.

  Replicas form `grid` = (X, Y): replica r sits in row r // X, column r % X.
  Reduce-scatter along the row, all-reduce the 1/X chunk along the column,
  all-gather along the row: one grid dimension at a time. Each replica
  sends 2 size(x) (X-1)/X + 2 size(x) (Y-1)/(XY) values, the same
  2 size(x) (N-1)/N as one ring, in 2(X-1) + 2(Y-1) ring steps instead of
  2(N-1). Ranks in a group follow replica order (true on CPU and with one
  device per worker).
  """
  cols, rows = grid
  row, col = _grid_position(grid, ctx)
  size = x.shape[0]
  padded = size + -size % cols
  chunk = tf.pad(x, [[0, padded - size]])
  if cols > 1:
    row_group = replica_groups.Subgroup.of(
        ctx, range(row * cols, (row + 1) * cols), timeout_seconds)
    chunk = row_group.reduce_scatter(chunk)
  if rows > 1:
    chunk = replica_groups.Subgroup.of(
        ctx, range(col, cols * rows, cols), timeout_seconds).sum(chunk)
  if cols > 1:
    chunk = tf.reshape(row_group.gather(chunk), [padded])
  return chunk[:size]


def _scatter_then_gather(x: tf.Tensor,
                         groups: list[replica_groups.Subgroup]) -> tf.Tensor:
  """Reduce-scatters `x` along each group in turn, then all-gathers the
  shard back along the groups in reverse order: the sum of `x` over all
  their members."""
  for group in groups:
    x = group.reduce_scatter(x)
  for group in reversed(groups):
    x = tf.reshape(group.gather(x), [x.shape[0] * group.size])
  return x


def ying_2d_all_reduce(x: tf.Tensor, grid: Grid,
                       ctx: tf.distribute.ReplicaContext,
                       timeout_seconds: float = 0.0) -> tf.Tensor:
  """2-D gradient summation (Ying et al. 2018 §3.3) of a 1-D tensor.

  Replicas form `grid` = (X, Y) as in `mikami_2d_torus_all_reduce`. `x`, padded
  to a multiple of 2XY, is cut in two halves reduced concurrently along the
  two dimensions: the first half is reduce-scattered along the row, then
  along the column, and all-gathered back along the column, then the row;
  the second half goes column, row, then gathers row, column. In each of
  the 4 phases one half uses the row dimension and the other the column
  dimension. The halves share no data and order their collectives on
  separate chains (replica_groups.Subgroup.chain), so TensorFlow can run
  them at the same time. Each replica sends the 2 size(x) (N-1)/N values of
  one ring, split between rows and columns, in 4 phases of X-1 or Y-1 ring
  steps each. Tested on CPU replicas only: NCCL needs every GPU to launch
  its collectives in one order, which two independent chains do not fix,
  so on GPUs `2d` (one chain) is the tested choice.
  """
  cols, rows = grid
  r, c = _grid_position(grid, ctx)
  row, column = range(r * cols, (r + 1) * cols), range(c, cols * rows, cols)

  def subgroups(members: list[range], chain: str
                ) -> list[replica_groups.Subgroup]:
    return [replica_groups.Subgroup.of(ctx, m, timeout_seconds, chain)
            for m in members if len(m) > 1]

  size = x.shape[0]
  first, second = tf.split(tf.pad(x, [[0, -size % (2 * cols * rows)]]), 2)
  first = _scatter_then_gather(first, subgroups([row, column], "rows_first"))
  second = _scatter_then_gather(second,
                                subgroups([column, row], "columns_first"))
  return tf.concat([first, second], 0)[:size]


def ring_all_reduce(x: tf.Tensor, ctx: tf.distribute.ReplicaContext,
                    timeout_seconds: float = 0.0) -> tf.Tensor:
  """One all-reduce of `x` over all replicas."""
  return replica_groups.Subgroup.of(
      ctx, range(ctx.num_replicas_in_sync), timeout_seconds).sum(x)


@dataclasses.dataclass(frozen=True)
class GradientSummation:
  """Sums per-replica gradients exactly once with `algorithm`.

  Takes the place of Keras's own summation (compat.py): all gradients travel
  as one flat float32 vector, are summed, and are split back into their
  shapes and dtypes.
  """
  algorithm: str
  grid: Grid | None = None
  timeout_seconds: float = 0.0

  def __call__(self, grads_and_vars):
    pairs = list(grads_and_vars)
    ctx = replica_groups.replica_context()
    if ctx is None:
      return pairs
    self._check_context(ctx)
    grads = [tf.convert_to_tensor(g) for g, _ in pairs if g is not None]
    flat = tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1])
                      for g in grads], 0)
    flat = self.all_reduce(flat, ctx)
    pieces = iter(tf.split(flat, [g.shape.num_elements() for g in grads]))
    return [(g if g is None else
             tf.cast(tf.reshape(next(pieces), tf.shape(g)), g.dtype), v)
            for g, v in pairs]

  def all_reduce(self, flat: tf.Tensor,
                 ctx: tf.distribute.ReplicaContext) -> tf.Tensor:
    """The sum over all replicas of one flat vector, by `algorithm`."""
    if self.algorithm == "ring":
      return ring_all_reduce(flat, ctx, self.timeout_seconds)
    grid = self.grid or default_grid(ctx.num_replicas_in_sync)
    two_d = (ying_2d_all_reduce if self.algorithm == "2d_ying" else
             mikami_2d_torus_all_reduce)
    return two_d(flat, grid, ctx, self.timeout_seconds)

  def _check_context(self, ctx: tf.distribute.ReplicaContext) -> None:
    if replica_groups.is_tpu(ctx.strategy):
      raise ValueError(
          f"--gradient_all_reduce={self.algorithm} is for GPU/CPU replicas; "
          "on TPU use auto: XLA already sums gradients with a 2-D all-reduce "
          "on the torus (Ying et al. §3.3).")
    if (not replica_groups.has_raw_collectives(ctx.strategy) or
        tf.executing_eagerly()):
      raise ValueError(
          f"--gradient_all_reduce={self.algorithm} needs Mirrored or "
          "MultiWorkerMirroredStrategy inside a tf.function.")


def use_gradient_all_reduce(optimizer: keras.optimizers.Optimizer,
                            algorithm: str = "auto",
                            grid: Grid | None = None,
                            timeout_seconds: float = 0.0
                            ) -> keras.optimizers.Optimizer:
  """Makes `optimizer` sum gradients with `algorithm`; returns it.

  "auto" keeps Keras's summation. Any other algorithm replaces it for this
  optimizer object, whatever its update rule.
  """
  if algorithm != "auto":
    compat.replace_gradient_summation(
        optimizer, GradientSummation(algorithm, grid, timeout_seconds))
  return optimizer
