"""colab_demo.ipynb runs top to bottom on CPU with its tiny settings."""
import json
import os

import nbclient
import nbformat

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
  assert "Requirements: nothing to install (requirements.txt)." in outputs
  assert "No TPU: training on CPU replicas" in outputs
