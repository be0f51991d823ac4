"""The JAX engine's checkpoint store: TensorFlow checkpoints of its state.

A JAX run keeps its variables' values in a TrainState (engines/jax/step.py), not
in Keras variables that tf.train.Checkpoint could track. Here each value has a
tf.Variable twin, in a tf_files.weights_module (the model's trainable and
non-trainable variables, in the Keras model's order) and an optimizer twin
(its variables, `iterations` among them); tf_files.Checkpoints saves
and restores those, so a JAX run gets the TensorFlow path's checkpoint
files, keep-N rotation, retries, and damaged-checkpoint handling unchanged.

The layout differs from a TensorFlow run's (Keras's own object graph), so
neither engine resumes the other's checkpoints (config.json's `backend`
is compared on resume). export.py reads a JAX run's weights through the
same `weights_module` around the TensorFlow-built network's variables.

In a multi-host run (engines/jax/processes.py) every process holds the
same replicated state and restores from the same files; process 0 alone
writes them.
"""
import os
from typing import Sequence

import jax
import keras
import numpy as np
import tensorflow as tf

from resnet_tpu.config import TrainConfig
from resnet_tpu.train.checkpoints.tf_files import Checkpoints
from resnet_tpu.train.checkpoints.tf_files import weights_module
from resnet_tpu.engines.jax.state import TrainState
from resnet_tpu.engines.jax.state import iterations_index


def _twins(variables: Sequence[keras.Variable]) -> list[tf.Variable]:
  return [tf.Variable(np.asarray(v.value), trainable=False,
                      name=v.path.replace("/", "_")) for v in variables]


class JaxCheckpoints:
  """Saves and restores a JAX run's TrainState and input position in
  `directory` (tf_files.Checkpoints, on tf.Variable twins)."""

  def __init__(self, cfg: TrainConfig, model: keras.Model,
               optimizer: keras.optimizers.Optimizer, directory: str,
               chief: bool = True, loss_scale: Sequence = ()):
    """loss_scale: float16's initial [S, finite steps]
    (TrainState.loss_scale), checkpointed beside the rest as the
    TensorFlow path checkpoints its loss_scale.DynamicLossScale."""
    self._model = weights_module(_twins(model.trainable_variables),
                                 _twins(model.non_trainable_variables))
    self._optimizer = tf.Module()
    self._optimizer.variables_ = _twins(optimizer.variables)
    self._step_index = iterations_index(optimizer)
    self._optimizer.iterations = self._optimizer.variables_[self._step_index]
    self.input_batches = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="input_batches")
    self._loss_scale = None
    if len(loss_scale):
      self._loss_scale = tf.Module()
      self._loss_scale.scale = tf.Variable(np.float32(loss_scale[0]),
                                           trainable=False, name="scale")
      self._loss_scale.good_steps = tf.Variable(
          np.int32(loss_scale[1]), trainable=False, name="good_steps")
    self.store = Checkpoints(cfg, self._model, self._optimizer,
                             self.input_batches, directory, chief,
                             self._loss_scale)

  def _groups(self) -> tuple[list, ...]:
    groups = (self._model.trainable, self._model.non_trainable,
              self._optimizer.variables_)
    if self._loss_scale is None:
      return groups
    return (*groups, [self._loss_scale.scale, self._loss_scale.good_steps])

  def latest(self) -> str | None:
    return self.store.latest()

  def save(self, state: TrainState, input_batches: int) -> str:
    """Writes `state` (read from the devices) and the input position;
    returns the checkpoint's path (on other processes than the chief, the
    path the chief writes)."""
    if not self.store.chief:
      step = int(jax.device_get(state.optimizer[self._step_index]))
      return os.path.join(self.store.directory, f"ckpt-{step}")
    values = jax.device_get(state)
    for twins, group in zip(self._groups(), values):
      for twin, value in zip(twins, group):
        twin.assign(np.asarray(value))
    self.input_batches.assign(input_batches)
    return self.store.save()

  def restore(self) -> tuple[str | None, TrainState | None, int]:
    """The newest intact checkpoint: its path, state and input position
    (None, None, 0 for a fresh run); tf_files.Checkpoints.restore
    raises what it raises (another network's, all damaged, unavailable)."""
    path = self.store.restore()
    if path is None:
      return None, None, 0
    state = TrainState(*([t.numpy() for t in twins]
                         for twins in self._groups()))
    return path, state, int(self.input_batches.numpy())
