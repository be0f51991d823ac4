"""The JAX step's state and loss settings: the values of the model's and
optimizer's variables as a TrainState (what step.py updates and the
checkpoint stores write), and where its parts sit among them."""
import dataclasses
from typing import NamedTuple

import keras


class TrainState(NamedTuple):
  """The values of the model's and optimizer's variables, in their order;
  float16's loss scale S and its finite steps (none otherwise)."""
  trainable: list
  non_trainable: list
  optimizer: list
  loss_scale: list | tuple = ()


def iterations_index(optimizer: keras.optimizers.Optimizer) -> int:
  """Where the optimizer's step count (`iterations`) sits in
  TrainState.optimizer."""
  return [v.path for v in optimizer.variables].index(
      optimizer.iterations.path)


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """The loss of a step: classes, label smoothing, global batch, and the
  L2 weight decay in the loss (0 for LARS, which decays in its update)."""
  num_classes: int
  global_batch_size: int
  label_smoothing: float = 0.0
  weight_decay: float = 0.0


def decayed_indices(model: keras.Model) -> list[int]:
  """Positions of conv and dense kernels (the variables under L2) among the
  model's trainable variables."""
  return [i for i, v in enumerate(model.trainable_variables)
          if v.path.endswith("kernel")]


def replica_local_indices(model: keras.Model) -> list[int]:
  """Positions of the BN moving statistics among the non-trainable
  variables: each replica updates its own copy (synchronization on_read)."""
  return [i for i, v in enumerate(model.non_trainable_variables)
          if v.synchronization == "on_read"]
