"""Runs main.py as on a machine where TensorFlow is not installed (the
H200's image: JAX alone): `python without_tensorflow.py FLAGS...`.

Every finder of the import system is wrapped so that it finds no
tensorflow module: importlib.util.find_spec("tensorflow") is None and
`import tensorflow` raises ModuleNotFoundError, as where it is absent (a
None in sys.modules would not do: Keras takes a name there for a loaded
module)."""
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WithoutTensorFlow:
  """A finder that finds what `finder` finds, TensorFlow's modules
  excepted."""

  def __init__(self, finder):
    self._finder = finder

  def find_spec(self, name, path=None, target=None):
    if name.partition(".")[0] == "tensorflow":
      return None
    return self._finder.find_spec(name, path, target)

  def __getattr__(self, name):
    return getattr(self._finder, name)


if __name__ == "__main__":
  sys.meta_path[:] = [WithoutTensorFlow(f) for f in sys.meta_path]
  sys.path.insert(0, ROOT)
  sys.argv = [os.path.join(ROOT, "main.py"), *sys.argv[1:]]
  runpy.run_path(sys.argv[0], run_name="__main__")
