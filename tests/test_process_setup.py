"""resnet_tpu/runtime/process_setup.py: TensorFlow's C++ start-up logs quieted, the
project's absl warnings kept, the user's TF_CPP_MIN_LOG_LEVEL first, and the
strategy kind decided once, before TensorFlow loads."""
import os
import subprocess
import sys

import pytest

from data.make_synthetic import make_synthetic
from resnet_tpu import config as config_lib
from resnet_tpu.runtime import process_setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LEVEL = process_setup.LOG_LEVEL_ENV
# Lines TensorFlow writes at INFO/WARNING once its logging is set up, and the
# error it logs probing for CUDA on a machine without it.
BELOW_ERROR = "cpu_feature_guard"
CUINIT = "failed call to cuInit"


def _stderr(args: list[str]) -> str:
  """stderr of `python args` without the log level conftest.py sets."""
  env = {k: v for k, v in os.environ.items() if k != LEVEL}
  done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stderr


# Loads TensorFlow and its devices, after quieting its logs if asked to.
START_TF = """
import sys
from resnet_tpu.runtime import process_setup
if sys.argv[1] == "quiet":
  process_setup.quiet_tensorflow_logs()
import tensorflow as tf
tf.config.list_physical_devices()
"""


def test_tensorflows_cpp_start_up_lines_are_hidden():
  loud = _stderr(["-c", START_TF, "loud"])
  quiet = _stderr(["-c", START_TF, "quiet"])
  assert BELOW_ERROR in loud  # the check below is not vacuous
  assert BELOW_ERROR not in quiet
  accelerator = (process_setup.nvidia_gpu_visible()
                 or process_setup.tpu_chip_attached())
  if not accelerator:
    assert CUINIT in loud
    assert CUINIT not in quiet


def test_a_data_entry_point_is_quiet_but_names_an_unreadable_image(tmp_path):
  make_synthetic(str(tmp_path / "images"), num_classes=2, images_per_class=2,
                 validation_images_per_class=0, image_size=16)
  broken = tmp_path / "images" / "train" / os.listdir(
      tmp_path / "images" / "train")[0] / "broken.JPEG"
  broken.write_bytes(b"not a JPEG")
  stderr = _stderr(["-m", "data.build_tfrecords",
                    f"--input_dir={tmp_path / 'images' / 'train'}",
                    f"--output_dir={tmp_path / 'records'}", "--split=train",
                    "--num_shards=1"])
  assert BELOW_ERROR not in stderr
  assert f"skipping unreadable image {broken}" in stderr  # absl's warning


@pytest.mark.parametrize("accelerator, level", [(True, "2"), (False, "3")])
def test_errors_are_hidden_only_on_hosts_without_an_accelerator(accelerator,
                                                                level):
  environ = {}
  assert process_setup.quiet_tensorflow_logs(environ, accelerator) == level
  assert environ == {LEVEL: level}


def test_the_users_log_level_wins():
  environ = {LEVEL: "0"}
  assert process_setup.quiet_tensorflow_logs(environ, False) == "0"
  assert environ == {LEVEL: "0"}


@pytest.mark.parametrize("strategy, tpu, environ, gpu, kind", [
    ("cpu", "", {}, True, "cpu"),
    ("gpu", "", {}, False, "gpu"),
    ("auto", "local", {"TF_CONFIG": "{}"}, True, "tpu"),
    ("auto", "", {"TF_CONFIG": "{}"}, True, "multi_worker"),
    ("auto", "", {}, True, "gpu"),
    ("auto", "", {}, False, "cpu"),
    ("auto", "", {"CUDA_VISIBLE_DEVICES": ""}, True, "cpu"),
    ("auto", "", {"CUDA_VISIBLE_DEVICES": "-1"}, True, "cpu"),
])
def test_startup_kind_resolves_as_the_strategy_will(strategy, tpu, environ,
                                                    gpu, kind, tmp_path):
  device = tmp_path / "nvidia0"
  if gpu:
    device.touch()
  assert process_setup.startup_kind(strategy, tpu, environ,
                                    [str(device)]) == kind


