"""Specification of tools/plot_metrics.py."""
import json
import os
import subprocess
import sys

import matplotlib.image
import pytest

from tools import plot_metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def train(step, elapsed, loss=2.0, lr=0.1):
  return {"step": step, "split": "train", "loss": loss, "top1": 0.1 * step,
          "top5": 0.5, "examples": 64, "images_per_sec": 100.0 + step,
          "elapsed_s": elapsed, "learning_rate": lr}


def evaluation(step, elapsed, top1):
  return {"step": step, "split": "eval", "loss": 1.5, "top1": top1,
          "top5": 0.9, "examples": 50, "images_per_sec": 500.0,
          "elapsed_s": elapsed}


# Two runs: the second resumes at step 2, its elapsed_s restarts from 0.
RECORDS = [train(1, 60.0, loss=2.5, lr=0.05), train(2, 120.0, lr=0.1),
           evaluation(2, 150.0, 0.4),
           train(3, 30.0, loss=1.5, lr=0.08), evaluation(3, 90.0, 0.6)]


@pytest.fixture
def model_dir(tmp_path):
  with open(tmp_path / "metrics.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in RECORDS)
  return tmp_path


def _line(figure, title, label):
  axes = next(a for a in figure.axes if a.get_title() == title)
  line = next(ln for ln in axes.get_lines() if ln.get_label() == label)
  return list(line.get_xdata()), list(line.get_ydata())


def test_cli_writes_png_to_model_dir_by_default(model_dir):
  result = subprocess.run(
      [sys.executable, "-m", "tools.plot_metrics", f"--model_dir={model_dir}"],
      cwd=REPO, capture_output=True, text=True, timeout=120,
      env={k: v for k, v in os.environ.items() if k != "DISPLAY"})
  assert result.returncode == 0, result.stderr[-3000:]
  path = model_dir / "metrics.png"
  assert path.read_bytes()[:8] == PNG_MAGIC
  height, width, _ = matplotlib.image.imread(path).shape
  assert (width, height) == (1500, 800)


def test_output_flag_names_the_png(model_dir, tmp_path):
  output = str(tmp_path / "curves.png")
  assert plot_metrics.plot_metrics(str(model_dir), output) == output
  with open(output, "rb") as f:
    assert f.read(8) == PNG_MAGIC


def test_panels_plot_the_records_of_each_split():
  figure = plot_metrics.plot(RECORDS)
  assert _line(figure, "loss", "train") == ([1, 2, 3], [2.5, 2.0, 1.5])
  assert _line(figure, "top-1 vs step", "eval") == ([2, 3], [0.4, 0.6])
  assert _line(figure, "learning rate", "train") == ([1, 2, 3],
                                                      [0.05, 0.1, 0.08])
  assert _line(figure, "train images/s", "train")[1] == [101.0, 102.0, 103.0]
  assert _line(figure, "top-5", "eval") == ([2, 3], [0.9, 0.9])


def test_wall_time_continues_across_a_resumed_run():
  assert plot_metrics.wall_minutes(RECORDS) == [1.0, 2.0, 2.5, 3.0, 4.0]
  figure = plot_metrics.plot(RECORDS)
  assert _line(figure, "top-1 vs wall time", "eval") == ([2.5, 4.0],
                                                         [0.4, 0.6])


def test_missing_metrics_gives_clear_error(tmp_path):
  with pytest.raises(ValueError, match="has no metrics.jsonl"):
    plot_metrics.plot_metrics(str(tmp_path))
