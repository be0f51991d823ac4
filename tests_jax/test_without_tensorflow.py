"""Training on JAX where TensorFlow is not installed, as on the H200's
image (issue 49): main.py run by without_tensorflow.py, which hides it.

The run trains on --use_synthetic_data, writes .npz checkpoints
(engines/jax/npz_checkpoints.py) and metrics.jsonl without TensorBoard, resumes
after SIGTERM (exit 42), sets a damaged latest checkpoint aside, refuses to
resume with other settings, and names in one line each flag that needs
TensorFlow, before start-up; its checkpoints export where TensorFlow is. Any
import of TensorFlow on the way would fail the run.
"""
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

from main_runs import ROOT
from main_runs import RUN_TIMEOUT_S
from main_runs import TINY
from main_runs import WITHOUT_TENSORFLOW
from main_runs import env
from main_runs import main
from main_runs import ok
from main_runs import records
from main_runs import stopped_after


def _main(*flags: str):
  return main(*flags, script=WITHOUT_TENSORFLOW)


def _saved(model_dir) -> list[str]:
  return sorted(n for n in os.listdir(model_dir) if n.startswith("ckpt"))


def test_sigterm_saves_an_npz_checkpoint_exits_42_and_the_next_run_resumes(
    tmp_path):
  flags = (*TINY, "--train_steps=400", "--steps_per_loop=2",
           f"--model_dir={tmp_path}")
  code, log = stopped_after("step 4/400", *flags, script=WITHOUT_TENSORFLOW)
  assert code == 42, log[-3000:]
  assert "No TensorBoard summaries: TensorFlow writes them" in log
  saved = _saved(tmp_path)
  assert len(saved) == 1 and saved[0].endswith(".npz"), saved
  step = int(saved[0][len("ckpt-"):-len(".npz")])
  assert [r["step"] for r in records(str(tmp_path), "train")] == list(
      range(2, step + 1, 2))
  assert not (tmp_path / "train").exists()  # no TensorBoard folder
  code, log = stopped_after(f"step {step + 2}/400", *flags,
                            script=WITHOUT_TENSORFLOW)
  assert code == 42, log[-3000:]
  assert (f"Restored {tmp_path}/ckpt-{step}.npz at step {step} (input at "
          f"global batch {step})") in log
  with open(tmp_path / "config.json") as f:
    assert json.load(f)["backend"] == "jax"


def test_a_damaged_latest_npz_checkpoint_is_set_aside_and_the_one_before_restored(
    tmp_path):
  flags = (*TINY, "--train_steps=4", "--steps_per_loop=2",
           "--checkpoint_every_steps=2", "--keep_checkpoints=2",
           f"--model_dir={tmp_path}")
  ok(_main(*flags))
  assert _saved(tmp_path) == ["ckpt-2.npz", "ckpt-4.npz"]
  latest = tmp_path / "ckpt-4.npz"
  latest.write_bytes(latest.read_bytes()[:1000])
  log = ok(_main(*flags))
  assert f"Checkpoint {tmp_path}/ckpt-4.npz is damaged" in log
  assert f"Restored {tmp_path}/ckpt-2.npz at step 2" in log
  assert (tmp_path / "damaged" / "ckpt-4.npz" / "ckpt-4.npz").is_file()
  assert "step 4/4: loss" in log
  assert _saved(tmp_path) == ["ckpt-2.npz", "ckpt-4.npz"]
  # Resumed with other settings, as on TensorFlow (preflight.check_resume).
  done = _main(*flags, "--global_batch_size=16")
  assert done.returncode == 1
  assert done.stderr.strip().splitlines()[-1].startswith(
      f"main.py: error: --model_dir='{tmp_path}' holds a run trained with "
      "other settings: --global_batch_size=8 there, 16 here."), done.stderr


# Serves `images.npy` with a SavedModel; writes its logits to `logits.npy`.
SERVE = """
import sys
import numpy as np
import tensorflow as tf
served = tf.saved_model.load(sys.argv[1]).signatures["serving_default"]
logits = served(images=tf.constant(np.load(sys.argv[2])))["logits"]
np.save(sys.argv[3], logits.numpy())
"""


