"""`python main.py --help` lists every training flag by config part, and
tensorflow/tpu's resnet_main.py flag names work where the meaning is the
same (issue 37)."""
import os
import subprocess
import sys

from absl import flags

from resnet_tpu import flags as resnet_flags
from resnet_tpu.config import FLAG_FIELDS

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_help_lists_every_training_flag_under_its_part():
  result = subprocess.run([sys.executable, "main.py", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  text = result.stdout  # absl's --help exits 1
  assert "Training flags:" in text, result.stderr[-2000:]
  positions = {}
  for title in resnet_flags.PART_TITLES.values():
    assert title in text
    positions[title] = text.index(title)
  for name, (part, _) in FLAG_FIELDS.items():
    assert f"  --{name}: " in text, name
    # Under its own part's heading: after it, before the next one.
    at = text.index(f"  --{name}: ")
    heading = max((p, t) for t, p in positions.items() if p < at)[1]
    assert heading == resnet_flags.PART_TITLES[part], name
  assert "also --train_batch_size, as tensorflow/tpu" in " ".join(text.split())


def test_a_tensorflow_tpu_command_line_works_unchanged():
  """models/official/resnet/resnet_main.py's flags, as its README runs it."""
  flag_values = flags.FlagValues()
  resnet_flags.define_flags(flag_values)
  flag_values([
      "main.py", "--data_dir=gs://bucket/imagenet", "--model_dir=/tmp/run",
      "--resnet_depth=50", "--train_batch_size=1024",
      "--eval_batch_size=1024", "--train_steps=112603",
      "--iterations_per_loop=1251", "--steps_per_eval=5004",
      "--num_label_classes=1000", "--base_learning_rate=0.1",
      "--momentum=0.9", "--precision=bfloat16", "--label_smoothing=0.1",
      "--weight_decay=1e-4", "--num_train_images=1281167",
      "--num_eval_images=50000"])
  cfg = resnet_flags.config_from_flags(flag_values)
  assert cfg.run.global_batch_size == 1024
  assert cfg.run.steps_per_loop == 1251
  assert cfg.run.eval_every_steps == 5004
  assert cfg.model.num_classes == 1000
  assert (cfg.run.train_steps, cfg.model.resnet_depth,
          cfg.model.precision) == (112603, 50, "bfloat16")
