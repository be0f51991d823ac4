"""Prints the README's module list: every source file, its lines, its purpose.

  python -m tests.module_list

The purpose is the first line of the module's docstring. tests/test_readme.py
checks that README.md contains exactly this table, so the layout section
cannot drift from the tree.
"""
import ast
import glob
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The product's source folders, in the order data flows through them.
FOLDERS = ("resnet_tpu", "resnet_tpu/*", "data", "tools", "lab")


def source_files(root: str = ROOT) -> list[str]:
  """main.py and the modules of FOLDERS (no __init__.py), relative paths."""
  files = ["main.py"]
  for folder in FOLDERS:
    files += sorted(os.path.relpath(p, root) for p in
                    glob.glob(os.path.join(root, folder, "*.py"))
                    if not p.endswith("__init__.py"))
  return files


def purpose(path: str) -> str:
  """The first line of the module docstring of `path`."""
  with open(path) as f:
    docstring = ast.get_docstring(ast.parse(f.read())) or ""
  return docstring.split("\n", 1)[0].strip()


def module_table(root: str = ROOT) -> str:
  lines = ["| file | lines | purpose |", "|---|---:|---|"]
  for name in source_files(root):
    path = os.path.join(root, name)
    with open(path) as f:
      count = sum(1 for _ in f)
    lines.append(f"| `{name}` | {count} | {purpose(path)} |")
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  print(module_table(), end="")
