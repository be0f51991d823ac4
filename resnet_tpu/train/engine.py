"""What the training loop (loop.py) asks of an engine: host loops of steps,
an evaluation, checkpoints, and how its processes agree.

As tensorflow/models' orbit (orbit/runner.py) asks a trainer only for
train(num_steps) and evaluate(num_steps), the loop's policy (cadence, records,
SIGTERM, NaN, stalls, timers, lost peers) needs nothing else of the engine;
engines/tensorflow/engine.py and engines/jax/engine.py supply it, and
tests/test_loop.py a fake one.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Protocol, Sequence

import keras

from resnet_tpu.config import TrainConfig
from resnet_tpu.train.loop_result import LoopResult

# Called with each host loop's train record once it is logged.
LoopCallback = Callable[[dict], None]
# Builds the network of a config (default: model.build_model); tests and
# tools train other networks through it, on either engine.
ModelFn = Callable[[TrainConfig], keras.Model]


class Engine(Protocol):
  """One engine's model, optimizer, step, checkpoints and processes."""

  cfg: TrainConfig
  chief: bool  # this process writes the files (metrics, checkpoints)
  skips_nonfinite: bool  # a NaN/Inf step is skipped, not a stop
  # The engine's profiler: start(logdir), stop() (train/profiling.py).
  trace: tuple[Callable[[str], None], Callable[[], None]] | None

  @property
  def step(self) -> int:
    """Optimizer steps taken (skipped steps not counted)."""

  @property
  def input_batches(self) -> int:
    """Global batches read from the training input: where a resumed run
    starts reading (micro-batches and BN recomputation included)."""

  def restore(self) -> str | None:
    """Restores the newest intact checkpoint here (None: there is
    none)."""

  def check_restored_agree(self) -> None:
    """Raises ConfigError unless every process restored the same step and
    input position (every process calls it together)."""

  def start_input(self, train_input: Any) -> None:
    """Opens the training input after the first `input_batches`."""

  def host_loop(self, num_steps: int, micro_batches: int) -> LoopResult:
    """Runs `num_steps` optimizer steps of `micro_batches` global batches
    each; returns once they are done."""

  def evaluate(self, eval_input: Any) -> LoopResult:
    """One pass over the eval set with the current weights."""

  def recompute_bn(self, num_batches: int) -> None:
    """--bn_stats=recompute: the BN moving statistics of the next
    `num_batches` training batches (Akiba et al. 2017)."""

  def save(self) -> str:
    """Checkpoints the state; returns its path once it is written."""

  def latest(self) -> str | None:
    """The newest checkpoint written, to resume from."""

  def any_process(self, flags: Sequence[bool]) -> list[bool]:
    """Each flag ORed over every process (every process calls it
    together)."""

  def loss_scale_at_floor(self) -> bool:
    """float16: whether the loss scale is 1 (True without one)."""

  def learning_rate(self) -> float:
    """The learning rate of the current step."""

  def running(self) -> contextlib.AbstractContextManager:
    """Held while the loop trains (JAX: the lost-peer watchdog)."""

  def lost_peer(self, error: Exception) -> str | None:
    """The cause, in one line, when `error` means another process is
    gone; None otherwise."""

  def close_inputs(self) -> None:
    """Releases the input iterators (in the background)."""
