"""One way to run every script: `python -m tools.NAME` / `python -m
lab.NAME` / `python -m data.NAME` from the repository root (main.py: `python main.py`), written the
same way in every docstring, usage line and Makefile recipe."""
import ast
import glob
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT_DIRS = ("tools", "lab", "lab/dev", "data")
CHECKED = ("README.md", "Makefile", "colab_demo.ipynb", "*.py", "docs/*.md",
           "flags/*.cfg",
           "resnet_tpu/*.py", "resnet_tpu/*/*.py", "tools/*.py", "lab/*.py",
           "lab/dev/*.py", "data/*.py", "tests/*.py", "tests/lab/*.py")


def _module(path: str) -> str:
  return os.path.relpath(path, ROOT)[:-len(".py")].replace(os.sep, ".")


def _scripts() -> list[str]:
  paths = []
  for folder in SCRIPT_DIRS:
    for path in sorted(glob.glob(os.path.join(ROOT, folder, "*.py"))):
      with open(path) as f:
        if 'if __name__ == "__main__":' in f.read():
          paths.append(path)
  return paths


def test_every_script_docstring_shows_its_python_m_command():
  scripts = _scripts()
  assert len(scripts) >= 15
  for path in scripts:
    with open(path) as f:
      docstring = ast.get_docstring(ast.parse(f.read())) or ""
    assert f"python -m {_module(path)}" in docstring, path


def test_no_text_runs_a_script_by_its_path():
  # A script run by its file path: `python` then the path in prose, the
  # quoted path as an argument in code.
  direct = re.compile(r"python3? +(?:tools|lab|data)/\w|"
                      r"[\"'](?:tools|lab|data)/[\w/]+\.py[\"']")
  for pattern in CHECKED:
    for path in glob.glob(os.path.join(ROOT, pattern)):
      with open(path) as f:
        for number, line in enumerate(f, 1):
          assert not direct.search(line), f"{path}:{number}: {line.strip()}"
  with open(os.path.join(ROOT, "Makefile")) as f:
    recipes = [line for line in f if line.startswith("\t")]
  assert not any(re.search(r"\$\(PY\) +(?:tools|lab|data)/", r)
                 for r in recipes)


def test_every_python_m_module_named_exists():
  named = {}
  for pattern in CHECKED:
    for path in glob.glob(os.path.join(ROOT, pattern)):
      with open(path) as f:
        for module in re.findall(r"-m ((?:tools|lab|tests|data)(?:\.\w+)+)",
                                 f.read()):
          named.setdefault(module, path)
  assert "lab.bench_train" in named  # from the Makefile
  for module, path in named.items():
    if module.endswith(".NAME"):
      continue
    base = os.path.join(ROOT, *module.split("."))
    # A package is named before `.<name>` in prose.
    assert (os.path.exists(base + ".py") or
            os.path.exists(os.path.join(base, "__init__.py"))), (
                f"{path} names {module}")


BOOTSTRAP = "if not __package__:  # run as a file"
PROJECT_IMPORT = re.compile(r"^(?:from|import) (?:resnet_tpu|data|tools|lab)\b",
                            re.M)


def test_every_data_and_tools_script_also_runs_as_a_file():
  """tensorflow/tpu's users run its scripts by their file path: ours put
  the repository's root on the path before importing it."""
  checked = 0
  for path in _scripts():
    if os.path.basename(os.path.dirname(path)) not in ("data", "tools"):
      continue
    with open(path) as f:
      text = f.read()
    first = PROJECT_IMPORT.search(text)
    if first:
      checked += 1
      assert -1 < text.find(BOOTSTRAP) < first.start(), path
  assert checked >= 8


@pytest.mark.parametrize("folder,script", [("data", "build_tfrecords.py"),
                                           ("tools", "predict.py")])
def test_a_script_run_as_a_file_from_elsewhere_shows_its_help(tmp_path,
                                                              folder, script):
  done = subprocess.run([sys.executable, os.path.join(ROOT, folder, script),
                         "--help"], cwd=tmp_path, capture_output=True,
                        text=True, timeout=120,
                        env={k: v for k, v in os.environ.items()
                             if k != "PYTHONPATH"})
  # absl's --help prints the usage and exits 1.
  assert "Try --helpfull" in done.stdout, done.stderr[-2000:]
  assert "ModuleNotFoundError" not in done.stderr
