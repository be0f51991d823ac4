"""BN moving statistics kept per replica, averaged once per host loop.

Ying et al. 2018 §3.1 normalise with the statistics of a group of replicas
in training; the moving statistics only serve evaluation and the exported
model. tensorflow/tpu's TPUEstimator (models/official/resnet) and tf.keras's
BatchNormalization (`synchronization=ON_READ`) both update them on each
core with no communication per step. Here each replica updates its own copy
(DistributedBatchNormalization creates them ON_READ) and, at the end of each
host loop, every copy becomes the mean over all replicas: one all-reduce of
every statistic concatenated, per loop, not per step or per variable.

The moving average is linear, so averaging the replicas' copies every k
steps gives what averaging every step would (up to float rounding): an
exponential average of the mean over replicas of the group statistics. The
copies are equal at every loop's end, hence at every evaluation and save;
read across replicas (a checkpoint, the export) a statistic is replica 0's
copy, which is then that mean.

A departure (README's paper map): TPUEstimator saves one core's copy, as
its TPU rewrite writes back the first replica's value of each variable at
every loop's end (tensorflow/tensorflow,
tensorflow/core/tpu/graph_rewrite/distributed_tpu_rewrite_pass.cc at
00f0938ae85c), an average over core 0's batches only. The mean here
leaves out the spread of the groups' means: the moving variance is the
mean of the groups' variances, below the whole global batch's variance by
the variance of the group means.
"""
import keras
import tensorflow as tf


def replica_local_statistics(model: keras.Model) -> list[keras.Variable]:
  """The model's ON_READ non-trainable variables: moving statistics each
  replica updates on its own."""
  return [v for v in model.non_trainable_variables
          if v.synchronization == "on_read"]


def average_over_replicas(variables: list[keras.Variable]) -> None:
  """Sets every replica's copy of each of `variables` to the mean over all
  replicas, with one all-reduce; call in replica context (strategy.run)."""
  ctx = tf.distribute.get_replica_context()
  if not variables or ctx.num_replicas_in_sync == 1:
    return
  flat = tf.concat([tf.reshape(v.value, [-1]) for v in variables], 0)
  mean = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, flat)
  sizes = [v.value.shape.num_elements() for v in variables]
  for variable, part in zip(variables, tf.split(mean, sizes)):
    variable.assign(tf.reshape(part, variable.shape))
