"""tools/demo_summary.py: `make demo` ends with top-1, its outputs and time."""
import json
import os
import subprocess
import sys

from tools import demo_summary

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _demo_run(model_dir) -> str:
  """A run folder as `make demo` leaves it; the SavedModel eval's file."""
  records = [{"step": 50, "split": "eval", "top1": 0.5, "examples": 250},
             {"step": 100, "split": "train", "top1": 0.99, "examples": 64},
             {"step": 100, "split": "eval", "top1": 0.912, "examples": 250}]
  (model_dir / "metrics.jsonl").write_text(
      "".join(json.dumps(r) + "\n" for r in records))
  for step in (50, 100):
    (model_dir / f"ckpt-{step}.index").touch()
  (model_dir / "export").mkdir()
  (model_dir / "export" / "saved_model.pb").touch()
  (model_dir / "metrics.png").touch()
  served = model_dir / "saved_model_eval.json"
  served.write_text(json.dumps({"top1": 0.912, "examples": 250}) + "\n")
  return str(served)


def test_summary_gives_last_eval_outputs_and_wall_time(tmp_path):
  served = _demo_run(tmp_path)
  lines, missing = demo_summary.summary(str(tmp_path), str(tmp_path / "export"),
                                        served, seconds=284.2)
  assert missing == []
  assert lines[0] == ("Demo done in 4 min 44 s: eval top-1 0.9120 on 250 "
                      "validation images at step 100; SavedModel top-1 "
                      "0.9120.")
  text = "\n".join(lines)
  assert f"{tmp_path}/ckpt-100 " in text
  assert f"tensorboard --logdir {tmp_path}" in text
  assert f"{tmp_path}/export" in text
  assert f"{tmp_path}/metrics.png" in text


def test_a_missing_output_is_named_and_fails_the_demo(tmp_path):
  _demo_run(tmp_path)
  (tmp_path / "export" / "saved_model.pb").unlink()
  done = subprocess.run(
      [sys.executable, "-m", "tools.demo_summary", f"--model_dir={tmp_path}",
       "--start_time=0"], cwd=ROOT, capture_output=True, text=True,
      timeout=60)
  assert done.returncode == 1
  assert f"Missing: a SavedModel in {tmp_path}/export." in done.stderr
  assert "eval top-1 0.9120" in done.stdout
