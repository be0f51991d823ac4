"""When host loops end, evaluate and save, on either engine's trainer.

`StepCadence`: host loops of --steps_per_loop steps (Ying et al. 2018 §3)
end at every eval and checkpoint step, at each batch-size phase's start
and at the last step; `timed_loop_limit` shortens them to
--max_loop_seconds at the last loop's pace (spot machines' grace period).

Checkpoints also follow the wall clock (`SaveTimer`). Step cadences alone
leave a long run unprotected: with the default flags
(`--checkpoint_every_steps=0`: at each eval; `--eval_every_steps=0`: at the
end) nothing is saved until the run ends, and a hard kill (OOM killer,
`kill -9`, a host failure: no SIGTERM for preemption.py) loses all of it.
tf.estimator's RunConfig saved every 600 s by default; so does
`--checkpoint_every_minutes=10` here, besides the step cadences. A hard kill
then costs at most that interval plus the host loop in flight.

Each worker reads its own clock; one scalar all-reduce after each host loop
makes them all save after the same loop when any one is due (a
MultiWorkerMirroredStrategy save needs every worker). No eval is needed.
A JAX run's processes agree on every one's `SaveTimer.due_here` in one
allgather (engines/jax/processes.py).
"""
import dataclasses
import time
from typing import Callable, Sequence

from resnet_tpu.config import RunConfig


@dataclasses.dataclass(frozen=True)
class StepCadence:
  """Where host loops end, on either engine: at every eval and checkpoint
  step, at each batch-size phase's start, and at the last step."""
  total: int
  eval_every: int
  checkpoint_every: int
  phase_starts: Sequence[int] = ()

  @classmethod
  def of(cls, run: RunConfig) -> "StepCadence":
    total = run.total_train_steps
    eval_every = run.eval_every_steps or total
    return cls(total, eval_every, run.checkpoint_every_steps or eval_every,
               tuple(run.clock.phase_start_steps()))

  def loop_steps(self, step: int, steps_per_loop: int,
                 *limits: int | None) -> int:
    """The steps of the host loop starting after `step`: at most
    `steps_per_loop` and each of `limits` (None: no limit)."""
    next_phase = min([s for s in self.phase_starts if s > step]
                     + [self.total])
    return min([steps_per_loop, next_phase - step,
                self.eval_every - step % self.eval_every,
                self.checkpoint_every - step % self.checkpoint_every]
               + [limit for limit in limits if limit])

  def save_due(self, step: int) -> bool:
    return step % self.checkpoint_every == 0 or step == self.total

  def eval_due(self, step: int) -> bool:
    return step % self.eval_every == 0 or step == self.total


def timed_loop_limit(max_loop_seconds: float,
                     seconds_per_step: float | None) -> int | None:
  """--max_loop_seconds: the steps that fit in it at the last loop's pace
  (1 before any loop: it compiles), at least 1; None when off."""
  if not max_loop_seconds:
    return None
  if seconds_per_step is None:
    return 1
  return max(1, int(max_loop_seconds / seconds_per_step))


class SaveTimer:
  """Says when `minutes` have passed since the last save (0: never)."""

  def __init__(self, minutes: float,
               now: Callable[[], float] = time.monotonic):
    self._seconds = minutes * 60.0
    self._now = now
    self._last = now()

  def restart(self) -> None:
    """A checkpoint was just written (or training starts)."""
    self._last = self._now()

  def due_here(self) -> bool:
    """Whether this process's interval has passed (one host)."""
    return bool(self._seconds) and self._now() - self._last >= self._seconds

  def due(self, any_worker: Callable[[bool], bool]) -> bool:
    """Whether any worker's interval has passed: call on every worker;
    `any_worker` ORs a flag over them (parallel/tensorflow/strategy.py's
    any_worker)."""
    if not self._seconds:
      return False  # the same flag on every worker: no all-reduce needed
    return any_worker(self.due_here())
