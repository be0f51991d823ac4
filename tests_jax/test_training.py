"""Training on JAX end to end (issue 49): main.py --backend=jax, as a user
runs it, in processes of its own.

- The CPU demo (flags/cpu_demo.cfg: 4 virtual CPU devices, BN groups of 2,
  the demo's TFRecords) trains, evaluates, checkpoints and exports on JAX,
  and learns as the TensorFlow engine does on the same data and budget
  (TOP1_TOLERANCE). Run again, it restores its last checkpoint and
  evaluates it to the same numbers; its SavedModel scores as its own
  evaluation did.
- --init_checkpoint: a JAX run fine-tunes from either engine's demo run.
- --batch_size_schedule: steps of several micro-batches, resumed at the
  right input position; --bn_stats=recompute reads its batches before each
  checkpoint, counted in the input position.
- Bad flags get one line, as on TensorFlow. The loop's policy (SIGTERM,
  --max_loop_seconds, NaN stops, the checkpoint clock) is the same code on
  both engines (train/loop.py), tested once against a fake engine
  (tests/test_loop.py); SIGTERM through main.py on JAX is
  test_without_tensorflow.py's, damaged checkpoints each store's
  (tests/test_reliability.py, test_checkpoints_npz.py).
"""
import json
import os
import subprocess
import sys

import pytest

from main_runs import ROOT
from main_runs import RUN_TIMEOUT_S
from main_runs import TINY
from main_runs import TOP1_TOLERANCE
from main_runs import env
from main_runs import main
from main_runs import make_demo_data
from main_runs import ok
from main_runs import records


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> str:
  return make_demo_data(str(tmp_path_factory.mktemp("demo_data")))


@pytest.fixture(scope="module")
def demo_runs(demo_data, tmp_path_factory) -> dict:
  """The CPU demo on each engine; JAX's exports. name -> (model_dir,
  stderr)."""
  runs = {}
  for backend in ("jax", "tensorflow"):
    model_dir = str(tmp_path_factory.mktemp(f"demo_{backend}"))
    export = ((f"--export_dir={model_dir}/export",)
              if backend == "jax" else ())
    done = main("--flagfile=flags/cpu_demo.cfg", f"--data_dir={demo_data}",
                f"--model_dir={model_dir}", *export, backend=backend)
    runs[backend] = (model_dir, ok(done))
  return runs


def test_the_demo_learns_on_jax_as_on_tensorflow(demo_runs):
  jax_eval = records(demo_runs["jax"][0], "eval")[-1]
  tf_eval = records(demo_runs["tensorflow"][0], "eval")[-1]
  assert jax_eval["step"] == tf_eval["step"] == 100
  assert jax_eval["examples"] == tf_eval["examples"] == 250
  assert abs(jax_eval["top1"] - tf_eval["top1"]) <= TOP1_TOLERANCE, (
      jax_eval, tf_eval)
  assert jax_eval["top1"] > 0.5  # chance is 0.1


def test_a_jax_run_logs_its_loops_evals_and_checkpoints(demo_runs):
  model_dir, log = demo_runs["jax"]
  assert "Engine: Keras on jax" in log
  assert "BN groups [[0, 1], [2, 3]]" in log
  train = records(model_dir, "train")
  assert [r["step"] for r in train] == [25, 50, 75, 100]
  assert all(r["examples"] == 25 * 64 and r["images_per_sec"] > 0
             for r in train)
  assert train[-1]["loss"] < train[0]["loss"]
  assert [r["step"] for r in records(model_dir, "eval")] == [50, 100]
  assert "step 100/100: loss" in log and "ETA 0:00:00" in log
  assert {"ckpt-50.index", "ckpt-100.index"} <= set(os.listdir(model_dir))
  with open(os.path.join(model_dir, "config.json")) as f:
    assert json.load(f)["backend"] == "jax"


def test_a_finished_jax_run_restores_and_evaluates_to_the_same_numbers(
    demo_runs, demo_data):
  model_dir, _ = demo_runs["jax"]
  before = records(model_dir, "eval")[-1]
  log = ok(main("--flagfile=flags/cpu_demo.cfg", f"--data_dir={demo_data}",
                f"--model_dir={model_dir}"))
  assert f"Restored {model_dir}/ckpt-100 at step 100" in log
  assert "The run is finished at step 100" in log
  after = records(model_dir, "eval")[-1]
  assert (after["loss"], after["top1"]) == (before["loss"], before["top1"])


def test_the_jax_runs_savedmodel_scores_as_its_evaluation(demo_runs,
                                                          demo_data):
  model_dir, _ = demo_runs["jax"]
  done = subprocess.run(
      [sys.executable, "-m", "tools.evaluate",
       f"--saved_model={model_dir}/export", f"--data_dir={demo_data}"],
      cwd=ROOT, env=env(KERAS_BACKEND="tensorflow"), capture_output=True,
      text=True, timeout=RUN_TIMEOUT_S, check=True)
  served = json.loads(done.stdout.strip().splitlines()[-1])
  trained = records(model_dir, "eval")[-1]
  assert served["examples"] == trained["examples"]
  assert served["top1"] == pytest.approx(trained["top1"], abs=1 / 250)


