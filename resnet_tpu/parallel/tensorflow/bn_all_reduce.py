"""The group all-reduce of distributed batch norm (Ying et al. 2018 §3.1).

Distributed BN sums per-channel statistics over a *group* of g replicas. By
default replicas [k*g, (k+1)*g) form group k; on TPU the groups are the
compact tiles of the device assignment in use (topology.py), passed in as
`groups`. `group_all_reduce` has one interface and three backends; the
first two cost one all-reduce of size(x) among the g replicas of a group,
independent of the replica count N:

  TPUStrategy:            CrossReplicaSum with a group_assignment.
  Mirrored/MultiWorker:   CollectiveReduceV2 with one group key per group
                          (replica_groups.Subgroup).
  masked (reference):     a full all-reduce of an [N/g, size(x)] one-hot
                          buffer: N/g times the bytes, over all N replicas.
"""
from typing import Sequence

import tensorflow as tf

from resnet_tpu.parallel import replica_groups
from resnet_tpu.config import BN_ALL_REDUCE

Groups = Sequence[Sequence[int]]


def group_assignment(num_replicas: int, group_size: int) -> list[list[int]]:
  """The default BN groups: replicas [k*g, (k+1)*g) form group k."""
  if group_size < 1 or num_replicas % group_size:
    raise ValueError(f"--bn_group_size={group_size} must divide the number "
                     f"of replicas ({num_replicas}).")
  return [list(range(start, start + group_size))
          for start in range(0, num_replicas, group_size)]


def _resolve_implementation(name: str,
                            ctx: tf.distribute.ReplicaContext) -> str:
  if name not in BN_ALL_REDUCE:
    raise ValueError(f"--bn_all_reduce must be one of {BN_ALL_REDUCE}, got "
                     f"{name!r}.")
  efficient = replica_groups.is_tpu(ctx.strategy) or (
      replica_groups.has_raw_collectives(ctx.strategy) and
      not tf.executing_eagerly())
  if name == "auto":
    return "collective" if efficient else "masked"
  if name == "collective" and not efficient:
    raise ValueError(
        "--bn_all_reduce=collective needs TPUStrategy, or Mirrored/"
        "MultiWorkerMirroredStrategy inside a tf.function; got "
        f"{type(ctx.strategy).__name__} (eager: {tf.executing_eagerly()}).")
  return name


def group_all_reduce(x: tf.Tensor, group_size: int,
                     implementation: str = "auto",
                     timeout_seconds: float = 0.0,
                     groups: Groups | None = None) -> tf.Tensor:
  """Sums `x` over the replicas of the caller's BN group.

  Outside a multi-replica step (or with group_size 1) this is the identity.
  Gradients flow through: the gradient of a group sum is the group sum of the
  upstream gradient. `implementation` is --bn_all_reduce; `groups` (every
  group of `group_size` replicas) defaults to `group_assignment`.
  """
  ctx = replica_groups.replica_context()
  if ctx is None or group_size == 1:
    return x
  groups = [list(g) for g in groups] if groups else group_assignment(
      ctx.num_replicas_in_sync, group_size)
  name = _resolve_implementation(implementation, ctx)
  if name == "masked":
    return masked_group_all_reduce(x, groups, ctx)
  if replica_groups.is_tpu(ctx.strategy):
    return tpu_group_all_reduce(x, groups)
  replica = replica_groups.static_replica_id(ctx)
  members = next(g for g in groups if replica in g)
  return collective_group_all_reduce(
      x, replica_groups.Subgroup.of(ctx, members, timeout_seconds))


def tpu_group_all_reduce(x: tf.Tensor, groups: Groups) -> tf.Tensor:
  """CrossReplicaSum within `groups` (TPU; its gradient is registered)."""
  return tf.compat.v1.tpu.cross_replica_sum(x, groups)


def collective_group_all_reduce(x: tf.Tensor,
                                group: replica_groups.Subgroup) -> tf.Tensor:
  """Sums `x` over `group` with one CollectiveReduceV2.

  CollectiveReduceV2 has no registered gradient; the custom one is the same
  group sum of the upstream gradient, with its own instance key.
  """

  @tf.custom_gradient
  def summed(value):
    return group.sum(value), group.sum

  return summed(x)


def masked_group_all_reduce(x: tf.Tensor, groups: Groups,
                            ctx: tf.distribute.ReplicaContext) -> tf.Tensor:
  """Reference group sum by a full all-reduce of a one-hot masked buffer.

  Cost: every replica all-reduces an [N/g, size(x)] buffer, i.e. N/g times the
  bytes of a plain all-reduce of x. Correct on every strategy and eagerly;
  kept as the reference the efficient backends are tested against.
  """
  group_of = [0] * ctx.num_replicas_in_sync
  for index, members in enumerate(groups):
    for replica in members:
      group_of[replica] = index
  group_id = tf.gather(group_of, ctx.replica_id_in_sync_group)
  mask = tf.one_hot(group_id, len(groups), dtype=x.dtype)
  mask = tf.reshape(mask, [len(groups)] + [1] * x.shape.rank)
  summed = ctx.all_reduce(tf.distribute.ReduceOp.SUM, mask * x[tf.newaxis])
  return tf.gather(summed, group_id)
