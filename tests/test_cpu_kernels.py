"""oneDNN's CPU kernels where the model runs on CPU devices, chosen by the
entry points before TensorFlow loads, never on import; the user's
TF_ENABLE_ONEDNN_OPTS wins (resnet_tpu/runtime/process_setup.py,
cpu_kernels.py)."""
import os
import subprocess
import sys

import pytest

from resnet_tpu.runtime import cpu_kernels
from resnet_tpu.runtime import process_setup

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ONEDNN = cpu_kernels.ONEDNN_ENV


def _python(code: str, *args: str, **env: str) -> str:
  """Last stdout line of `code` in a fresh interpreter, without the two
  variables conftest.py sets, plus `env`."""
  clean = {k: v for k, v in os.environ.items()
           if k not in (ONEDNN, process_setup.LOG_LEVEL_ENV)}
  done = subprocess.run([sys.executable, "-c", code, *args], cwd=ROOT,
                        env={**clean, **env}, capture_output=True, text=True,
                        timeout=180)
  assert done.returncode == 0, done.stderr[-3000:]
  return done.stdout.splitlines()[-1]


# The modules that import JAX, left out: this process runs Keras on
# TensorFlow (and the TPU build's environment has no JAX); tests_jax
# imports them on JAX. Every module of a jax/ folder (.importlinter's
# jax_folders contract), whatever is added.
JAX_FOLDER = "jax"
# The two variables after importing TensorFlow alone: where JAX is
# installed beside it (make test's .venv), TensorFlow's tflite utilities
# import jax, whose jaxlib sets TF_CPP_MIN_LOG_LEVEL to 1 if unset.
IMPORT_TENSORFLOW = f"""
import os
import tensorflow
print(os.environ.get("{ONEDNN}"), os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
"""
# Imports every module of the package, then prints the two variables.
IMPORT_ALL = f"""
import importlib, os, pkgutil
import resnet_tpu
for module in pkgutil.walk_packages(resnet_tpu.__path__, "resnet_tpu."):
  if {JAX_FOLDER!r} not in module.name.split("."):
    importlib.import_module(module.name)
print(os.environ.get("{ONEDNN}"), os.environ.get("TF_CPP_MIN_LOG_LEVEL"))
"""


def test_importing_resnet_tpu_chooses_neither_kernels_nor_logs():
  """Nothing beyond what importing TensorFlow itself sets."""
  tensorflow_alone = _python(IMPORT_TENSORFLOW)
  assert tensorflow_alone.startswith("None ")
  assert _python(IMPORT_ALL) == tensorflow_alone


@pytest.mark.parametrize("choice, kind, value", [
    ("auto", "cpu", "1"),
    ("auto", "gpu", None),  # TensorFlow's default where never measured
    ("auto", "tpu", None),
    ("auto", "multi_worker", None),
    ("on", "gpu", "1"),
    ("off", "cpu", "0"),
])
def test_auto_turns_onednn_on_for_cpu_runs_only(choice, kind, value):
  assert process_setup.onednn_value(choice, kind) == value


def test_the_users_variable_wins():
  environ = {ONEDNN: "0"}
  said = process_setup.apply_cpu_kernel_choice("on", "cpu", environ)
  assert environ == {ONEDNN: "0"}
  assert "set by the user" in said


# Imports main.py, parses argv, runs its set-up, then prints the variable and
# whether TensorFlow was loaded before and after the set-up.
MAIN_SET_UP = f"""
import os, sys
import main
before = "tensorflow" in sys.modules
main.FLAGS(["main.py", "--model_dir=unused", *sys.argv[1:]])
main.set_up_process()
print(os.environ.get("{ONEDNN}"), before, "tensorflow" in sys.modules)
"""


@pytest.mark.parametrize("args, env, value", [
    (["--strategy=cpu"], {}, "1"),
    (["--flagfile=flags/cpu_demo.cfg"], {}, "1"),  # --strategy=cpu inside
    (["--strategy=auto"], {"CUDA_VISIBLE_DEVICES": ""}, "1"),
    (["--strategy=gpu"], {}, "None"),
    (["--tpu=local"], {}, "None"),
    ([], {"TF_CONFIG": "{}"}, "None"),  # multi_worker
    (["--strategy=gpu", "--cpu_onednn=on"], {}, "1"),
    (["--strategy=cpu", "--cpu_onednn=off"], {}, "0"),
    (["--strategy=cpu"], {ONEDNN: "0"}, "0"),  # the user's variable wins
])
def test_main_chooses_the_kernels_from_its_flags_before_tensorflow_loads(
    args, env, value):
  assert _python(MAIN_SET_UP, *args, **env) == f"{value} False False"


ENV_AFTER = f"import os, sys\n{{}}\nprint(os.environ.get('{ONEDNN}'))"


def test_only_the_cpu_benchmarks_choose_onednn():
  any_host = ("import tools.export_savedmodel, tools.evaluate, "
              "tools.plot_metrics")
  assert _python(ENV_AFTER.format(any_host)) == "None"
  assert _python(ENV_AFTER.format("import lab.bench_train")) == "1"


def test_tests_run_the_kernels_a_cpu_run_gets():
  # conftest.py chose them before TensorFlow loaded (unless you set them).
  assert cpu_kernels.onednn_enabled() == (os.environ[ONEDNN] == "1")
