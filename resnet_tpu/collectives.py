"""Group and gradient all-reduce (Ying et al. 2018 §3.1, §3.3; Mikami et al.).

Distributed BN (§3.1) sums per-channel statistics over a *group* of g
replicas: replicas [k*g, (k+1)*g) form group k. `group_all_reduce` has one
interface and three backends; the first two cost one all-reduce of size(x)
among the g replicas of a group, independent of the replica count N:

  TPUStrategy:            CrossReplicaSum with a group_assignment. The
                          topology module orders replicas so that each group
                          is a compact tile of neighbouring cores.
  Mirrored/MultiWorker:   CollectiveReduceV2 with one group key per group.
  masked (reference):     a full all-reduce of an [N/g, size(x)] one-hot
                          buffer: N/g times the bytes, over all N replicas.

Gradient summation (§3.3) stays inside the Keras optimizer ("auto": one
all-reduce of every gradient over all replicas, which XLA runs as a 2-D
all-reduce on the TPU torus). On GPU/CPU replicas `use_gradient_all_reduce`
replaces it with an explicit "ring" (one collective over the flattened
gradients) or "2d": Mikami et al.'s 2D-Torus all-reduce over an X x Y grid.

The raw V2 collectives take plain-int keys fixed when the step is traced:
MirroredStrategy traces the step once per replica with a static replica id.
Every replica (and every worker) must trace the same collectives in the same
order, which a synchronous data-parallel step does.
"""
import contextlib
import dataclasses
import threading
import zlib
from typing import Iterator, Sequence

import keras
import tensorflow as tf

BN_ALL_REDUCE = ("auto", "collective", "masked")
GRADIENT_ALL_REDUCE = ("auto", "ring", "2d")
# tf.distribute numbers its own group keys up from 1 (plus 100000 per extra
# strategy in tests); ours live far above them.
GROUP_KEY_BASE = 1 << 28
_GROUP_KEY_RANGE = 1 << 24


@dataclasses.dataclass(frozen=True)
class Options:
  """Process-wide collective options, read when a step is traced.

  bn_all_reduce: "auto" (the strategy's subgroup collective inside a
    tf.function, else masked), "collective" or "masked".
  timeout_seconds: fail a raw collective that waits longer (0 = never).
  """
  bn_all_reduce: str = "auto"
  timeout_seconds: float = 0.0


_options = Options()


def set_options(bn_all_reduce: str = "auto",
                timeout_seconds: float = 0.0) -> None:
  """Sets the options of every later-traced collective (`--bn_all_reduce`)."""
  global _options
  if bn_all_reduce not in BN_ALL_REDUCE:
    raise ValueError(f"--bn_all_reduce must be one of {BN_ALL_REDUCE}, got "
                     f"{bn_all_reduce!r}.")
  if timeout_seconds < 0:
    raise ValueError(f"timeout_seconds must be >= 0, got {timeout_seconds}.")
  _options = Options(bn_all_reduce, float(timeout_seconds))


@contextlib.contextmanager
def options(**changes) -> Iterator[Options]:
  """Temporarily changes some options (tests and benchmarks)."""
  previous = _options
  set_options(**{**dataclasses.asdict(previous), **changes})
  try:
    yield _options
  finally:
    set_options(**dataclasses.asdict(previous))


def group_assignment(num_replicas: int, group_size: int) -> list[list[int]]:
  """The BN groups: replicas [k*g, (k+1)*g) form group k."""
  if group_size < 1 or num_replicas % group_size:
    raise ValueError(f"bn_group_size={group_size} must divide the number of "
                     f"replicas ({num_replicas}).")
  return [list(range(start, start + group_size))
          for start in range(0, num_replicas, group_size)]


# --- BN group all-reduce ----------------------------------------------------


def _replica_context() -> tf.distribute.ReplicaContext | None:
  """The replica context of a multi-replica step, or None outside one."""
  ctx = tf.distribute.get_replica_context()
  if ctx is None or ctx.num_replicas_in_sync == 1:
    return None
  return ctx


def _is_tpu(strategy: tf.distribute.Strategy) -> bool:
  return isinstance(strategy, (tf.distribute.TPUStrategy,
                               tf.distribute.experimental.TPUStrategy))


def _has_raw_collectives(strategy: tf.distribute.Strategy) -> bool:
  return isinstance(strategy, (tf.distribute.MirroredStrategy,
                               tf.distribute.MultiWorkerMirroredStrategy))


