"""The training loop's policy (train/loop.py), once for both engines, against
a fake engine (train/engine.py's interface) that trains nothing: the
cadence of host loops, evals and saves; the wall-clock checkpoints; SIGTERM;
NaN/Inf steps and stalls; a lost peer; an unwritable checkpoint; a finished
run run again; --max_loop_seconds; BN recomputation; the records.

Each engine's own side of these (its host loop, its checkpoints, its
collectives) is tested with the engine: tests/test_reliability.py and
tests/test_trainer.py (TensorFlow), tests_jax/test_jax_engine.py (JAX).
"""
import contextlib
import os
import signal

import pytest

from resnet_tpu.config import TrainConfig
from resnet_tpu.train import cadence
from resnet_tpu.train import loop
from resnet_tpu.train import loop_report
from resnet_tpu.train import preemption
from resnet_tpu.train.checkpoints import storage
from resnet_tpu.train.loop_result import LoopResult
from resnet_tpu.train.metrics_log import read_metrics


class PeerGone(RuntimeError):
  """What the fake engine's collective raises when a peer is gone."""


class FakeEngine:
  """Counts steps and records every call the loop makes."""

  trace = None

  def __init__(self, cfg: TrainConfig, restored_step: int = 0,
               nan_at: set[int] = frozenset(), sigterm_at: int | None = None,
               peer_sigterm_at: int | None = None,
               fail_at: tuple[int, Exception] | None = None,
               unwritable_from: int | None = None):
    self.cfg = cfg
    self.chief = True
    self.skips_nonfinite = cfg.optim.skip_nonfinite_steps
    self.step = self.restored = restored_step
    self.input_batches = restored_step
    self.nan_at, self.sigterm_at = set(nan_at), sigterm_at
    self.peer_sigterm_at, self.fail_at = peer_sigterm_at, fail_at
    self.unwritable_from = unwritable_from
    self.calls, self.saved = [], []
    self.closed = False

  def restore(self) -> str | None:
    self.calls.append(("restore",))
    return f"ckpt-{self.step}" if self.step else None

  def check_restored_agree(self) -> None:
    self.calls.append(("agree",))

  def start_input(self, train_input) -> None:
    self.calls.append(("start_input", train_input, self.input_batches))

  def host_loop(self, num_steps: int, micro_batches: int) -> LoopResult:
    self.calls.append(("host_loop", self.step, num_steps, micro_batches))
    if self.fail_at and self.fail_at[0] <= self.step + num_steps:
      raise self.fail_at[1]
    first, read = self.step, self.input_batches
    # nan_at: the global batches (counted from 1) whose step is NaN/Inf.
    bad = [i for i in range(num_steps) if read + i + 1 in self.nan_at]
    applied = num_steps - (len(bad) if self.skips_nonfinite else 0)
    self.step += applied
    self.input_batches += num_steps * micro_batches
    if self.sigterm_at is not None and first < self.sigterm_at <= self.step:
      os.kill(os.getpid(), signal.SIGTERM)
    return LoopResult(
        loss=1.0, top1=0.5, top5=0.9, examples=8 * (num_steps - len(bad)),
        nonfinite_steps=len(bad),
        first_nonfinite=bad[0] if bad else -1)

  def evaluate(self, eval_input) -> LoopResult:
    self.calls.append(("evaluate", self.step, eval_input))
    return LoopResult(loss=2.0, top1=0.25, top5=0.75, examples=10)

  def recompute_bn(self, num_batches: int) -> None:
    self.calls.append(("recompute_bn", self.step, num_batches))
    self.input_batches += num_batches

  def save(self) -> str:
    if self.unwritable_from is not None and self.step >= self.unwritable_from:
      raise storage.StorageError(
          "a checkpoint", f"ckpt-{self.step}", OSError("disk full"),
          self.cfg.model_dir)
    self.saved.append(self.step)
    return f"ckpt-{self.step}"

  def latest(self) -> str | None:
    if self.saved:
      return f"ckpt-{self.saved[-1]}"
    return f"ckpt-{self.restored}" if self.restored else None

  def any_process(self, flags):
    sigterm, timer = flags
    peer = (self.peer_sigterm_at is not None and
            self.step >= self.peer_sigterm_at)
    return [sigterm or peer, timer]

  def loss_scale_at_floor(self) -> bool:
    return True

  def learning_rate(self) -> float:
    return 0.1 * self.step

  def running(self):
    return contextlib.nullcontext()

  def lost_peer(self, error: Exception) -> str | None:
    return f"peer gone: {error}" if isinstance(error, PeerGone) else None

  def close_inputs(self) -> None:
    self.closed = True

  def loops(self) -> list[tuple[int, int]]:
    """(first step, steps) of each host loop."""
    return [(c[1], c[2]) for c in self.calls if c[0] == "host_loop"]

  def evals(self) -> list[int]:
    return [c[1] for c in self.calls if c[0] == "evaluate"]


