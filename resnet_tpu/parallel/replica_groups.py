"""Collectives among a subgroup of replicas (Ying et al. 2018 §3.1, §3.3).

Distributed BN sums statistics within groups of replicas (bn_all_reduce.py)
and the 2-D gradient all-reduces sum along the rows and columns of a replica
grid (gradient_all_reduce.py). Both need a collective among a *subset* of
the replicas, which tf.distribute's public API does not offer on GPU/CPU:
`Subgroup` issues TensorFlow's raw V2 collectives (compat.py) with its own
group key.

The raw collectives take plain-int keys fixed when the step is traced:
MirroredStrategy traces the step once per replica with a static replica id.
Every replica (and every worker) must trace the same collectives in the same
order, which a synchronous data-parallel step does; the instance keys count
each replica's collectives in a group in trace order.
"""
import dataclasses
import threading
import zlib
from typing import Sequence

import tensorflow as tf

from resnet_tpu.runtime import compat

# tf.distribute numbers its own group keys up from 1 (plus 100000 per extra
# strategy in tests); ours live far above them.
GROUP_KEY_BASE = 1 << 28
_GROUP_KEY_RANGE = 1 << 24

# Trace-order counters and ordering tokens are per process by nature: every
# replica traced in this process must draw from the same ones.
_lock = threading.Lock()
_last_instance_key: dict[tuple[int, int], int] = {}
_ordering_tokens: dict[tuple[str, str], tf.Tensor] = {}


def replica_context() -> tf.distribute.ReplicaContext | None:
  """The replica context of a multi-replica step, or None outside one."""
  ctx = tf.distribute.get_replica_context()
  if ctx is None or ctx.num_replicas_in_sync == 1:
    return None
  return ctx


def is_tpu(strategy: tf.distribute.Strategy) -> bool:
  return isinstance(strategy, (tf.distribute.TPUStrategy,
                               tf.distribute.experimental.TPUStrategy))


def has_raw_collectives(strategy: tf.distribute.Strategy) -> bool:
  """Mirrored/MultiWorkerMirrored: strategies whose replicas run raw V2
  collectives (inside a tf.function)."""
  return isinstance(strategy, (tf.distribute.MirroredStrategy,
                               tf.distribute.MultiWorkerMirroredStrategy))


def static_replica_id(ctx: tf.distribute.ReplicaContext) -> int:
  replica = tf.get_static_value(ctx.replica_id_in_sync_group)
  if replica is None:
    raise ValueError("Subgroup collectives need a static replica id "
                     "(MirroredStrategy or MultiWorkerMirroredStrategy).")
  return int(replica)


def _ordering_token(device: str, chain: str) -> tf.Tensor:
  """One handle per device and chain orders that replica's collectives of
  the chain without chaining replicas to each other (which deadlocks)."""
  with _lock:
    if (device, chain) not in _ordering_tokens:
      name = f"collective_order/{chain}" if chain else "collective_order"
      _ordering_tokens[device, chain] = compat.ordering_token(device, name)
    return _ordering_tokens[device, chain]


@dataclasses.dataclass(frozen=True)
class Subgroup:
  """The calling replica's handle on one subgroup of replicas.

  timeout_seconds: a collective that waits longer fails (0 = never).
  chain: a replica's collectives of one chain run in program order; those
    of different chains may run at the same time (Ying et al. §3.3's two
    gradient halves).
  """
  members: tuple[int, ...]
  replica: int
  device: str
  timeout_seconds: float = 0.0
  chain: str = ""

  @classmethod
  def of(cls, ctx: tf.distribute.ReplicaContext, members: Sequence[int],
         timeout_seconds: float = 0.0, chain: str = "") -> "Subgroup":
    replica = static_replica_id(ctx)
    devices = ctx.strategy.extended.worker_devices
    # Replicas are numbered worker by worker, len(devices) per worker.
    return cls(tuple(members), replica, devices[replica % len(devices)],
               timeout_seconds, chain)

  @property
  def size(self) -> int:
    return len(self.members)

  @property
  def key(self) -> int:
    """Same members, same key: on every replica and every worker."""
    digest = zlib.crc32(repr(self.members).encode())
    return GROUP_KEY_BASE + digest % _GROUP_KEY_RANGE

  def _next_instance_key(self) -> int:
    with _lock:
      slot = (self.key, self.replica)
      _last_instance_key[slot] = _last_instance_key.get(slot, 0) + 1
      return _last_instance_key[slot]

  def _args(self) -> dict:
    return dict(group_size=self.size, group_key=self.key,
                instance_key=self._next_instance_key(),
                ordering_token=_ordering_token(self.device, self.chain),
                timeout_seconds=self.timeout_seconds)

  def sum(self, x: tf.Tensor) -> tf.Tensor:
    """The sum of `x` over the members."""
    with tf.device(self.device):
      return compat.collective_sum(x, **self._args())

  def reduce_scatter(self, x: tf.Tensor) -> tf.Tensor:
    """Rank i gets the members' sum of the i-th of `size` chunks of `x`.

    CollectiveReduceScatterV2 exists for NCCL only; an all-to-all of the
    chunks followed by a local sum moves the same bytes on every device.
    """
    with tf.device(self.device):
      received = compat.collective_all_to_all(
          tf.reshape(x, [self.size, -1]), **self._args())
      return tf.reduce_sum(received, axis=0)

  def gather(self, x: tf.Tensor) -> tf.Tensor:
    """The members' `x` concatenated in rank order."""
    with tf.device(self.device):
      return compat.collective_gather(x, **self._args())
