"""What one training host loop reports: its record, its log line, its failures.

Ying et al. 2018 run several steps per host call; after each call the
trainer writes one metrics.jsonl record and one log line (loss, top-1, LR,
images/s, ETA), and names what the loop lost: unusable records (record_guards.py),
records of damaged files (shard_audit.py), both summed over every worker, and
steps with a NaN/Inf loss or gradient.
Such steps stop the run without a checkpoint (`NonFiniteLossError`) unless
--skip_nonfinite_steps skips them. A skipped step does not count, so a run
whose every step is skipped would never end: after STALLED_LOOPS_LIMIT host
loops in a row with every step skipped (under float16, at loss scale 1,
where halving it can no longer help) the run stops the same way.
"""
import math
from typing import Callable

from absl import logging

from resnet_tpu.train.loop_result import LoopResult


# Host loops in a row whose every step was skipped before the run stops.
STALLED_LOOPS_LIMIT = 3


class NonFiniteLossError(RuntimeError):
  """The loss or the gradients were NaN/Inf; no checkpoint was written."""


def stalled(result: LoopResult, num_steps: int,
            scale_at_floor: Callable[[], bool]) -> bool:
  """Whether a host loop of `num_steps` made no progress: every step was
  skipped, and (float16) the loss scale is at its floor of 1
  (`scale_at_floor` is asked only then)."""
  return result.nonfinite_steps >= num_steps and scale_at_floor()


def check_progress(stalled_loops: int, step: int,
                   latest_checkpoint: Callable[[], str | None]) -> None:
  """Raises NonFiniteLossError after STALLED_LOOPS_LIMIT stalled loops."""
  if stalled_loops < STALLED_LOOPS_LIMIT:
    return
  raise NonFiniteLossError(
      f"Every step of the last {stalled_loops} host loops had a NaN/Inf "
      f"loss or gradients and was skipped: the run cannot pass step {step}. "
      "Stopped without saving; the last good checkpoint is "
      f"{latest_checkpoint() or 'none (none was written yet)'}. Restart "
      "from it with a lower --base_learning_rate, or check the input.")


def check_finite(result: LoopResult, first_step: int, num_steps: int,
                 skip: bool,
                 latest_checkpoint: Callable[[], str | None]) -> None:
  """Raises NonFiniteLossError, or logs the steps that were skipped.

  `first_step`: the step count before the loop; `skip`:
  --skip_nonfinite_steps; `latest_checkpoint`: returns the checkpoint a
  restart resumes from (asked only when a step was not finite).
  """
  if not result.nonfinite_steps:
    return
  loop = f"host loop of steps {first_step + 1}-{first_step + num_steps}"
  if skip:
    logging.warning("Skipped %d step(s) with NaN/Inf loss or gradients in "
                    "the %s (--skip_nonfinite_steps): not applied.",
                    result.nonfinite_steps, loop)
    return
  raise NonFiniteLossError(
      "Loss or gradients are NaN/Inf at step "
      f"{first_step + result.first_nonfinite + 1} ({loop}). Stopped "
      "without saving; the last good checkpoint is "
      f"{latest_checkpoint() or 'none (none was written yet)'} and stays the "
      "latest. Restart to resume from it (e.g. with a lower "
      "--base_learning_rate or --precision=float32), or set "
      "--skip_nonfinite_steps to skip such steps.")


def train_record(result: LoopResult, step: int, total: int,
                 images_per_sec: float, elapsed_s: float, eta_s: float,
                 learning_rate: float) -> dict:
  """The metrics.jsonl record of a host loop ending at `step`; logs it.

  A loop whose every step was skipped trained on no example: its record
  and line have no loss, top-1 or top-5 (not zeros).
  """
  trained = {"loss": result.loss, "top1": result.top1, "top5": result.top5}
  record = {"step": step, "split": "train",
            **(trained if result.examples else {}),
            "examples": result.examples, "images_per_sec": images_per_sec,
            "elapsed_s": elapsed_s, "learning_rate": learning_rate,
            "unusable_examples": result.unusable_examples,
            "skipped_steps": result.nonfinite_steps,
            "lost_records": result.lost_records}
  if result.unusable_examples or result.lost_records:
    logging.warning("Trained on without %d unusable example(s) and %d "
                    "record(s) lost to damaged files in the steps up to %d "
                    "(metrics.jsonl: unusable_examples, lost_records).",
                    result.unusable_examples, result.lost_records, step)
  if not result.examples and result.nonfinite_steps:
    logging.warning("step %d/%d: all %d step(s) of the loop skipped "
                    "(NaN/Inf), no loss; lr %.4g ETA %s", step, total,
                    result.nonfinite_steps, learning_rate,
                    format_seconds(eta_s))
    return record
  logging.info("step %d/%d: loss %.4f top-1 %.4f lr %.4g %.1f images/s "
               "ETA %s", step, total, result.loss, result.top1,
               learning_rate, images_per_sec, format_seconds(eta_s))
  return record


def eta_seconds(elapsed_s: float, steps_done: int, steps_left: int) -> float:
  """The time left at the pace so far (NaN before the first step)."""
  return elapsed_s / steps_done * steps_left if steps_done else math.nan


def format_seconds(seconds: float) -> str:
  """H:MM:SS, or '?' for NaN."""
  if math.isnan(seconds):
    return "?"
  minutes, secs = divmod(int(seconds), 60)
  hours, minutes = divmod(minutes, 60)
  return f"{hours}:{minutes:02d}:{secs:02d}"
