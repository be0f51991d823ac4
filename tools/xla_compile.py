"""A replica step compiled by XLA, as TPUStrategy compiles it (Ying et al. §3).

TPUStrategy compiles every replica step with XLA. An op that XLA cannot
compile (a py_function, a string op, a shape it cannot infer) stops a TPU
run at its first step, after the minutes of start-up. TensorFlow's XLA front
end (tf2xla: TensorFlow graph -> HLO) is the same for every backend, so a
step that does not lower to HLO on one CPU device will not compile on a TPU
either. `compile_replica_step` checks this on any machine: it wraps
`strategy.run(step_fn)` in `tf.function(jit_compile=True)` on a ONE-device
strategy and returns the step's HLO text, and optionally the outputs of one
compiled run (the backend's own compile, then one execution).

Why one device: under a multi-device MirroredStrategy jit_compile fails on
the cross-replica all-reduce itself ("destinations can not be empty"); the
TPU's collectives are not the CPU's. CrossReplicaSum, the TPU's group
all-reduce of distributed BN (bn_all_reduce.py), has no XLA CPU kernel
either ("No registered 'CrossReplicaSum' OpKernel for XLA_CPU_JIT
devices"): only a TPU compiles that path.
"""
import dataclasses
import re
import time
from typing import Any, Callable, Sequence

import tensorflow as tf

# How get_compiler_ir prefixes the front end's error message.
_HLO_FAILURE_PREFIX = "Failed getting HLO text: "


class XlaCompileError(RuntimeError):
  """The step does not compile with XLA; `xla_message` is XLA's report (the
  ops it cannot compile and where they were created), `stage` is "hlo"
  (TensorFlow graph -> HLO) or "run" (the backend's compile)."""

  def __init__(self, xla_message: str, stage: str):
    self.xla_message = xla_message
    self.stage = stage
    first = xla_message.strip().splitlines()[0] if xla_message.strip() else ""
    super().__init__(
        f"The step does not compile with XLA ({stage}), so it would not run "
        f"on a TPU (TPUStrategy compiles every step with XLA): {first}")


@dataclasses.dataclass(frozen=True)
class CompiledStep:
  """The proof that a step compiled.

  hlo: the HLO module text of the whole step (one device); target: the
  device or platform it was lowered for; lower_seconds: the time to lower
  it; outputs and run_seconds: the per-replica outputs of one compiled run
  and its time (backend compile included), when run.
  """
  hlo: str
  target: str
  lower_seconds: float
  outputs: Any = None
  run_seconds: float = 0.0

  def op_count(self, opcode: str) -> int:
    """How many HLO instructions of `opcode` (e.g. "convolution") the step
    has, in every computation of the module."""
    return len(re.findall(rf"\s{re.escape(opcode)}\(", self.hlo))


def jit_replica_step(strategy: tf.distribute.Strategy,
                     step_fn: Callable) -> Callable:
  """`strategy.run(step_fn, args)` in one XLA-compiled tf.function."""
  if strategy.num_replicas_in_sync != 1:
    raise ValueError(
        "compile_replica_step needs a one-device strategy (e.g. "
        "MirroredStrategy(['/cpu:0'])): jit_compile fails on a multi-device "
        f"MirroredStrategy; got {strategy.num_replicas_in_sync} replicas.")

  @tf.function(jit_compile=True)
  def step(*args):
    return strategy.run(step_fn, args=args)

  return step


def compile_replica_step(strategy: tf.distribute.Strategy, step_fn: Callable,
                         args: Sequence = (), run: bool = False,
                         platform: str | None = None) -> CompiledStep:
  """Lowers one replica step to HLO with XLA (and runs it once if `run`).

  `strategy` has one replica; `step_fn(*args)` is a replica step (e.g.
  ReplicaStep.train) whose variables were created under
  `strategy.scope()`. The step is lowered for the strategy's device, named
  explicitly, or, given `platform` (e.g. "TPU"), as TensorFlow would lower
  it for that platform's XLA device: tensorflow-tpu lowers for "TPU" on a
  host without one. A run applies the step: it changes the model and
  optimizer like any training step. Raises XlaCompileError when XLA cannot
  compile the step.
  """
  step = jit_replica_step(strategy, step_fn)
  device = strategy.extended.worker_devices[0]
  target = {"platform_name": platform} if platform else {"device_name": device}
  start = time.perf_counter()
  try:
    hlo = step.experimental_get_compiler_ir(*args)(stage="hlo", **target)
  except ValueError as e:
    if not str(e).startswith(_HLO_FAILURE_PREFIX):
      raise  # a Python error while tracing: not XLA's
    raise XlaCompileError(str(e)[len(_HLO_FAILURE_PREFIX):].strip("'"),
                          "hlo") from e
  lower_seconds = time.perf_counter() - start
  target = platform or device
  if not run:
    return CompiledStep(hlo, target, lower_seconds)
  start = time.perf_counter()
  try:
    outputs = tf.nest.map_structure(lambda t: t.numpy(), step(*args))
  except tf.errors.OpError as e:
    raise XlaCompileError(e.message, "run") from e
  return CompiledStep(hlo, target, lower_seconds, outputs,
                      time.perf_counter() - start)
