"""Distributed batch normalization (Ying et al. 2018, §3.1), on either engine.

With thousands of replicas the per-replica batch is tiny (Ying et al. use 32
or fewer images per TPU core), so each replica's batch statistics are noisy.
Distributed BN computes mean and variance over a *group* of `group_size`
replicas: each replica contributes its per-channel sums, one group all-reduce
combines them in float32, and every replica of the group normalises with the
same statistics. group_size equal to the replica count is fully synchronised
BN; group_size 1 is ordinary local BN.

The layer is written in keras.ops; two things come from the engine's own
module (Keras picks one engine per process):
- the group sum: model/tensorflow/batch_norm.py (tf.distribute's replica
  context, parallel/tensorflow/bn_all_reduce.py) or model/jax/batch_norm.py
  (a psum over the device mesh's BN axis, parallel/jax/bn_all_reduce.py);
- on TensorFlow, fused kernels for the training call (FusedBatchNormV3 and
  a hand-written group gradient). On JAX, XLA fuses the keras.ops form.

Inference mode uses the moving statistics only, so an exported model holds no
collective op. The moving statistics are replica-local: each replica updates
its own with no communication; the TF step averages them over all replicas
once per host loop (moving_statistics.py), the JAX step inside its gradient
all-reduce (engines/jax/step.py).
"""
import contextlib
import dataclasses
from typing import Any, Sequence

import keras
from keras import ops

from resnet_tpu.model.batch_statistics import local_sums
from resnet_tpu.model.batch_statistics import moments_from_sums

if keras.backend.backend() == "tensorflow":
  from resnet_tpu.model.tensorflow import batch_norm as engine
elif keras.backend.backend() == "jax":
  from resnet_tpu.model.jax import batch_norm as engine
else:
  raise ImportError("resnet_tpu runs on Keras's tensorflow or jax backend "
                    f"(KERAS_BACKEND), not {keras.backend.backend()!r}.")


@dataclasses.dataclass(frozen=True)
class StatisticsSink:
  """Holds the accumulator of a layer (a plain holder, so neither Keras nor
  tf.train.Checkpoint tracks the variable as the layer's own)."""
  variable: Any


@contextlib.contextmanager
def collect_statistics(layers: Sequence["DistributedBatchNormalization"],
                       sinks: Sequence[Any]):
  """While tracing under this context, each of `layers` adds its local
  [sum, sum of squares, count] to its sink (Akiba et al.'s recomputed
  population statistics, bn_recompute.py)."""
  for layer, sink in zip(layers, sinks):
    layer.statistics_sink = StatisticsSink(sink)
  try:
    yield
  finally:
    for layer in layers:
      layer.statistics_sink = None


@keras.saving.register_keras_serializable(package="resnet_tpu")
class DistributedBatchNormalization(keras.layers.BatchNormalization):
  """BatchNormalization whose training statistics span a group of replicas."""

  def __init__(self, group_size: int = 1, all_reduce: str = "auto",
               collective_timeout_s: float = 0.0,
               groups: Sequence[Sequence[int]] | None = None, **kwargs):
    """group_size: replicas per BN group; all_reduce: --bn_all_reduce;
    collective_timeout_s: fail a group all-reduce that waits longer (0 =
    never); groups: the BN groups when they are not the default ranges (the
    TPU tiles of topology.py). The last three are TensorFlow's: on JAX the
    groups are the device mesh's (parallel/jax/bn_all_reduce.py)."""
    if group_size < 1:
      raise ValueError(f"group_size must be >= 1, got {group_size}.")
    if kwargs.get("renorm") or kwargs.get("synchronized"):
      raise ValueError("DistributedBatchNormalization replaces `renorm` and "
                       "`synchronized`; use group_size instead.")
    super().__init__(**kwargs)
    self.group_size = group_size
    self.all_reduce = all_reduce
    self.collective_timeout_s = float(collective_timeout_s)
    self.groups = [list(g) for g in groups] if groups else None
    # Set by collect_statistics while bn_recompute traces its pass.
    self.statistics_sink = None

  def group_sum(self, x):
    """`x` summed over the replicas of this replica's BN group."""
    return engine.group_sum(self, x)

  def build(self, input_shape):
    # Moving statistics: one copy per replica, updated with no
    # communication (see the module docstring).
    shape = (input_shape[self.axis],)
    if self.scale:
      self.gamma = self.add_weight(
          shape=shape, name="gamma", initializer=self.gamma_initializer,
          regularizer=self.gamma_regularizer, trainable=True, autocast=False)
    if self.center:
      self.beta = self.add_weight(
          shape=shape, name="beta", initializer=self.beta_initializer,
          regularizer=self.beta_regularizer, trainable=True, autocast=False)
    self.moving_mean = self._replica_local_weight(
        "moving_mean", shape, self.moving_mean_initializer)
    self.moving_variance = self._replica_local_weight(
        "moving_variance", shape, self.moving_variance_initializer)
    self.input_spec = keras.layers.InputSpec(
        ndim=len(input_shape), axes={self.axis: input_shape[self.axis]})
    axes = list(range(len(input_shape)))
    del axes[self.axis]
    self._reduction_axes = axes
    self.built = True

  def _replica_local_weight(self, name: str, shape: tuple[int],
                            initializer) -> keras.Variable:
    """A moving statistic each replica updates in place, with no
    communication (ON_READ): read across replicas (saved, exported) it is
    replica 0's copy. Layer.add_weight takes no `synchronization`; the
    variable is tracked as the layer's attribute, in the same order."""
    with keras.name_scope(self.name):
      return keras.Variable(
          initializer=keras.initializers.get(initializer), shape=shape,
          dtype=self.variable_dtype, trainable=False, autocast=False,
          synchronization="on_read", aggregation="only_first_replica",
          name=name)

  def call(self, inputs, training=None, mask=None):
    if training and self.trainable:
      fused = engine.fused_training_call(self, inputs, mask)
      if fused is not None:
        return fused
    return super().call(inputs, training=training, mask=mask)

  def update_moving_statistics(self, mean, variance) -> None:
    """The exponential moving averages, as Keras's BatchNormalization."""
    self.moving_mean.assign(self.moving_mean * self.momentum +
                            ops.stop_gradient(mean) * (1.0 - self.momentum))
    self.moving_variance.assign(
        self.moving_variance * self.momentum +
        ops.stop_gradient(variance) * (1.0 - self.momentum))

  def _moments(self, inputs, mask):
    """Keras's path: the group's moments from summed local sums (local BN
    without a statistics sink: Keras's own moments)."""
    if mask is not None:
      raise ValueError("DistributedBatchNormalization does not support masks.")
    if self.group_size == 1 and self.statistics_sink is None:
      return super()._moments(inputs, mask)
    local = local_sums(inputs, self._reduction_axes)
    if self.statistics_sink is not None:
      self.statistics_sink.variable.assign_add(local)
    return moments_from_sums(self.group_sum(local))

  def get_config(self):
    config = super().get_config()
    config.pop("renorm", None)
    config.pop("renorm_clipping", None)
    config.pop("renorm_momentum", None)
    config.pop("synchronized", None)
    return {**config, "group_size": self.group_size,
            "all_reduce": self.all_reduce,
            "collective_timeout_s": self.collective_timeout_s,
            "groups": self.groups}

