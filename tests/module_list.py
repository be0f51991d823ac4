"""Prints docs/layout.md's table: each top-level module and package, its lines,
its purpose.

  python -m tests.module_list

The purpose is the first line of the module's docstring (a package's: of its
__init__.py); a package's lines are those of all its modules. One row per
subpackage of resnet_tpu, one per other folder. tests/test_readme.py checks
that docs/layout.md contains exactly this table, so the layout cannot
drift from the tree.
"""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# resnet_tpu's modules and subpackages, in the order data flows through
# them, then the other source folders.
ENTRIES = ("main.py", "resnet_tpu/clock.py", "resnet_tpu/files.py",
           "resnet_tpu/config/", "resnet_tpu/flags.py", "resnet_tpu/runtime/",
           "resnet_tpu/parallel/", "resnet_tpu/inputs/", "resnet_tpu/model/",
           "resnet_tpu/optim/", "resnet_tpu/train/",
           "resnet_tpu/engines/tensorflow/", "resnet_tpu/engines/jax/",
           "resnet_tpu/data_checks.py", "resnet_tpu/preflight.py",
           "resnet_tpu/export.py", "resnet_tpu/warm_start.py",
           "resnet_tpu/run.py", "data/", "tools/",
           "lab/")


def source_files(root: str = ROOT) -> list[str]:
  """Every .py file of the package and the folders, relative paths."""
  files = []
  for folder in ("resnet_tpu", "data", "tools", "lab"):
    files += [os.path.relpath(p, root) for p in glob.glob(
        os.path.join(root, folder, "**", "*.py"), recursive=True)]
  return ["main.py"] + sorted(files)


def _lines(path: str) -> int:
  with open(path) as f:
    return sum(1 for _ in f)


def purpose(path: str) -> str:
  """The first line of the module docstring of `path`."""
  with open(path) as f:
    docstring = ast.get_docstring(ast.parse(f.read())) or ""
  return docstring.split("\n", 1)[0].strip()


def module_table(root: str = ROOT) -> str:
  lines = ["| module or package | lines | purpose |", "|---|---:|---|"]
  files = source_files(root)
  for entry in ENTRIES:
    members = [f for f in files if f == entry or (
        entry.endswith("/") and f.startswith(entry))]
    count = sum(_lines(os.path.join(root, f)) for f in members)
    doc = os.path.join(root, entry, "__init__.py") if entry.endswith(
        "/") else os.path.join(root, entry)
    lines.append(f"| `{entry}` | {count} | {purpose(doc)} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(module_table(), end="")
