"""The CPU demo end to end on each engine (issues 49 and 58): main.py
--backend=tensorflow and --backend=jax on flags/cpu_demo.cfg (4 virtual CPU
devices, BN groups of 2, the demo's TFRecords), as a user runs it, in
processes of their own. Each behaviour is one test, parametrised over the
engines it applies to:

- both engines train, evaluate, checkpoint and export the demo, and learn
  alike on the same data and budget (TOP1_TOLERANCE);
- a finished run, run again, restores its last checkpoint and evaluates it
  to the same numbers; its SavedModel scores as its own evaluation did;
- neither engine resumes the other's run; a JAX run fine-tunes from either
  engine's (--init_checkpoint).

The JAX half needs JAX in the environment (.venv has it on every Python;
the TPU build's has not). The loop's policy (SIGTERM, --max_loop_seconds,
NaN stops, the checkpoint clock) is one code for both engines
(train/loop.py), tested once against a fake engine (test_loop.py).
"""
import json
import os
import subprocess
import sys

import pytest

from main_runs import BACKENDS
from main_runs import ROOT
from main_runs import RUN_TIMEOUT_S
from main_runs import TOP1_TOLERANCE
from main_runs import env
from main_runs import main
from main_runs import make_demo_data
from main_runs import needs_jax
from main_runs import ok
from main_runs import records

OTHER = {"tensorflow": "jax", "jax": "tensorflow"}


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory) -> str:
  return make_demo_data(str(tmp_path_factory.mktemp("demo_data")))


@pytest.fixture(scope="module")
def demo_run(demo_data, tmp_path_factory):
  """backend -> (model_dir, log) of the demo on that engine, exported to
  model_dir/export; each engine's run made once, when a test first asks."""
  runs = {}

  def run(backend: str) -> tuple[str, str]:
    if backend not in runs:
      model_dir = str(tmp_path_factory.mktemp(f"demo_{backend}"))
      done = main("--flagfile=flags/cpu_demo.cfg", f"--data_dir={demo_data}",
                  f"--model_dir={model_dir}",
                  f"--export_dir={model_dir}/export", backend=backend)
      runs[backend] = (model_dir, ok(done))
    return runs[backend]
  return run


@needs_jax
def test_the_demo_learns_alike_on_both_engines(demo_run):
  jax_eval = records(demo_run("jax")[0], "eval")[-1]
  tf_eval = records(demo_run("tensorflow")[0], "eval")[-1]
  assert jax_eval["step"] == tf_eval["step"] == 100
  assert jax_eval["examples"] == tf_eval["examples"] == 250
  assert abs(jax_eval["top1"] - tf_eval["top1"]) <= TOP1_TOLERANCE, (
      jax_eval, tf_eval)
  assert jax_eval["top1"] > 0.5  # chance is 0.1


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_demo_run_logs_its_loops_evals_and_checkpoints(demo_run, backend):
  model_dir, log = demo_run(backend)
  assert f"Engine: Keras on {backend}" in log
  train = records(model_dir, "train")
  assert [r["step"] for r in train] == [25, 50, 75, 100]
  assert all(r["examples"] == 25 * 64 and r["images_per_sec"] > 0
             for r in train)
  assert train[-1]["loss"] < train[0]["loss"]
  assert [r["step"] for r in records(model_dir, "eval")] == [50, 100]
  assert "step 100/100: loss" in log and "ETA 0:00:00" in log
  assert {"ckpt-50.index", "ckpt-100.index"} <= set(os.listdir(model_dir))
  with open(os.path.join(model_dir, "config.json")) as f:
    assert json.load(f)["backend"] == backend


@needs_jax
def test_a_jax_run_names_its_bn_groups(demo_run):
  assert "BN groups [[0, 1], [2, 3]]" in demo_run("jax")[1]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_finished_run_restores_and_evaluates_to_the_same_numbers(
    demo_run, demo_data, backend):
  model_dir, _ = demo_run(backend)
  before = records(model_dir, "eval")[-1]
  log = ok(main("--flagfile=flags/cpu_demo.cfg", f"--data_dir={demo_data}",
                f"--model_dir={model_dir}", backend=backend))
  assert f"Restored {model_dir}/ckpt-100 at step 100" in log
  assert "The run is finished at step 100" in log
  after = records(model_dir, "eval")[-1]
  assert (after["loss"], after["top1"]) == (before["loss"], before["top1"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_runs_savedmodel_scores_as_its_evaluation(demo_run, demo_data,
                                                      backend):
  model_dir, _ = demo_run(backend)
  done = subprocess.run(
      [sys.executable, "-m", "tools.evaluate",
       f"--saved_model={model_dir}/export", f"--data_dir={demo_data}"],
      cwd=ROOT, env=env(KERAS_BACKEND="tensorflow"), capture_output=True,
      text=True, timeout=RUN_TIMEOUT_S, check=True)
  served = json.loads(done.stdout.strip().splitlines()[-1])
  trained = records(model_dir, "eval")[-1]
  assert served["examples"] == trained["examples"]
  assert served["top1"] == pytest.approx(trained["top1"], abs=1 / 250)


@needs_jax
@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_neither_engine_resumes_the_others_run(demo_run, demo_data, backend):
  model_dir, _ = demo_run(OTHER[backend])
  done = main("--flagfile=flags/cpu_demo.cfg", f"--data_dir={demo_data}",
              f"--model_dir={model_dir}", backend=backend)
  assert done.returncode == 1
  assert (f"--backend={OTHER[backend]} there, {backend} here"
          in done.stderr)
  assert "Traceback" not in done.stderr


@needs_jax
@pytest.mark.parametrize("source", ["tensorflow", "jax"])
def test_a_jax_run_fine_tunes_from_either_engines_run(demo_run, demo_data,
                                                      tmp_path, source):
  """Two steps at a tiny LR from the demo's weights keep its score (fresh
  weights score about 0.1, chance)."""
  source_dir, _ = demo_run(source)
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
