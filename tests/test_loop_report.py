"""loop_report.py: each host loop's record and log line, and what stops a run
on a NaN/Inf step."""
import logging
import math

import pytest

from resnet_tpu.train import loop_report
from resnet_tpu.train.loop_result import LoopResult


def _result(**counts) -> LoopResult:
  return LoopResult(loss=1.5, top1=0.25, top5=0.5, examples=64, **counts)


def test_finite_loop_passes_without_asking_for_the_checkpoint():
  def latest():
    raise AssertionError("the checkpoint folder was listed for nothing")
  loop_report.check_finite(_result(), 10, 5, skip=False,
                           latest_checkpoint=latest)


def test_non_finite_step_stops_naming_it_and_the_checkpoint_kept():
  result = _result(nonfinite_steps=2, first_nonfinite=3)
  with pytest.raises(loop_report.NonFiniteLossError,
                     match=r"at step 14 \(host loop of steps 11-15\).*"
                     r"ckpt-10 and stays the latest"):
    loop_report.check_finite(result, 10, 5, skip=False,
                             latest_checkpoint=lambda: "/m/ckpt-10")
  with pytest.raises(loop_report.NonFiniteLossError,
                     match="none was written yet"):
    loop_report.check_finite(result, 0, 5, skip=False,
                             latest_checkpoint=lambda: None)


def test_skip_nonfinite_steps_logs_them_and_goes_on(caplog):
  loop_report.check_finite(_result(nonfinite_steps=2, first_nonfinite=0),
                           10, 5, skip=True, latest_checkpoint=lambda: None)
  assert "Skipped 2 step(s)" in caplog.text


def test_record_names_every_count_and_the_log_line_the_eta(caplog):
  caplog.set_level(logging.INFO)
  # absl's logger can carry a level of its own (absl sets it when flags are
  # parsed in this process; WARNING broke this test in one CI run).
  caplog.set_level(logging.INFO, logger="absl")
  result = _result(unusable_examples=3, lost_records=7, nonfinite_steps=1,
                   first_nonfinite=0)
  record = loop_report.train_record(
      result, step=20, total=100, images_per_sec=50.0, elapsed_s=40.0,
      eta_s=loop_report.eta_seconds(40.0, 20, 80), learning_rate=0.1)
  assert record == {
      "step": 20, "split": "train", "loss": 1.5, "top1": 0.25, "top5": 0.5,
      "examples": 64, "images_per_sec": 50.0, "elapsed_s": 40.0,
      "learning_rate": 0.1, "unusable_examples": 3, "skipped_steps": 1,
      "lost_records": 7}
  assert ("without 3 unusable example(s) and 7 record(s) lost to damaged "
          "files in the steps up to 20") in caplog.text
  assert "step 20/100: loss 1.5000 top-1 0.2500 lr 0.1 50.0 images/s ETA " \
      "0:02:40" in caplog.text


def test_eta_and_its_format():
  assert loop_report.eta_seconds(40.0, 20, 80) == 160.0
  assert math.isnan(loop_report.eta_seconds(5.0, 0, 80))
  assert loop_report.format_seconds(3725.9) == "1:02:05"
  assert loop_report.format_seconds(math.nan) == "?"
