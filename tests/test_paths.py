"""Every path a user gives (data, model_dir, export, metrics) is read and
written through tf.io.gfile, so gs:// and other TensorFlow filesystems work
wherever a local path does: directly, or through files.py, which falls
back on Python's own calls only where TensorFlow is not installed (a JAX
run on a local model_dir: tests/test_files.py)."""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Code that opens user paths: the library, the data tools, and the tools
# that take a --model_dir, --saved_model or --data_dir.
MODEL_TOOLS = ("evaluate", "export_savedmodel", "plot_metrics")
CHECKED = ("resnet_tpu/*.py", "resnet_tpu/*/*.py", "data/*.py",
           *(os.path.join("tools", f"{name}.py") for name in MODEL_TOOLS))
# Host facts read from local system files, never user paths.
HOST_FILES = ("resnet_tpu/runtime/cpu_kernels.py",
              "resnet_tpu/runtime/process_setup.py",
              "resnet_tpu/runtime/tpu_runtime.py")
# The one place Python's file calls stand in for tf.io.gfile.
WITHOUT_TENSORFLOW = "resnet_tpu/files.py"
LOCAL_ONLY = {("", "open"), ("os", "listdir"), ("os", "remove"),
              ("os", "makedirs"), ("os", "walk"), ("os", "rename"),
              ("os.path", "exists"), ("os.path", "isdir"),
              ("os.path", "isfile"), ("os.path", "getsize"),
              ("glob", "glob"), ("shutil", "copy"), ("shutil", "rmtree")}


def _calls(tree: ast.AST) -> list[tuple[str, str, int]]:
  found = []
  for node in ast.walk(tree):
    if not isinstance(node, ast.Call):
      continue
    func = node.func
    if isinstance(func, ast.Name):
      found.append(("", func.id, node.lineno))
    elif isinstance(func, ast.Attribute):
      found.append((ast.unparse(func.value), func.attr, node.lineno))
  return found


def test_user_paths_go_through_tf_io_gfile():
  paths = [p for pattern in CHECKED for p in glob.glob(os.path.join(ROOT,
                                                                    pattern))]
  assert len(paths) > 30
  offenders = []
  for path in paths:
    name = os.path.relpath(path, ROOT)
    if name in HOST_FILES or name == WITHOUT_TENSORFLOW:
      continue
    with open(path) as f:
      tree = ast.parse(f.read())
    offenders += [f"{name}:{line} {owner + '.' if owner else ''}{call}"
                  for owner, call, line in _calls(tree)
                  if (owner, call) in LOCAL_ONLY]
  assert not offenders, offenders