def _network_of(model_dir) -> keras.Model:
  """The network of a run without TensorFlow, built here on JAX, with its
  latest checkpoint's weights (engines/jax/npz_checkpoints.py's layout)."""
  # pylint: disable=g-import-not-at-top
  from resnet_tpu import config as config_lib
  from resnet_tpu.model.resnet import build_model
  from resnet_tpu.train.checkpoints import paths
  # pylint: enable=g-import-not-at-top
  with open(os.path.join(model_dir, "config.json")) as f:
    record = json.load(f)
  cfg = config_lib.TrainConfig.from_flat(**{
      k: v for k, v in record.items()
      if k in {"model_dir", *config_lib.FLAG_FIELDS}})
  model = build_model(cfg.model, cfg.distribution)
  arrays = paths.read_npz(paths.latest(model_dir))
  for group in ("trainable", "non_trainable"):
    for i, variable in enumerate(getattr(model, f"{group}_variables")):
      variable.assign(arrays[paths.npz_key(group, i)])
  return model


def test_its_checkpoints_export_where_tensorflow_is_and_serve_the_same(
    tmp_path):
  """tools/export_savedmodel.py, on TensorFlow, reads the .npz checkpoint
  into the network TensorFlow builds: its SavedModel's logits are the
  JAX-built network's."""
  model_dir, export_dir = tmp_path / "run", tmp_path / "export"
  ok(_main(*TINY, "--train_steps=4", "--steps_per_loop=2",
           f"--model_dir={model_dir}"))
  tensorflow = env(KERAS_BACKEND="tensorflow")
  subprocess.run([sys.executable, "-m", "tools.export_savedmodel",
                  f"--model_dir={model_dir}", f"--export_dir={export_dir}"],
                 cwd=ROOT, env=tensorflow, check=True, capture_output=True,
                 timeout=RUN_TIMEOUT_S)
  images = np.random.default_rng(0).uniform(
      0, 255, [4, 32, 32, 3]).astype(np.float32)
  np.save(tmp_path / "images.npy", images)
  subprocess.run([sys.executable, "-c", SERVE, str(export_dir),
                  str(tmp_path / "images.npy"), str(tmp_path / "logits.npy")],
                 cwd=ROOT, env=tensorflow, check=True, capture_output=True,
                 timeout=RUN_TIMEOUT_S)
  served = np.load(tmp_path / "logits.npy")
  here = np.asarray(_network_of(str(model_dir))(images, training=False))
  assert np.abs(served - here).max() <= 1e-4 * np.abs(here).max(), (
      served, here)


def _tensorflow_checkpoint(model_dir) -> str:
  """A model_dir with a TensorFlow checkpoint's state file, as a run with
  TensorFlow leaves it."""
  os.makedirs(model_dir)
  with open(os.path.join(model_dir, "checkpoint"), "w") as f:
    f.write('model_checkpoint_path: "ckpt-8"\n'
            'all_model_checkpoint_paths: "ckpt-8"\n')
  return str(model_dir)


@pytest.mark.parametrize("flags,message", [
    (("--data_dir=/data/imagenet",), "--data_dir='/data/imagenet': reading "
     "TFRecords needs TensorFlow, which is not installed here"),
    (("--use_synthetic_data", "--export_dir=/tmp/export"),
     "--export_dir='/tmp/export': the SavedModel is written by TensorFlow"),
    (("--use_synthetic_data", "--init_checkpoint=/runs/a"),
     "--init_checkpoint='/runs/a': it is read by TensorFlow"),
    (("--use_synthetic_data", "--model_dir=gs://bucket/run"),
     "--model_dir='gs://bucket/run': without TensorFlow's file systems"),
    (("--use_synthetic_data", "TF_CHECKPOINT"), "holds TensorFlow "
     "checkpoints (TF_DIR/ckpt-8), which need TensorFlow"),
])
def test_what_needs_tensorflow_gets_one_line_before_start_up(tmp_path, flags,
                                                             message):
  tf_dir = str(tmp_path / "tf_run")
  flags = [f"--model_dir={_tensorflow_checkpoint(tf_dir)}"
           if f == "TF_CHECKPOINT" else f for f in flags]
  tiny = [f for f in TINY if f != "--use_synthetic_data"]
  done = _main(*tiny, "--train_steps=4", f"--model_dir={tmp_path}/run",
               *flags)
  assert done.returncode == 1
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith("main.py: error: ") and message.replace(
      "TF_DIR", tf_dir) in last, last
  assert "Traceback" not in done.stderr
