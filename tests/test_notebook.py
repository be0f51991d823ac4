"""colab_demo.ipynb runs top to bottom on CPU with its tiny settings."""
import glob
import json
import os
import shutil
import subprocess

import nbclient
import nbformat
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "colab_demo.ipynb")


def test_notebook_trains_exports_evaluates_and_classifies_on_cpu(
    tmp_path, monkeypatch):
  # The kernel inherits this environment: tiny settings, a scratch folder,
  # no TPU, and the repository root as working directory.
  monkeypatch.setenv("RESNET_TPU_NOTEBOOK_TINY", "1")
  monkeypatch.setenv("RESNET_TPU_NOTEBOOK_DIR", str(tmp_path))
  monkeypatch.delenv("COLAB_TPU_ADDR", raising=False)
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  nbclient.NotebookClient(
      notebook, timeout=300, kernel_name="python3",
      resources={"metadata": {"path": REPO}}).execute()

  result = json.loads((tmp_path / "demo_result.json").read_text())
  saved_model, in_training = (result["saved_model_eval"],
                              result["in_training_eval"])
  assert saved_model["examples"] == in_training["examples"] == 12
  assert saved_model["top1"] == in_training["top1"]
  assert len(result["top5"]) == 4  # min(5, classes) of the 4 classes
  assert (tmp_path / "model" / "metrics.png").stat().st_size > 0
  assert (tmp_path / "model" / "export" / "saved_model.pb").exists()
  outputs = "".join(o.get("text", "") for cell in notebook.cells
                    if cell.cell_type == "code" for o in cell.outputs)
  assert "Requirements: nothing to install (requirements/cpu.txt)." in outputs
  assert "No TPU: training on CPU replicas" in outputs


def _install_cell() -> str:
  notebook = nbformat.read(NOTEBOOK, as_version=4)
  return next(c.source for c in notebook.cells if c.cell_type == "code"
              and "def colab_tpu()" in c.source)


def _python(version: str) -> str | None:
  """A CPython `version` interpreter (pyenv's included), or None."""
  root = os.path.expanduser("~/.pyenv/versions")
  for path in sorted(glob.glob(os.path.join(root, f"{version}.*", "bin",
                                            "python3"))) + [
                                                shutil.which(f"python{version}")]:
    if path and subprocess.run([path, "-c", ""],
                               capture_output=True).returncode == 0:
      return path
  return None


@pytest.mark.parametrize("version,stops", [("3.13", True), ("3.12", False)])
def test_the_tpu_install_cell_checks_the_python_before_installing(
    version, stops):
  """On a TPU runtime of Colab's default Python 3.13 the cell stops with
  what to pick instead; on 3.12 it goes on (here: nothing to install)."""
  python = _python(version)
  if python is None:
    pytest.skip(f"no Python {version} on this machine")
  env = dict(os.environ, COLAB_TPU_ADDR="10.0.0.2:8470",
             RESNET_TPU_SKIP_INSTALL="1")
  done = subprocess.run([python, "-c", _install_cell()], cwd=REPO, env=env,
                        capture_output=True, text=True, timeout=60)
  if stops:
    assert done.returncode == 1
    assert "tensorflow-tpu 2.19.1 needs 3.10-3.12" in done.stderr
    assert "Python 3.12" in done.stderr and "Installing" not in done.stdout
  else:
    assert done.returncode == 0, done.stderr
    assert "nothing to install (requirements/tpu-vm-tensorflow.txt)" in done.stdout