def _resolve_implementation(implementation: str | None,
                            ctx: tf.distribute.ReplicaContext) -> str:
  name = implementation or _options.bn_all_reduce
  if name not in BN_ALL_REDUCE:
    raise ValueError(f"--bn_all_reduce must be one of {BN_ALL_REDUCE}, got "
                     f"{name!r}.")
  efficient = _is_tpu(ctx.strategy) or (
      _has_raw_collectives(ctx.strategy) and not tf.executing_eagerly())
  if name == "auto":
    return "collective" if efficient else "masked"
  if name == "collective" and not efficient:
    raise ValueError(
        "--bn_all_reduce=collective needs TPUStrategy, or Mirrored/"
        "MultiWorkerMirroredStrategy inside a tf.function; got "
        f"{type(ctx.strategy).__name__} (eager: {tf.executing_eagerly()}).")
  return name


def group_all_reduce(x: tf.Tensor, group_size: int,
                     implementation: str | None = None) -> tf.Tensor:
  """Sums `x` over the `group_size` replicas of the caller's group.

  Outside a multi-replica step (or with group_size 1) this is the identity.
  Gradients flow through: the gradient of a group sum is the group sum of the
  upstream gradient. `implementation` overrides `Options.bn_all_reduce`.
  """
  ctx = _replica_context()
  if ctx is None or group_size == 1:
    return x
  groups = group_assignment(ctx.num_replicas_in_sync, group_size)
  name = _resolve_implementation(implementation, ctx)
  if name == "masked":
    return masked_group_all_reduce(x, group_size, ctx)
  if _is_tpu(ctx.strategy):
    return tpu_group_all_reduce(x, groups)
  replica = _static_replica_id(ctx)
  return collective_group_all_reduce(x, groups[replica // group_size], ctx)


def tpu_group_all_reduce(x: tf.Tensor,
                         groups: Sequence[Sequence[int]]) -> tf.Tensor:
  """CrossReplicaSum within `groups` (TPU; its gradient is registered)."""
  return tf.compat.v1.tpu.cross_replica_sum(x, groups)


def collective_group_all_reduce(x: tf.Tensor, members: Sequence[int],
                                ctx: tf.distribute.ReplicaContext
                                ) -> tf.Tensor:
  """Sums `x` over the replicas `members` with one CollectiveReduceV2.

  CollectiveReduceV2 has no registered gradient; the custom one is the same
  group sum of the upstream gradient, with its own instance key.
  """
  group = _Group.of(ctx, members)

  @tf.custom_gradient
  def summed(value):
    return _collective_sum(value, group), lambda dy: _collective_sum(dy, group)

  return summed(x)


def masked_group_all_reduce(x: tf.Tensor, group_size: int,
                            ctx: tf.distribute.ReplicaContext) -> tf.Tensor:
  """Reference group sum by a full all-reduce of a one-hot masked buffer.

  Cost: every replica all-reduces an [N/g, size(x)] buffer, i.e. N/g times the
  bytes of a plain all-reduce of x. Correct on every strategy and eagerly;
  kept as the reference the efficient backends are tested against.
  """
  num_replicas = ctx.num_replicas_in_sync
  num_groups = len(group_assignment(num_replicas, group_size))
  group_id = ctx.replica_id_in_sync_group // group_size
  mask = tf.one_hot(group_id, num_groups, dtype=x.dtype)
  mask = tf.reshape(mask, [num_groups] + [1] * x.shape.rank)
  summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, mask * x[tf.newaxis])
  return tf.gather(summed, group_id)


# --- raw V2 collectives among a subgroup of replicas ------------------------

_lock = threading.Lock()
_last_instance_key: dict[tuple[int, int], int] = {}
_ordering_tokens: dict[str, tf.Tensor] = {}


def _static_replica_id(ctx: tf.distribute.ReplicaContext) -> int:
  replica = tf.get_static_value(ctx.replica_id_in_sync_group)
  if replica is None:
    raise ValueError("Subgroup collectives need a static replica id "
                     "(MirroredStrategy or MultiWorkerMirroredStrategy).")
  return int(replica)


def _ordering_token(device: str) -> tf.Tensor:
  """A resource handle on `device` that orders that device's collectives.

  tf.function chains ops sharing a resource in program order. One handle per
  device orders each replica's collectives without chaining replicas to each
  other (which deadlocks); tf.distribute's own launcher does the same.
  """
  with _lock:
    if device not in _ordering_tokens:
      with tf.init_scope(), tf.device(device):
        _ordering_tokens[device] = tf.raw_ops.VarHandleOp(
            dtype=tf.float32, shape=[], shared_name="collective_order")
    return _ordering_tokens[device]


@dataclasses.dataclass(frozen=True)
class _Group:
  """The calling replica's handle on one subgroup of replicas."""
  members: tuple[int, ...]
  replica: int
  device: str

  @classmethod
  def of(cls, ctx: tf.distribute.ReplicaContext,
         members: Sequence[int]) -> "_Group":
    replica = _static_replica_id(ctx)
    devices = ctx.strategy.extended.worker_devices
    # Replicas are numbered worker by worker, len(devices) per worker.
    return cls(tuple(members), replica, devices[replica % len(devices)])

  @property
  def key(self) -> int:
    """Same members, same key: on every replica and every worker."""
    digest = zlib.crc32(repr(self.members).encode())
    return GROUP_KEY_BASE + digest % _GROUP_KEY_RANGE

  def next_instance_key(self) -> int:
    """Counts this replica's collectives in the group, in trace order."""
    with _lock:
      slot = (self.key, self.replica)
      _last_instance_key[slot] = _last_instance_key.get(slot, 0) + 1
      return _last_instance_key[slot]

  def op_args(self) -> dict:
    return dict(group_size=len(self.members), group_key=self.key,
                instance_key=self.next_instance_key(),
                ordering_token=[_ordering_token(self.device)],
                timeout_seconds=_options.timeout_seconds)


def _collective_sum(x: tf.Tensor, group: _Group) -> tf.Tensor:
  with tf.device(group.device):
    return tf.raw_ops.CollectiveReduceV2(
        input=x, merge_op="Add", final_op="Id", **group.op_args())


def _collective_reduce_scatter(x: tf.Tensor, group: _Group) -> tf.Tensor:
  """Rank i of `group` gets the group sum of the i-th of len(group) chunks.

  CollectiveReduceScatterV2 exists for NCCL only; an all-to-all of the chunks
  followed by a local sum moves the same bytes and works on every device.
  """
  size = len(group.members)
  with tf.device(group.device):
    received = tf.raw_ops.CollectiveAllToAllV2(
        input=tf.reshape(x, [size, -1]), **group.op_args())
    return tf.reduce_sum(received, axis=0)


def _collective_gather(x: tf.Tensor, group: _Group) -> tf.Tensor:
  """The members' `x` concatenated in rank order."""
  with tf.device(group.device):
    return tf.raw_ops.CollectiveGatherV2(input=x, **group.op_args())


# --- gradient summation: ring or 2-D grid (Mikami et al.) -------------------


def parse_grid(text: str) -> tuple[int, int] | None:
  """'XxY' -> (X, Y); '' -> None (choose with `default_grid`)."""
  if not text:
    return None
  parts = text.lower().split("x")
  if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
    raise ValueError(f"--all_reduce_grid must look like '4x2' (replicas per "
                     f"row x rows), got {text!r}.")
  return int(parts[0]), int(parts[1])


def default_grid(num_replicas: int) -> tuple[int, int]:
  """The squarest X x Y = num_replicas grid with X >= Y."""
  rows = max(d for d in range(1, int(num_replicas ** 0.5) + 1)
             if num_replicas % d == 0)
  return num_replicas // rows, rows


def grid_all_reduce(x: tf.Tensor, grid: tuple[int, int],
                    ctx: tf.distribute.ReplicaContext) -> tf.Tensor:
  """2D-Torus all-reduce (Mikami et al. 2018) of a 1-D tensor.

  Replicas form `grid` = (X, Y): replica r sits in row r // X, column r % X,
  so a row is X consecutive replicas (typically one host). Reduce-scatter
  along the row, all-reduce the 1/X chunk along the column, all-gather along
  the row. Each replica sends about 2 size(x) (X-1)/X + 2 size(x) (Y-1)/(XY)
  values instead of 2 size(x) (N-1)/N in one ring, in 2(X-1) + 2(Y-1) steps
  instead of 2(N-1). Ranks in a group follow replica order (true on CPU and
  with one device per worker).
  """
  cols, rows = grid
  if cols * rows != ctx.num_replicas_in_sync:
    raise ValueError(f"--all_reduce_grid={cols}x{rows} must multiply to the "
                     f"number of replicas ({ctx.num_replicas_in_sync}).")
  replica = _static_replica_id(ctx)
  row, col = divmod(replica, cols)
  size = x.shape[0]
  padded = size + -size % cols
  chunk = tf.pad(x, [[0, padded - size]])
  if cols > 1:
    row_group = _Group.of(ctx, range(row * cols, (row + 1) * cols))
    chunk = _collective_reduce_scatter(chunk, row_group)
  if rows > 1:
    chunk = _collective_sum(chunk, _Group.of(ctx, range(col, cols * rows,
                                                        cols)))
  if cols > 1:
    chunk = tf.reshape(_collective_gather(chunk, row_group), [padded])
  return chunk[:size]


def ring_all_reduce(x: tf.Tensor,
                    ctx: tf.distribute.ReplicaContext) -> tf.Tensor:
  """One all-reduce of `x` over all replicas: a ring (TF's ring reducer on
  CPU, NCCL's ring all-reduce on GPU)."""
  group = _Group.of(ctx, range(ctx.num_replicas_in_sync))
  return _collective_sum(x, group)


@dataclasses.dataclass(frozen=True)
class GradientSummation:
  """Sums per-replica gradients exactly once with a ring or 2-D all-reduce.

  Takes the place of Keras's TFOptimizer._all_reduce_sum_gradients: all
  gradients travel as one flat float32 vector, are summed, and are split
  back into their shapes and dtypes.
  """
  algorithm: str
  grid: tuple[int, int] | None = None

  def __call__(self, grads_and_vars):
    pairs = list(grads_and_vars)
    ctx = _replica_context()
    if ctx is None:
      return pairs
    self._check_context(ctx)
    grads = [tf.convert_to_tensor(g) for g, _ in pairs if g is not None]
    flat = tf.concat([tf.reshape(tf.cast(g, tf.float32), [-1])
                      for g in grads], 0)
    if self.algorithm == "ring":
      flat = ring_all_reduce(flat, ctx)
    else:
      grid = self.grid or default_grid(ctx.num_replicas_in_sync)
      flat = grid_all_reduce(flat, grid, ctx)
    pieces = iter(tf.split(flat, [g.shape.num_elements() for g in grads]))
    return [(g if g is None else
             tf.cast(tf.reshape(next(pieces), tf.shape(g)), g.dtype), v)
            for g, v in pairs]

  def _check_context(self, ctx: tf.distribute.ReplicaContext) -> None:
    if _is_tpu(ctx.strategy):
      raise ValueError(
          f"--gradient_all_reduce={self.algorithm} is for GPU/CPU replicas; "
          "on TPU use auto: XLA already sums gradients with a 2-D all-reduce "
          "on the torus (Ying et al. §3.3).")
    if not _has_raw_collectives(ctx.strategy) or tf.executing_eagerly():
      raise ValueError(
          f"--gradient_all_reduce={self.algorithm} needs Mirrored or "
          "MultiWorkerMirroredStrategy inside a tf.function.")


def use_gradient_all_reduce(optimizer: keras.optimizers.Optimizer,
                            algorithm: str = "auto",
                            grid: tuple[int, int] | None = None
                            ) -> keras.optimizers.Optimizer:
  """Makes `optimizer` sum gradients with `algorithm`; returns it.

  "auto" keeps Keras's summation (an all-reduce per gradient). "ring" and
  "2d" replace it for this optimizer object, whatever its update rule. Keras
  3 sums gradients in TFOptimizer._all_reduce_sum_gradients, private API of
  the pinned keras==3.15.1; tests/test_collectives.py checks that it is
  still the one place gradients are summed.
  """
  if algorithm not in GRADIENT_ALL_REDUCE:
    raise ValueError(f"--gradient_all_reduce must be one of "
                     f"{GRADIENT_ALL_REDUCE}, got {algorithm!r}.")
  if algorithm == "auto":
    return optimizer
  if not hasattr(optimizer, "_all_reduce_sum_gradients"):
    raise ValueError(f"{type(optimizer).__name__} has no "
                     "_all_reduce_sum_gradients (Keras changed?): "
                     "--gradient_all_reduce must stay auto.")
  optimizer._all_reduce_sum_gradients = GradientSummation(algorithm, grid)
  return optimizer