def test_tensorflow_refuses_to_resume_a_jax_run(demo_runs, demo_data):
  model_dir, _ = demo_runs["jax"]
  done = main("--flagfile=flags/cpu_demo.cfg", f"--data_dir={demo_data}",
              f"--model_dir={model_dir}", backend="tensorflow")
  assert done.returncode == 1
  assert "--backend=jax there, tensorflow here" in done.stderr
  assert "Traceback" not in done.stderr


@pytest.mark.parametrize("source", ["tensorflow", "jax"])
def test_a_jax_run_fine_tunes_from_either_engines_run(demo_runs, demo_data,
                                                      tmp_path, source):
  """Two steps at a tiny LR from the demo's weights keep its score (fresh
  weights score about 0.1, chance)."""
  source_dir, _ = demo_runs[source]
  log = ok(main("--flagfile=flags/cpu_demo.cfg", f"--data_dir={demo_data}",
                f"--model_dir={tmp_path}", f"--init_checkpoint={source_dir}",
                "--train_steps=2", "--warmup_epochs=0",
                "--base_learning_rate=1e-6"))
  assert (f"Fine-tuning from {source_dir}/ckpt-100: network weights "
          "restored; optimizer, step and input start afresh") in log
  tuned = records(str(tmp_path), "eval")[-1]
  assert tuned["step"] == 2
  assert tuned["top1"] >= records(source_dir, "eval")[-1]["top1"] - (
      TOP1_TOLERANCE), tuned


def test_batch_size_control_steps_over_micro_batches_and_resumes(tmp_path):
  """Mikami et al.'s batch-size control on epochs of 32 images: 4 steps at
  the global batch of 8, then 2 of 16 (two micro-batches each): 8 batches
  read."""
  flags = (*TINY, "--num_train_images=32", "--batch_size_schedule=0:8,1:16",
           "--train_epochs=2", "--steps_per_loop=2",
           f"--model_dir={tmp_path}")
  ok(main(*flags))
  assert [(r["step"], r["examples"]) for r in records(
      str(tmp_path), "train")] == [(2, 16), (4, 16), (6, 32)]
  log = ok(main(*flags))
  assert (f"Restored {tmp_path}/ckpt-6 at step 6 (input at global batch 8)"
          in log), log[-3000:]


def test_recomputed_bn_statistics_read_training_batches_before_each_save(
    tmp_path):
  """Akiba et al.'s --bn_stats=recompute: 2 batches before each of the 2
  checkpoints, counted in the input position (4 steps + 4)."""
  flags = (*TINY, "--bn_stats=recompute", "--bn_recompute_batches=2",
           "--train_steps=4", "--steps_per_loop=2",
           "--checkpoint_every_steps=2", f"--model_dir={tmp_path}")
  log = ok(main(*flags))
  for step in (2, 4):
    assert (f"BN statistics recomputed from 2 training batches at step "
            f"{step}") in log
  log = ok(main(*flags))
  assert (f"Restored {tmp_path}/ckpt-4 at step 4 (input at global batch 8)"
          in log), log[-3000:]


@pytest.mark.parametrize("flag,message", [
    ("--gradient_all_reduce=ring", "--gradient_all_reduce=ring is not "
     "supported with --backend=jax"),
    ("--num_cpu_replicas=3", "--global_batch_size=8 must be divisible by "
     "the number of replicas (3)"),
    ("--strategy=tpu", "--strategy=tpu: JAX found no TPU, only cpu "
     "devices"),
    ("--tpu=my-tpu", "--tpu=my-tpu is not supported with --backend=jax"),
    ("--num_processes=2", "--num_processes: for --backend=jax "
     "--strategy=multi_worker"),
])
def test_bad_flags_on_jax_get_one_line(tmp_path, flag, message):
  done = main(*TINY, "--train_steps=4", f"--model_dir={tmp_path}", flag)
  assert done.returncode == 1
  last = done.stderr.strip().splitlines()[-1]
  assert last.startswith("main.py: error: ") and message in last, last
  assert "Traceback" not in done.stderr


def test_several_jax_processes_need_multi_worker():
  # pylint: disable-next=g-import-not-at-top
  from resnet_tpu.engines.jax import startup
  startup.check_devices("cpu", "cpu", 1)
  startup.check_devices("multi_worker", "cpu", 2)
  with pytest.raises(startup.config_lib.ConfigError,
                     match="JAX runs 4 processes .* under --strategy=tpu: "
                     "use --strategy=multi_worker"):
    startup.check_devices("tpu", "tpu", 4)


def test_an_unknown_keras_backend_gets_one_line(tmp_path):
  done = main(*TINY, "--train_steps=4", f"--model_dir={tmp_path}",
              backend="auto", environ=env(KERAS_BACKEND="torch"))
  assert done.returncode == 1
  assert ("main.py: error: KERAS_BACKEND='torch': resnet_tpu runs on "
          "Keras's tensorflow or jax engine") in done.stderr
