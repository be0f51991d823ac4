"""The optimizers' TensorFlow piece: how a Keras optimizer meets the replicas
of a tf.distribute strategy (optimizers.py builds it)."""
import contextlib
from typing import Iterator, Optional

import keras
import tensorflow as tf

from resnet_tpu.parallel.tensorflow import gradient_all_reduce

# The name Keras 3 gives an optimizer's step counter (base_optimizer.py).
STEP_COUNTER_NAME = "iteration"


@contextlib.contextmanager
def replica_local_step_counter() -> Iterator[None]:
  """Optimizers built in this context count steps on each replica.

  Keras 3 creates the step counter ON_WRITE with aggregation
  "only_first_replica", so every apply_gradients increments it through a
  merge_call that copies replica 0's value to all replicas: one AllToAll per
  step on TPUs, a copy per device under MirroredStrategy. Every replica adds
  the same 1 in the same steps, so an ON_READ counter stays equal everywhere
  with no communication; read across replicas (the step, a checkpoint) it
  is replica 0's. Name, value and checkpoint key are unchanged.
  """

  def creator(next_creator, **kwargs):
    if (kwargs.get("name") == STEP_COUNTER_NAME and kwargs.get("aggregation")
        == tf.VariableAggregation.ONLY_FIRST_REPLICA):
      kwargs["synchronization"] = tf.VariableSynchronization.ON_READ
    return next_creator(**kwargs)

  with tf.variable_creator_scope(creator):
    yield


def creation_scope() -> contextlib.AbstractContextManager:
  """Where build_optimizer creates the optimizer: replica-local counter."""
  return replica_local_step_counter()


def sum_gradients_across_replicas(
    optimizer: keras.optimizers.Optimizer, algorithm: str,
    grid: Optional[tuple[int, int]], timeout_seconds: float
) -> keras.optimizers.Optimizer:
  """`optimizer`, summing gradients with --gradient_all_reduce's
  `algorithm` (gradient_all_reduce.py)."""
  return gradient_all_reduce.use_gradient_all_reduce(
      optimizer, algorithm, grid, timeout_seconds)
