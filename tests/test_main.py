"""`python main.py` end to end on real TFRecords and CPU replicas.

The path `make demo` takes: a fresh process, virtual CPU devices configured
by the run itself, the pre-flight data checks, training, eval over every
validation example and the final export.
"""
import json
import os
import subprocess
import sys

import pytest

from main_runs import BACKENDS
from data.build_tfrecords import build
from data.make_synthetic import make_synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The environment without the CPU kernel choice conftest.py made, so that
# main.py makes its own.
ENV = {k: v for k, v in os.environ.items() if k != "TF_ENABLE_ONEDNN_OPTS"}


def test_main_trains_evaluates_and_exports_on_cpu_replicas(tmp_path):
  images, records = tmp_path / "images", tmp_path / "records"
  make_synthetic(str(images), num_classes=3, images_per_class=8,
                 validation_images_per_class=3, image_size=40)
  build(str(images / "train"), str(records), "train", 2)
  build(str(images / "validation"), str(records), "validation", 1)
  model_dir = tmp_path / "run"
  result = subprocess.run(
      [sys.executable, "main.py", "--strategy=cpu", "--num_cpu_replicas=2",
       "--bn_group_size=2", f"--data_dir={records}",
       f"--model_dir={model_dir}", f"--export_dir={model_dir}/export",
       "--resnet_depth=18", "--num_classes=3", "--image_size=32",
       "--global_batch_size=4", "--eval_batch_size=4", "--train_steps=2",
       "--steps_per_loop=1", "--num_train_images=24", "--warmup_epochs=0"],
      cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert ("CPU kernels: TF_ENABLE_ONEDNN_OPTS=1 (--cpu_onednn=auto on a cpu "
          "run); TensorFlow runs oneDNN's: yes") in result.stderr
  with open(model_dir / "metrics.jsonl") as f:
    records_logged = [json.loads(line) for line in f]
  evals = [r for r in records_logged if r["split"] == "eval"]
  assert evals and evals[-1]["examples"] == 9  # 3 classes x 3, none dropped
  assert evals[-1]["step"] == 2
  assert (model_dir / "export" / "saved_model.pb").exists()


def _main(*flags: str, timeout: float = 120,
          python: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
  env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
  return subprocess.run([sys.executable, *python, "main.py", *flags],
                        cwd=ROOT, env=env, capture_output=True, text=True,
                        timeout=timeout)


def test_gpu_run_without_a_gpu_names_the_gpu_requirements(tmp_path):
  result = _main("--strategy=gpu", "--use_synthetic_data", "--train_steps=1",
                 f"--model_dir={tmp_path}")
  assert result.returncode == 1
  assert "requirements/gpu-tensorflow.txt" in result.stderr
  assert "Traceback" not in result.stderr


# What a run loads only once its flags have passed config.validate.
ENGINE_MODULES = {"tensorflow", "keras", "jax"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("flag,message", [
    ("--global_batch_size=0", "--global_batch_size must be >= 1, got 0"),
    ("--base_learning_rate=-1", "--base_learning_rate must be > 0, got -1.0"),
    ("--label_smoothing=1.5", "--label_smoothing must be >= 0 and < 1"),
])
def test_a_bad_flag_value_prints_one_message_before_any_engine_loads(
    tmp_path, flag, message, backend):
  result = _main("--strategy=cpu", "--use_synthetic_data", "--train_steps=1",
                 f"--model_dir={tmp_path}", f"--backend={backend}", flag,
                 python=("-X", "importtime"))
  assert result.returncode == 1
  assert message in result.stderr
  assert "Traceback" not in result.stderr
  loaded = {line.rsplit("|", 1)[1].strip()
            for line in result.stderr.splitlines()
            if line.startswith("import time:")}
  assert "resnet_tpu.config" in loaded  # -X importtime listed the imports
  assert not loaded & ENGINE_MODULES, loaded & ENGINE_MODULES


def test_main_chooses_the_cpu_kernels_before_tensorflow_loads(tmp_path):
  # oneDNN is TensorFlow's own default on CPUs with AVX-512 VNNI/BF16 or AMX,
  # so "off" holding there (and "on" above, elsewhere) shows the choice came
  # first.
  result = subprocess.run(
      [sys.executable, "main.py", "--strategy=cpu", "--cpu_onednn=off",
       "--use_synthetic_data", f"--model_dir={tmp_path}", "--resnet_depth=18",
       "--num_classes=2", "--image_size=32", "--global_batch_size=2",
       "--train_steps=1", "--warmup_epochs=0"],
      cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "TensorFlow runs oneDNN's: no" in result.stderr
