"""resnet_tpu/cpu_kernels.py: oneDNN kernels on by default, the user decides."""
import os
import subprocess
import sys

import pytest

from resnet_tpu import cpu_kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Prints whether the TensorFlow loaded after `import resnet_tpu` runs oneDNN.
PROBE = ("import resnet_tpu, tensorflow\n"
         "from resnet_tpu import cpu_kernels\n"
         "print('onednn', cpu_kernels.onednn_enabled())")


def _probe(env_value: str | None) -> str:
  env = {k: v for k, v in os.environ.items() if k != cpu_kernels.ONEDNN_ENV}
  if env_value is not None:
    env[cpu_kernels.ONEDNN_ENV] = env_value
  done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)
  assert done.returncode == 0, done.stderr[-2000:]
  return done.stdout.split()[-1]


@pytest.mark.parametrize("env_value, expected", [
    (None, "True"),  # our default, whatever TensorFlow's is on this CPU
    ("0", "False"),  # the user's choice wins
    ("1", "True"),
])
def test_importing_resnet_tpu_first_decides_the_cpu_kernels(env_value,
                                                            expected):
  assert _probe(env_value) == expected


def test_tests_run_the_kernels_users_get():
  assert cpu_kernels.onednn_enabled() == (
      os.environ[cpu_kernels.ONEDNN_ENV] == "1")
