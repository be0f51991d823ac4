"""README's "Fine-tuning" commands run as written, at tiny scale (issue 50):
from a class-folder tree of three classes to a fine-tuned, evaluated,
exported and predicted model. Only the placeholders change (my_photos, D,
M, F, photo.png become temporary paths, --num_classes the tree's count),
and main.py gets flags that make the network and the run tiny."""
import json
import os
import re
import shlex
import subprocess
import sys

import numpy as np
import tensorflow as tf

from data.make_synthetic import make_synthetic
from resnet_tpu import run as run_lib
from resnet_tpu.config import TrainConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLASSES = 3
# The network of M and a run of 6 steps; the rest is flags/finetune.cfg's.
TINY = ("--resnet_depth=18", "--image_size=32", "--precision=float32",
        "--global_batch_size=8", "--eval_batch_size=8", "--train_steps=6",
        "--steps_per_loop=3", "--eval_every_steps=3", "--warmup_epochs=0",
        "--strategy=cpu")


def readme_fine_tune_commands() -> list[str]:
  """The shell block after README's **Fine-tuning.**, a command a line."""
  with open(os.path.join(ROOT, "README.md")) as f:
    text = f.read()
  section = text[text.index("**Fine-tuning.**"):]
  block = section[section.index("```sh\n") + 6:]
  block = block[:block.index("```")]
  return [line for line in block.replace("\\\n", " ").splitlines()
          if line.strip()]


def test_readme_fine_tuning_runs_from_a_folder_tree_to_a_prediction(
    tmp_path):
  make_synthetic(str(tmp_path / "tree"), num_classes=CLASSES,
                 images_per_class=24, validation_images_per_class=1,
                 image_size=40)
  photos = tmp_path / "tree" / "train"
  photo = tmp_path / "photo.png"
  photo.write_bytes(tf.io.encode_png(np.full((40, 40, 3), 200, np.uint8))
                    .numpy())
  pretrained = str(tmp_path / "M")  # another run's network: 5 classes
  run_lib.run(TrainConfig.tiny(
      pretrained, use_synthetic_data=True, num_classes=5, resnet_depth=18,
      image_size=32, train_steps=2, steps_per_loop=2, global_batch_size=8,
      num_train_images=32))
  places = {"D": str(tmp_path / "D"), "M": pretrained,
            "F": str(tmp_path / "F")}
  commands = readme_fine_tune_commands()
  assert [shlex.split(c)[:3] for c in commands] == [
      ["python", "-m", "data.build_tfrecords"], ["python", "main.py",
                                                 "--flagfile=flags/finetune.cfg"],
      ["python", "-m", "tools.predict"]]
  outputs = []
  for command in commands:
    command = re.sub(r"(?<==)(D|M|F)(?=/|\s|$)",
                     lambda m: places[m.group(1)], command)
    command = (command.replace("my_photos", str(photos))
               .replace("photo.png", str(photo))
               .replace("--num_classes=10", f"--num_classes={CLASSES}"))
    args = shlex.split(command)
    args[0] = sys.executable
    if args[1] == "main.py":
      args += TINY
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    outputs.append(done)
  model_dir = places["F"]
  assert re.search(rf"Fine-tuning from {re.escape(pretrained)}/ckpt-2: "
                   r"network weights restored, .* freshly initialised \(5 "
                   rf"classes there, {CLASSES} here\)", outputs[1].stderr)
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    evals = [r for r in map(json.loads, f) if r["split"] == "eval"]
  assert [r["step"] for r in evals] == [3, 6] and evals[-1]["examples"] > 0
  assert os.path.exists(os.path.join(model_dir, "export", "saved_model.pb"))
  predicted = outputs[2].stdout.splitlines()
  assert predicted[0] == str(photo)
  names = sorted(os.listdir(photos))
  assert re.fullmatch(rf"  1\. ({'|'.join(names)}) \(\d\) 0\.\d+",
                      predicted[1]), predicted
