"""Training on JAX end to end (issue 49): main.py --backend=jax, as a user
runs it, in processes of its own. The demo on both engines (training,
restoring, exporting, fine-tuning from either engine's run) is
tests/test_demo_on_both_engines.py; here, what only JAX's engine does:

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

import pytest

from main_runs import TINY
from main_runs import env
from main_runs import main
from main_runs import ok
from main_runs import records
from resnet_tpu.config import TrainConfig


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


def test_auto_is_recorded_as_the_kind_of_devices_jax_chose(tmp_path):
  # pylint: disable-next=g-import-not-at-top
  from resnet_tpu.engines.jax import startup
  assert [startup.resolved_kind("auto", platform)
          for platform in ("cpu", "gpu", "tpu")] == ["cpu", "gpu", "tpu"]
  assert startup.resolved_kind("multi_worker", "tpu") == "multi_worker"
  cfg = TrainConfig.tiny(str(tmp_path), backend="jax", strategy="auto",
                         use_synthetic_data=True, jax_compilation_cache_dir="")
  started, devices = startup.start(cfg)
  assert started.distribution.strategy == devices[0].platform == "cpu"


def test_an_unknown_keras_backend_gets_one_line(tmp_path):
  done = main(*TINY, "--train_steps=4", f"--model_dir={tmp_path}",
              backend="auto", environ=env(KERAS_BACKEND="torch"))
  assert done.returncode == 1
  assert ("main.py: error: KERAS_BACKEND='torch': resnet_tpu runs on "
          "Keras's tensorflow or jax engine") in done.stderr