@pytest.mark.parametrize("kind, applies", [
    ("cpu", True), ("gpu", False), ("tpu", False), ("multi_worker", False)])
def test_cpu_tunings_apply_only_where_the_model_runs_on_cpu(kind, applies):
  assert process_setup.cpu_tunings_apply(kind) == applies




@pytest.mark.parametrize("flag, environ, engine", [
    ("auto", {}, "tensorflow"),
    ("auto", {"KERAS_BACKEND": "jax"}, "jax"),
    ("jax", {"KERAS_BACKEND": "tensorflow"}, "jax"),
    ("tensorflow", {}, "tensorflow"),
])
def test_the_engine_is_the_flag_else_keras_backend_else_tensorflow(
    flag, environ, engine, monkeypatch):
  # This process's Keras runs on TensorFlow: a JAX choice is made as a
  # fresh process would make it, before Keras loads.
  monkeypatch.delitem(sys.modules, "keras", raising=False)
  assert process_setup.choose_backend(flag, environ,
                                      lambda name: True) == engine
  assert environ["KERAS_BACKEND"] == engine


@pytest.mark.parametrize("engine, says", [
    ("jax", "requirements/test-jax.txt beside cpu.txt, gpu-jax.txt or "
            "tpu-vm-jax.txt (docs/jax.md)"),
    ("tensorflow", "requirements/cpu.txt, gpu-tensorflow.txt"),
])
def test_an_engine_not_installed_is_named_with_its_install_sets(engine,
                                                                 says):
  """One line before anything loads (seen: make demo-jax in a .venv
  without JAX ended in Keras's ModuleNotFoundError)."""
  environ = {}
  with pytest.raises(process_setup.ConfigError) as raised:
    process_setup.choose_backend(engine, environ, lambda name: False)
  assert str(raised.value).startswith(
      f"--backend={engine}: {engine} is not installed in this environment "
      "(Python 3.")
  assert says in str(raised.value)
  assert "KERAS_BACKEND" not in environ


def test_installed_finds_a_module_without_importing_it():
  assert process_setup.installed("tensorflow")
  assert not process_setup.installed("no_such_engine_here")
  assert "no_such_engine_here" not in sys.modules


def test_an_engine_other_than_tensorflow_or_jax_is_named():
  with pytest.raises(process_setup.ConfigError,
                     match="KERAS_BACKEND='torch': resnet_tpu runs on"):
    process_setup.choose_backend("auto", {"KERAS_BACKEND": "torch"})


def test_an_engine_chosen_after_keras_loaded_on_another_is_refused():
  import keras  # noqa: F401  (loaded, on TensorFlow)
  with pytest.raises(process_setup.ConfigError,
                     match="Keras already loaded on tensorflow"):
    process_setup.choose_backend("jax", {})


def test_jax_on_cpu_gets_the_replicas_as_virtual_devices():
  environ = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
  assert process_setup.jax_platform("cpu", 4, environ) == (
      "4 virtual CPU device(s)")
  assert environ == {
      "JAX_PLATFORMS": "cpu",
      "XLA_FLAGS": "--xla_dump_to=/tmp/x "
                   "--xla_force_host_platform_device_count=4"}
  untouched = {}
  process_setup.jax_platform("tpu", 4, untouched)
  assert not untouched


@pytest.mark.parametrize("backend, kind", [
    ("tensorflow", "multi_worker"), ("auto", "multi_worker"),
    ("jax", "auto")])
def test_the_start_up_kind_is_tensorflows_resolved_and_jaxs_as_given(
    backend, kind, monkeypatch):
  monkeypatch.setenv("TF_CONFIG", "{}")
  dist = config_lib.TrainConfig.tiny(
      "m", strategy="auto", backend=backend).distribution
  assert process_setup.strategy_kind(dist) == kind
