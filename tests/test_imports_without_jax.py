"""Where JAX is not installed (TensorFlow's install sets for a TPU VM and a
GPU host, and make test-tpu-build's), every module outside the jax/
folders imports, and none of them loads JAX: the mirror of
tests_jax/test_imports.py. .venv has JAX beside TensorFlow, so the probe
blocks its import."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import importlib, pkgutil, sys

class NoJax:  # as where it is not installed
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in ("jax", "jaxlib"):
      raise ModuleNotFoundError(f"No module named {name!r}")

sys.meta_path.insert(0, NoJax())
import main
import resnet_tpu
names = [m.name for m in pkgutil.walk_packages(resnet_tpu.__path__,
                                               "resnet_tpu.")
         if "jax" not in m.name.split(".")]
for name in names:
  importlib.import_module(name)
print(len(names), " ".join(sorted(sys.modules)))
"""


def test_every_module_outside_the_jax_folders_imports_without_jax():
  env = dict(os.environ, KERAS_BACKEND="tensorflow", PYTHONPATH=ROOT)
  done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  count, *loaded = done.stdout.splitlines()[-1].split()
  assert int(count) > 50  # the walk found the package's modules
  assert "resnet_tpu.train.loop" in loaded
  assert not [m for m in loaded if m.split(".")[0] in ("jax", "jaxlib")]
