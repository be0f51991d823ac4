"""The JAX engine's test session: 8 virtual CPU devices and Keras on JAX,
set before JAX or Keras loads (make test-jax runs this suite in its own
process, in the .venv that holds both engines; the engine's own code
imports no TensorFlow (test_imports.py), JAX training takes tf.data and
TensorFlow's files from it (tests/test_demo_on_both_engines.py)).

`tf_reference` runs the TensorFlow side of the equivalence tests once, in
the TensorFlow environment: $TF_PYTHON, else the repository's .venv.
"""
import os
import subprocess
import sys

DEVICES = 8
os.environ["KERAS_BACKEND"] = "jax"
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                           f" --xla_force_host_platform_device_count={DEVICES}")
os.environ["JAX_PLATFORMS"] = "cpu"

import pytest  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The helpers both suites share (tests/main_runs.py: main.py as a user
# starts it; tests/damaged_shards.py).
sys.path.insert(1, os.path.join(ROOT, "tests"))
from main_runs import SESSION_JAX_CACHE  # noqa: E402
from schedule import longest_first  # noqa: E402
from session_hooks import pytest_configure  # noqa: E402,F401
from session_hooks import pytest_unconfigure  # noqa: E402,F401

TF_REFERENCE_TIMEOUT_S = 900
# The suite's longest files, longest first (tests/schedule.py): seconds
# measured on 2 cores, make test at c7fcfca: 301 (200 of them the
# TensorFlow reference), 179, 162, 115, 100, 96, 68, 37, 31, 30.
LONGEST_FILES = ("test_engines.py", "test_multi_host.py",
                 "test_jax_engine.py", "test_bench_gpu.py",
                 "test_multi_host_failure.py", "test_without_tensorflow.py",
                 "test_training.py", "test_collective_census.py",
                 "test_compilation_cache.py", "test_jax_data_faults.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
  longest_first(items, LONGEST_FILES)


@pytest.fixture(autouse=True)
def session_compilation_cache():
  """Each test's compiles go to the session's JAX compilation cache
  (session_hooks.py), where its main.py runs keep theirs: a program an
  earlier test compiled, in any of the session's processes, is loaded
  (measured: this process's engine files, 211 s alone, 182 s with it). A
  run in this process (run.run) points the cache at its own model_dir for
  the rest of the process, which may be gone by the next test: each test
  points it back first."""
  from resnet_tpu.engines.jax import startup  # pylint: disable=g-import-not-at-top
  startup.use_compilation_cache(os.environ.get(SESSION_JAX_CACHE, ""))
  yield


def tf_python() -> str:
  """The interpreter of the TensorFlow environment."""
  python = os.environ.get("TF_PYTHON") or os.path.join(ROOT, ".venv", "bin",
                                                       "python")
  if not os.path.exists(python):
    raise FileNotFoundError(
        f"the TensorFlow reference needs TensorFlow's Python: {python} does "
        "not exist (make venv, or set TF_PYTHON).")
  return python


@pytest.fixture(scope="session")
def tf_reference(tmp_path_factory) -> str:
  """The folder of tf_reference.py's .npz files ($TF_REFERENCE_DIR: one it
  already wrote, to rerun the JAX side alone while developing)."""
  if os.environ.get("TF_REFERENCE_DIR"):
    return os.environ["TF_REFERENCE_DIR"]
  out = str(tmp_path_factory.mktemp("tf_reference"))
  env = {k: v for k, v in os.environ.items()
         if k not in ("KERAS_BACKEND", "XLA_FLAGS", "JAX_PLATFORMS")}
  subprocess.run([tf_python(), os.path.join(ROOT, "tests_jax",
                                            "tf_reference.py"), out],
                 check=True, env=env, timeout=TF_REFERENCE_TIMEOUT_S,
                 stdout=sys.stderr)
  return out
