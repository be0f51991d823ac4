"""resnet_tpu/runtime/tpu_runtime.py: the TPU runtime chosen from what the host
shows, before TensorFlow loads, on hosts faked for each generation."""
import os
import subprocess
import sys

import pytest

from resnet_tpu.runtime import tpu_runtime
from resnet_tpu.config import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = "/site-packages/libtpu/libtpu.so"
PJRT_VARIABLES = ("PJRT_DEVICE", "NEXT_PLUGGABLE_DEVICE_USE_C_API",
                  "TF_PLUGGABLE_DEVICE_LIBRARY_PATH")


def _host(tmp_path, vfio: int = 0, accel: int = 0) -> str:
  """A /dev with `vfio` chips under vfio/ and `accel` /dev/accelN files."""
  dev = tmp_path / "dev"
  (dev / "vfio").mkdir(parents=True)
  (dev / "vfio" / "vfio").touch()  # the container file every host has
  for i in range(vfio):
    (dev / "vfio" / str(i)).touch()
  for i in range(accel):
    (dev / f"accel{i}").touch()
  return str(dev)


@pytest.mark.parametrize("accelerator_type,generation,runtime", [
    ("v2-8", "v2", "stream_executor"), ("v3-32", "v3", "stream_executor"),
    ("v4-8", "v4", "stream_executor"), ("v5litepod-8", "v5e", "pjrt"),
    ("v5p-8", "v5p", "pjrt"), ("v6e-8", "v6e", "pjrt")])
def test_the_accelerator_type_decides_the_runtime(tmp_path, accelerator_type,
                                                  generation, runtime):
  # The device files say otherwise: the named type wins.
  dev = _host(tmp_path, accel=4) if runtime == "pjrt" else _host(
      tmp_path, vfio=4)
  choice = tpu_runtime.choose(
      "auto", {"TPU_ACCELERATOR_TYPE": accelerator_type}, dev)
  assert (choice.generation, choice.runtime) == (generation, runtime)


@pytest.mark.parametrize("vfio,accel,runtime", [
    (8, 0, "pjrt"), (4, 0, "pjrt"), (0, 4, "stream_executor"),
    (0, 0, "stream_executor")])
def test_without_an_accelerator_type_the_chips_device_files_decide(
    tmp_path, vfio, accel, runtime):
  choice = tpu_runtime.choose("auto", {}, _host(tmp_path, vfio, accel))
  assert choice.runtime == runtime
  if not vfio and not accel:
    assert choice.generation is None and "no chip" in choice.reason


def test_the_flag_overrides_what_the_host_shows(tmp_path):
  dev = _host(tmp_path, vfio=8)
  choice = tpu_runtime.choose("stream_executor",
                              {"TPU_ACCELERATOR_TYPE": "v6e-8"}, dev)
  assert choice.runtime == "stream_executor"
  assert choice.reason == "--tpu_runtime=stream_executor"


def test_tpu7x_is_refused_with_the_reason(tmp_path):
  with pytest.raises(ConfigError, match="TPU7x .* has no TensorFlow"):
    tpu_runtime.choose("auto", {"TPU_ACCELERATOR_TYPE": "tpu7x-8"},
                       _host(tmp_path))


def test_pjrt_sets_its_three_variables_and_the_users_own_win(tmp_path):
  dev = _host(tmp_path, vfio=8)
  environ = {}
  said = tpu_runtime.apply("auto", "tpu", environ, dev, LIBRARY)
  assert environ == {"PJRT_DEVICE": "TPU",
                     "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
                     "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": LIBRARY}
  assert said.startswith("TPU runtime pjrt for v5e/v5p/v6e (8 chip(s)")
  mine = {"TF_PLUGGABLE_DEVICE_LIBRARY_PATH": "/opt/libtpu.so",
          "PJRT_DEVICE": "CPU"}
  said = tpu_runtime.apply("auto", "tpu", mine, dev, LIBRARY)
  assert mine["TF_PLUGGABLE_DEVICE_LIBRARY_PATH"] == "/opt/libtpu.so"
  assert mine["PJRT_DEVICE"] == "CPU"
  assert said.endswith("(PJRT_DEVICE set by the user)")
  assert set(PJRT_VARIABLES) <= set(mine)


def test_pjrt_without_libtpu_names_the_requirements_file(tmp_path,
                                                          monkeypatch):
  monkeypatch.setattr(tpu_runtime, "libtpu_path", lambda: None)
  with pytest.raises(ConfigError, match="pip install -r requirements/tpu-vm-tensorflow.txt"):
    tpu_runtime.apply("auto", "tpu", {}, _host(tmp_path, vfio=8))


def test_libtpu_is_found_where_it_is_installed():
  path = tpu_runtime.libtpu_path()
  try:
    import libtpu  # pylint: disable=g-import-not-at-top
  except ImportError:
    assert path is None
  else:
    assert path == libtpu.get_library_path()


def test_stream_executor_and_non_tpu_runs_set_nothing(tmp_path):
  for kind, dev in (("tpu", _host(tmp_path, accel=4)),
                    ("cpu", _host(tmp_path / "x", vfio=8))):
    environ = {}
    tpu_runtime.apply("auto", kind, environ, dev)
    assert environ == {}


# What main.py's start-up leaves in the environment TensorFlow then reads:
# the choice runs in a fresh process, before TensorFlow loads.
CHILD = """
import os, sys
from resnet_tpu.runtime import tpu_runtime
print(tpu_runtime.apply("auto", "tpu", os.environ, sys.argv[1], sys.argv[2]))
print("tensorflow loaded:", "tensorflow" in sys.modules)
print(",".join(k for k in %r if k in os.environ))
""" % (PJRT_VARIABLES,)


@pytest.mark.parametrize("accelerator_type,vfio,accel,pjrt", [
    ("v5litepod-8", 8, 0, True), ("v6e-8", 8, 0, True),
    ("v5p-8", 4, 0, True), ("v4-8", 0, 4, False), ("", 8, 0, True),
    ("", 0, 4, False)])
def test_a_fresh_process_on_each_generations_host_sets_its_runtime(
    tmp_path, accelerator_type, vfio, accel, pjrt):
  env = {k: v for k, v in os.environ.items()
         if k not in PJRT_VARIABLES and k != "TPU_ACCELERATOR_TYPE"}
  if accelerator_type:
    env["TPU_ACCELERATOR_TYPE"] = accelerator_type
  done = subprocess.run(
      [sys.executable, "-c", CHILD, _host(tmp_path, vfio, accel), LIBRARY],
      cwd=ROOT,
      env=env, capture_output=True, text=True, timeout=60, check=True)
  said, loaded, variables = done.stdout.splitlines()
  assert loaded == "tensorflow loaded: False"
  assert said.startswith(f"TPU runtime {'pjrt' if pjrt else 'stream_executor'}")
  assert variables == (",".join(PJRT_VARIABLES) if pjrt else "")
