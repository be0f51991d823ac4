"""docs/fine-tuning.md's first commands run as written, at tiny scale (issues
50 and 59): from Keras's ImageNet ResNet-50, converted, and a class-folder
tree of three classes to a fine-tuned, evaluated, exported and predicted
model. Only the placeholders change (K, my_photos, D, F, photo.png become
temporary paths, --num_classes the tree's count), `--keras_weights=imagenet`
becomes a weights file of Keras's layout made here (nothing downloads), and
the converter and main.py get flags that make the images and the run tiny.
"""
import json
import os
import re
import shlex
import subprocess
import sys

import keras
import numpy as np
import tensorflow as tf

from data.make_synthetic import make_synthetic
from test_keras_weights import _save_keras2_h5

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join("docs", "fine-tuning.md")
CLASSES = 3
SIZE = 32  # ResNet-50's smallest input in keras.applications
# A run of 6 steps at 32 px; the rest is flags/finetune.cfg's.
TINY = (f"--image_size={SIZE}", "--precision=float32",
        "--global_batch_size=8", "--eval_batch_size=8", "--train_steps=6",
        "--steps_per_loop=3", "--eval_every_steps=3", "--warmup_epochs=0",
        "--strategy=cpu")


def fine_tune_commands() -> list[str]:
  """The first shell block of docs/fine-tuning.md, a command a line."""
  with open(os.path.join(ROOT, DOC)) as f:
    text = f.read()
  block = text[text.index("```sh\n") + 6:]
  block = block[:block.index("```")]
  return [line for line in block.replace("\\\n", " ").splitlines()
          if line.strip()]


def test_fine_tuning_runs_from_keras_weights_and_a_folder_tree_to_a_prediction(
    tmp_path):
  make_synthetic(str(tmp_path / "tree"), num_classes=CLASSES,
                 images_per_class=24, validation_images_per_class=1,
                 image_size=40)
  photos = tmp_path / "tree" / "train"
  photo = tmp_path / "photo.png"
  photo.write_bytes(tf.io.encode_png(np.full((40, 40, 3), 200, np.uint8))
                    .numpy())
  weights = tmp_path / "resnet50_weights_tf_dim_ordering_tf_kernels.h5"
  _save_keras2_h5(keras.applications.ResNet50(
      weights=None, classifier_activation=None,
      input_shape=(SIZE, SIZE, 3)), str(weights))
  places = {"K": str(tmp_path / "K"), "D": str(tmp_path / "D"),
            "F": str(tmp_path / "F")}
  commands = fine_tune_commands()
  assert [shlex.split(c)[:3] for c in commands] == [
      ["python", "-m", "tools.convert_keras_weights"],
      ["python", "-m", "data.build_tfrecords"],
      ["python", "main.py", "--flagfile=flags/finetune.cfg"],
      ["python", "-m", "tools.predict"]]
  outputs = []
  for command in commands:
    command = re.sub(r"(?<==)(K|D|F)(?=/|\s|$)",
                     lambda m: places[m.group(1)], command)
    command = (command.replace("--keras_weights=imagenet",
                               f"--keras_weights={weights}")
               .replace("my_photos", str(photos))
               .replace("photo.png", str(photo))
               .replace("--num_classes=10", f"--num_classes={CLASSES}"))
    args = shlex.split(command)
    args[0] = sys.executable
    if args[1] == "main.py":
      args += TINY
    elif args[2] == "tools.convert_keras_weights":
      args.append(f"--image_size={SIZE}")
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    outputs.append(done)
  assert re.search(rf"Fine-tuning from {re.escape(places['K'])}/\S+: "
                   r"network weights restored, .* freshly initialised "
                   rf"\(1000 classes there, {CLASSES} here\)",
                   outputs[2].stderr), outputs[2].stderr[-3000:]
  model_dir = places["F"]
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    evals = [r for r in map(json.loads, f) if r["split"] == "eval"]
  assert [r["step"] for r in evals] == [3, 6] and evals[-1]["examples"] > 0
  export = os.path.join(model_dir, "export", "1")  # a version folder
  assert os.path.exists(os.path.join(export, "saved_model.pb"))
  # docs/serving.md: a response's class names are the export's.
  names = sorted(os.listdir(photos))
  with open(os.path.join(export, "assets", "synsets.txt")) as f:
    assert [line.split("\t")[1] for line in f.read().splitlines()] == names
  predicted = outputs[3].stdout.splitlines()
  assert predicted[0] == str(photo)
  assert re.fullmatch(rf"  1\. ({'|'.join(names)}) \(\d\) 0\.\d+",
                      predicted[1]), predicted