def _config(tmp_path, **flags) -> TrainConfig:
  return TrainConfig(model_dir=str(tmp_path)).replace(
      **{"global_batch_size": 8, "num_train_images": 80, "train_steps": 10,
         "steps_per_loop": 4, "eval_every_steps": 0,
         "checkpoint_every_steps": 0, "checkpoint_every_minutes": 0.0,
         "warmup_epochs": 0, **flags})


class _FakeClock:
  """A monotonic clock that moves `minutes` each time it is read."""

  def __init__(self, minutes: float):
    self.seconds, self.step_s = 0.0, minutes * 60

  def __call__(self) -> float:
    self.seconds += self.step_s
    return self.seconds


def test_host_loops_end_at_every_eval_and_checkpoint_step(tmp_path):
  engine = FakeEngine(_config(tmp_path, eval_every_steps=3,
                              checkpoint_every_steps=5))
  last = loop.fit(engine, "train", "eval")
  assert engine.loops() == [(0, 3), (3, 2), (5, 1), (6, 3), (9, 1)]
  assert engine.evals() == [3, 6, 9, 10]
  assert engine.saved == [5, 10]
  assert last["split"] == "eval" and last["step"] == 10
  records = read_metrics(str(tmp_path))
  assert [r["step"] for r in records if r["split"] == "train"] == [
      3, 5, 6, 9, 10]
  assert [r["top1"] for r in records if r["split"] == "eval"] == [0.25] * 4
  assert all(r["images_per_sec"] > 0 and r["elapsed_s"] >= 0
             for r in records)
  assert engine.closed


def test_without_an_eval_set_fit_returns_the_last_train_record(tmp_path):
  engine = FakeEngine(_config(tmp_path))
  last = loop.fit(engine, "train")
  assert last["split"] == "train" and last["step"] == 10
  assert last["learning_rate"] == pytest.approx(1.0)  # the engine's, at 10
  assert engine.saved == [10]  # the last step always saves
  assert engine.evals() == []


def test_default_flags_checkpoint_within_ten_minutes_without_an_eval(
    tmp_path):
  """A hard kill (no SIGTERM) then loses minutes, not the run. Each host
  loop reads the clock once: 4 minutes a loop; the timer restarts (one more
  read) at the start and after each save."""
  cfg = TrainConfig(model_dir=str(tmp_path)).replace(
      global_batch_size=8, num_train_images=80, train_steps=6,
      steps_per_loop=1, checkpoint_every_steps=0, warmup_epochs=0)
  assert (cfg.run.checkpoint_every_minutes,
          cfg.run.eval_every_steps) == (10.0, 0)
  engine = FakeEngine(cfg)
  training = loop.TrainingLoop(engine)
  training.save_timer = cadence.SaveTimer(10.0, now=_FakeClock(4))
  training.fit("train")
  assert engine.saved == [3, 6]


def test_checkpoint_every_minutes_0_saves_only_on_the_step_cadence(tmp_path):
  engine = FakeEngine(_config(tmp_path, train_steps=6, steps_per_loop=1))
  training = loop.TrainingLoop(engine)
  training.save_timer = cadence.SaveTimer(0.0, now=_FakeClock(4))
  training.fit("train")
  assert engine.saved == [6]


@pytest.mark.parametrize("who", ["this process", "a peer"])
def test_sigterm_saves_after_the_host_loop_then_stops(tmp_path, who):
  flags = dict(sigterm_at=5) if who == "this process" else dict(
      peer_sigterm_at=5)
  engine = FakeEngine(_config(tmp_path, steps_per_loop=2), **flags)
  with pytest.raises(preemption.Preempted, match="ckpt-6") as stop:
    loop.fit(engine, "train", "eval")
  assert stop.value.exit_code == preemption.PREEMPTED_EXIT_CODE
  assert engine.saved == [6] and engine.loops()[-1] == (4, 2)
  assert engine.evals() == []  # no eval is due at 6


def test_sigterm_in_the_last_host_loop_finishes_the_run(tmp_path):
  engine = FakeEngine(_config(tmp_path, steps_per_loop=5), sigterm_at=10)
  previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
  try:
    assert loop.fit(engine, "train")["step"] == 10
  finally:
    signal.signal(signal.SIGTERM, previous)
  assert engine.saved == [10]


def test_a_nan_step_stops_the_run_without_saving(tmp_path):
  engine = FakeEngine(_config(tmp_path, checkpoint_every_steps=4),
                      nan_at={6})
  with pytest.raises(loop_report.NonFiniteLossError,
                     match=r"NaN/Inf at step 6 \(host loop of steps 5-8\)"
                           r".*checkpoint is ckpt-4 and stays"):
    loop.fit(engine, "train")
  assert engine.saved == [4]
  assert [r["step"] for r in read_metrics(str(tmp_path))] == [4]


def test_skipped_steps_are_counted_and_not_applied(tmp_path):
  engine = FakeEngine(_config(tmp_path, skip_nonfinite_steps=True),
                      nan_at={2, 3})
  loop.fit(engine, "train")
  records = read_metrics(str(tmp_path))
  assert records[0]["skipped_steps"] == 2 and records[0]["step"] == 2
  assert [r["step"] for r in records] == [2, 6, 10]
  assert engine.input_batches == 12  # the skipped batches were read


