"""A function of resnet_tpu run in a TensorFlow engine process.

Keras chooses its engine once per process, so a JAX run reads a TensorFlow
checkpoint (--init_checkpoint: warm_start.write_weights) and writes its
SavedModel (export.export_saved_model) in a child process on TensorFlow,
which gives the export the TensorFlow path's signatures exactly.
"""
import os
import subprocess
import sys

# The package's parent: where a child process finds resnet_tpu.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def in_tensorflow(call: str, *args: str) -> int:
  """Runs resnet_tpu's `call` (module.function) with `args` in a TensorFlow
  engine process; returns its exit code, its errors logged above."""
  module = call.split(".")[0]
  code = ("import sys; from absl import logging; "
          "logging.set_verbosity(logging.INFO); "
          f"from resnet_tpu import {module}; {call}(*sys.argv[1:])")
  env = {**os.environ, "KERAS_BACKEND": "tensorflow",
         "PYTHONPATH": os.pathsep.join(
             filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
  env.pop("XLA_FLAGS", None)
  return subprocess.run([sys.executable, "-c", code, *args], env=env,
                        check=False).returncode
