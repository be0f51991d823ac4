"""Picks the tf.distribute strategy: TPU, GPUs, multi-worker, or CPU replicas.

All strategies share one interface for the rest of the code (tf.distribute's
Strategy: scope, run, reduce, distributed datasets); on TPU the BN groups of
the placement come with it (`Distribution`).
"""
import dataclasses
import importlib.util
import json
import os

from absl import logging
import tensorflow as tf

from resnet_tpu.parallel import tpu_layout
from resnet_tpu.config import ConfigError
from resnet_tpu.config import DistributionConfig


def configure_cpu_replicas(num_replicas: int) -> list[str]:
  """Splits the host CPU into `num_replicas` logical devices.

  Must run before TensorFlow initialises its devices.
  """
  cpu = tf.config.list_physical_devices("CPU")[0]
  existing = tf.config.get_logical_device_configuration(cpu)
  if not existing or len(existing) < num_replicas:
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * num_replicas)
  return [f"/cpu:{i}" for i in range(num_replicas)]


@dataclasses.dataclass(frozen=True)
class Distribution:
  """A strategy and the groups of its distributed BN: on TPU the compact
  tiles of its placement (tpu_layout.py), elsewhere None (replicas
  [k*g, (k+1)*g)); on TPU also the slice's Topology, as
  initialize_tpu_system returned it."""
  strategy: tf.distribute.Strategy
  bn_groups: list[list[int]] | None = None
  tpu_topology: tf.tpu.experimental.Topology | None = None


# What TPUClusterResolver needs to look a TPU up by name in TensorFlow 2.19
# (tensorflow/python/tpu/client/client.py): the Cloud TPU API's client.
CLOUD_TPU_API_MODULES = ("googleapiclient", "oauth2client")


def require_cloud_tpu_api(tpu: str) -> None:
  """ConfigError when --tpu names a TPU (not 'local' or grpc://) and the
  Cloud TPU API client that resolves names is not installed."""
  if tpu == "local" or tpu.startswith("grpc://"):
    return
  missing = [m for m in CLOUD_TPU_API_MODULES
             if importlib.util.find_spec(m) is None]
  if missing:
    raise ConfigError(
        f"--tpu={tpu}: a TPU named by the Cloud TPU API (a multi-host pod "
        f"slice, run on worker 0) needs {' and '.join(missing)}: pip install "
        "-r requirements/tpu-pod.txt. On a single-host TPU VM pass "
        "--tpu=local.")


def _initialize_tpu(tpu: str):
  """The resolver and Topology of `tpu`; ConfigError when none is found."""
  require_cloud_tpu_api(tpu)
  resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
  tf.config.experimental_connect_to_cluster(resolver)
  try:
    return resolver, tf.tpu.experimental.initialize_tpu_system(resolver)
  except tf.errors.NotFoundError as e:
    runtime = ("PJRT" if os.environ.get("PJRT_DEVICE") == "TPU"
               else "StreamExecutor")
    raise ConfigError(
        f"--tpu={tpu}: no TPU was found. TensorFlow ({runtime} runtime) "
        "looked for the TPU_SYSTEM device of TPUClusterResolver"
        f"(tpu={tpu!r}) and found none ({str(e).splitlines()[0]}). Run on "
        "a TPU VM (single host: --tpu=local; a pod slice: worker 0, "
        "--tpu=<TPU name>); see docs/tpu.md.") from None


def _tpu_strategy(tpu: str, bn_group_size: int, log_topology: bool,
                  device_assignment_kind: str = "default") -> Distribution:
  resolver, slice_topology = _initialize_tpu(tpu)
  assignment, layout = tpu_layout.tpu_device_assignment(
      slice_topology, device_assignment_kind, bn_group_size, log_topology)
  strategy = tf.distribute.TPUStrategy(
      resolver, experimental_device_assignment=assignment)
  tpu_layout.check_replica_devices(slice_topology, layout,
                                   strategy.extended.worker_devices)
  return Distribution(strategy, layout.group_assignment, slice_topology)


def create_strategy(cfg: DistributionConfig,
                    bn_group_size: int = 1) -> Distribution:
  """Builds the strategy of `cfg.strategy` (tpu, gpu, multi_worker or cpu:
  the kind process_setup.startup_kind decided) for `--tpu` or
  `--num_cpu_replicas`.

  On TPU, `--tpu_device_assignment` is TensorFlow's own ("default") or the
  torus ring, `bn_group_size` (the model's) shapes the BN tiles and
  `--log_topology` logs the replica layout (tpu_layout.py).
  `--collective_timeout_s` bounds every multi-worker collective (0 = none):
  a worker that hangs while alive then stops the others instead of blocking
  them forever.
  """
  kind = cfg.strategy
  if kind == "tpu":
    distribution = _tpu_strategy(cfg.tpu or "local", bn_group_size,
                                 cfg.log_topology, cfg.tpu_device_assignment)
    _log(distribution.strategy, kind)
    return distribution
  if kind == "gpu":
    gpus = tf.config.list_logical_devices("GPU")
    if not gpus:
      raise ConfigError("--strategy=gpu but TensorFlow sees no GPU.")
    strategy = tf.distribute.MirroredStrategy([d.name for d in gpus])
  elif kind == "multi_worker":
    if "TF_CONFIG" not in os.environ:
      raise ConfigError("--strategy=multi_worker needs the TF_CONFIG "
                       "environment variable (cluster and task).")
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=cfg.collective_timeout_s or None))
  elif kind == "cpu":
    strategy = tf.distribute.MirroredStrategy(
        configure_cpu_replicas(cfg.num_cpu_replicas))
  else:
    raise ValueError(f"create_strategy needs a concrete strategy kind "
                     f"(process_setup.startup_kind), got {kind!r}.")
  _log(strategy, kind)
  return Distribution(strategy)


def _log(strategy: tf.distribute.Strategy, kind: str) -> None:
  logging.info("Strategy %s with %d replicas%s", type(strategy).__name__,
               strategy.num_replicas_in_sync,
               f" (TF_CONFIG task {json.loads(os.environ['TF_CONFIG'])['task']})"
               if kind == "multi_worker" else "")


def is_chief(strategy: tf.distribute.Strategy) -> bool:
  """True on the worker that writes checkpoints, logs and summaries."""
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.task_type:
    return True
  return (resolver.task_type == "chief" or
          (resolver.task_type == "worker" and resolver.task_id == 0 and
           "chief" not in resolver.cluster_spec().as_dict()))


# Errors a collective raises when a peer is gone: connection refused or
# reset, coordination-service heartbeat timeout, collective timeout.
PEER_ERRORS = (tf.errors.UnavailableError, tf.errors.AbortedError,
               tf.errors.DeadlineExceededError, tf.errors.CancelledError)


def any_worker(strategy: tf.distribute.Strategy, flag: bool) -> bool:
  """Whether `flag` is set on any worker; every worker must call this
  together on multi-worker strategies (one scalar all-reduce), so that all
  stop or save after the same host loop (preemption.py, cadence.py)."""
  if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
    return flag
  value = tf.constant(1.0 if flag else 0.0)
  per_replica = strategy.experimental_distribute_values_from_function(
      lambda _: value)
  total = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
  return float(total) > 0