def test_host_loops_of_nothing_but_skipped_steps_stop_the_run(tmp_path):
  engine = FakeEngine(_config(tmp_path, skip_nonfinite_steps=True,
                              train_steps=1000, steps_per_loop=2),
                      nan_at=set(range(1, 1000)))
  with pytest.raises(loop_report.NonFiniteLossError,
                     match=r"last 3 host loops.*cannot pass step 0.*"
                           r"checkpoint is ckpt-0\. Restart"):
    loop.fit(engine, "train")
  records = read_metrics(str(tmp_path))
  assert [r["skipped_steps"] for r in records] == [2, 2, 2]
  assert not any("loss" in r for r in records)


def test_a_lost_peer_stops_the_run_naming_the_last_checkpoint(tmp_path):
  engine = FakeEngine(_config(tmp_path, checkpoint_every_steps=4),
                      fail_at=(6, PeerGone("connection reset")))
  with pytest.raises(preemption.WorkerLost,
                     match=r"peer gone: connection reset.*ckpt-4") as stop:
    loop.fit(engine, "train")
  assert stop.value.exit_code == preemption.WORKER_LOST_EXIT_CODE
  assert engine.closed


def test_other_errors_pass_through_unchanged(tmp_path):
  engine = FakeEngine(_config(tmp_path), fail_at=(3, KeyError("oops")))
  with pytest.raises(KeyError, match="oops"):
    loop.fit(engine, "train")


def test_an_unwritable_checkpoint_ends_the_run_with_the_train_records(
    tmp_path):
  engine = FakeEngine(_config(tmp_path, checkpoint_every_steps=4),
                      unwritable_from=8)
  with pytest.raises(storage.StorageError, match="Writing a checkpoint to "
                     "ckpt-8 failed: OSError: disk full"):
    loop.fit(engine, "train")
  assert engine.saved == [4]
  assert [r["step"] for r in read_metrics(str(tmp_path))] == [4, 8]


def test_a_finished_run_run_again_only_evaluates(tmp_path):
  engine = FakeEngine(_config(tmp_path), restored_step=10)
  record = loop.fit(engine, "train", "eval")
  assert engine.loops() == [] and engine.saved == []
  assert engine.evals() == [10] and record["step"] == 10


def test_a_finished_run_recomputes_its_bn_statistics_first(tmp_path):
  engine = FakeEngine(_config(tmp_path, bn_stats="recompute",
                              bn_recompute_batches=3), restored_step=10)
  loop.fit(engine, "train", "eval")
  assert [c[0] for c in engine.calls] == [
      "restore", "agree", "start_input", "recompute_bn", "evaluate"]


def test_bn_statistics_are_recomputed_before_each_save_and_eval(tmp_path):
  engine = FakeEngine(_config(tmp_path, bn_stats="recompute",
                              bn_recompute_batches=2, eval_every_steps=5,
                              checkpoint_every_steps=4))
  loop.fit(engine, "train", "eval")
  assert [c[1] for c in engine.calls if c[0] == "recompute_bn"] == [
      4, 5, 8, 10]
  # 10 training batches and 2 for each recomputation.
  assert engine.input_batches == 18


def test_a_resumed_run_reads_on_from_its_input_position(tmp_path):
  (tmp_path / "metrics.jsonl").write_text(
      '{"step": 4, "split": "train"}\n{"step": 8, "split": "train"}\n')
  engine = FakeEngine(_config(tmp_path), restored_step=4)
  loop.fit(engine, "train")
  assert ("start_input", "train", 4) in engine.calls
  assert engine.loops()[0] == (4, 4)
  # The record of step 8, to be redone, was dropped.
  assert [r["step"] for r in read_metrics(str(tmp_path))] == [4, 8, 10]


def test_max_loop_seconds_sizes_each_loop_by_the_last_one_s_pace(
    tmp_path, monkeypatch):
  """The first host loop runs one step (it compiles); later ones as many
  as fit in --max_loop_seconds at the last loop's pace."""
  now = iter(range(0, 1000, 1))  # every read of the clock: 1 s later
  monkeypatch.setattr(loop.time, "time", lambda: float(next(now)))
  engine = FakeEngine(_config(tmp_path, train_steps=100,
                              steps_per_loop=100000, max_loop_seconds=3))
  loop.fit(engine, "train")
  sizes = [n for _, n in engine.loops()]
  assert sizes[0] == 1 and sizes[1] == 3 and sum(sizes) == 100


def test_the_loop_callback_sees_each_train_record(tmp_path):
  seen = []
  loop.fit(FakeEngine(_config(tmp_path)), "train", loop_callback=seen.append)
  assert [r["step"] for r in seen] == [4, 8, 10]


def test_an_unresolved_config_is_refused(tmp_path):
  with pytest.raises(ValueError,
                     match="num_train_images is 0: resolve the config first"):
    loop.TrainingLoop(FakeEngine(_config(tmp_path, num_train_images=0)))
