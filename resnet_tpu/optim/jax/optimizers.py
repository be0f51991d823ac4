"""The optimizers' JAX piece: nothing to wrap. The JAX step
(engines/jax/step.py) sums gradients over the device mesh with one psum before
the update, and XLA chooses the all-reduce's algorithm, so the explicit
algorithms of --gradient_all_reduce (Ying et al. §3.3, Mikami et al.'s 2-D
torus; parallel/tensorflow/gradient_all_reduce.py) are TensorFlow's alone."""
import contextlib
from typing import Optional

import keras


def creation_scope() -> contextlib.AbstractContextManager:
  """Where build_optimizer creates the optimizer: no scope on JAX."""
  return contextlib.nullcontext()


def sum_gradients_across_replicas(
    optimizer: keras.optimizers.Optimizer, algorithm: str,
    grid: Optional[tuple[int, int]], timeout_seconds: float
) -> keras.optimizers.Optimizer:
  """`optimizer` unchanged for --gradient_all_reduce=auto; ValueError
  naming the flag for the TensorFlow-only algorithms."""
  del grid, timeout_seconds
  if algorithm != "auto":
    raise ValueError(
        f"--gradient_all_reduce={algorithm} runs on TensorFlow only; on JAX "
        "the step sums gradients with one psum and XLA picks the algorithm "
        "(use --gradient_all_reduce=auto).")
  return optimizer
