"""--profile_steps writes a TensorBoard profile of those steps' host loops
into the model_dir (resnet_tpu/train/profiling.py, issue 37)."""
import glob
import os

import pytest

from resnet_tpu import config as config_lib
from resnet_tpu import run as run_lib
from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from resnet_tpu.train.profiling import StepProfiler
from tiny_model import tiny_resnet


def _config(tmp_path, **overrides) -> TrainConfig:
  return TrainConfig.tiny(str(tmp_path / "model"), **{
      "use_synthetic_data": True, "num_classes": 10, "train_steps": 6,
      "steps_per_loop": 2, "global_batch_size": 8, "num_train_images": 32,
      **overrides})


def _profiles(cfg) -> list[str]:
  return glob.glob(os.path.join(cfg.model_dir, "plugins", "profile", "*",
                                "*.xplane.pb"))


def test_a_run_with_profile_steps_writes_one_profile(tmp_path):
  cfg = _config(tmp_path, profile_steps="3,4")
  run_lib.run(cfg, model_fn=tiny_resnet)
  profiles = _profiles(cfg)
  assert len(profiles) == 1 and os.path.getsize(profiles[0]) > 1000
  plain = _config(tmp_path / "plain")
  run_lib.run(plain, model_fn=tiny_resnet)
  assert _profiles(plain) == []


def test_the_profile_spans_the_host_loops_of_the_steps(monkeypatch):
  events = []
  monkeypatch.setattr("tensorflow.profiler.experimental.start",
                      lambda logdir: events.append(("start", logdir)))
  monkeypatch.setattr("tensorflow.profiler.experimental.stop",
                      lambda: events.append(("stop",)))
  profiler = StepProfiler((3, 5), "/m")
  for step in range(0, 8, 2):  # loops of 2 steps: 1-2, 3-4, 5-6, 7-8
    profiler.before_loop(step, 2)
    events.append(("loop", step + 1, step + 2))
    profiler.after_loop(step + 2)
  assert events == [("loop", 1, 2), ("start", "/m"), ("loop", 3, 4),
                    ("loop", 5, 6), ("stop",), ("loop", 7, 8)]


@pytest.mark.parametrize("value", ["5", "0,3", "4,2", "a,b", "1,2,3"])
def test_a_bad_profile_range_is_named(tmp_path, value):
  with pytest.raises(ConfigError, match="--profile_steps must be"):
    config_lib.validate(_config(tmp_path, profile_steps=value))


def test_host_loops_end_at_the_profile_range_s_edges(tmp_path, monkeypatch):
  """--profile_steps=3,5 with the shipped flagfiles' 1,251-step loops
  records steps 3 to 5, not the compile loop and a whole epoch (issue
  50)."""
  events = []
  monkeypatch.setattr("tensorflow.profiler.experimental.start",
                      lambda logdir: events.append("start"))
  monkeypatch.setattr("tensorflow.profiler.experimental.stop",
                      lambda: events.append("stop"))
  cfg = _config(tmp_path, profile_steps="3,5", train_steps=8,
                steps_per_loop=1251)

  def loop_ended(record):
    events.append(record["step"])

  run_lib.run(cfg, model_fn=tiny_resnet, loop_callback=loop_ended)
  # A loop's record is written after it ends (and after the profile stops).
  assert events == [2, "start", "stop", 5, 8]
  assert StepProfiler((3, 5), "/m").loop_limit(5) is None
  assert StepProfiler(None, "/m").loop_limit(0) is None
