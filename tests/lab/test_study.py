"""lab/study.py --smoke runs every study end to end, so the tool cannot rot.

The data are a made-up Fashion-MNIST in the package's own idx format (300
training and 150 test images of a bar whose row is the class), so the test
needs neither the Debian package nor a download, and goes through the same
path as `make study`: idx files -> class-folder JPEGs ->
data/build_tfrecords.py -> resnet_tpu.run.run -> eval of every test image.
No accuracy is asserted: results live in bench_results/studies.
"""
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lab import study_data

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
STUDIES = ("a_distributed_bn", "b_large_batch", "c_batch_size_control")
NUM_TEST = 100  # the smoke scale's test images (study_plan.SMOKE)


def write_idx(path: str, array: np.ndarray) -> None:
  header = bytes([0, 0, 8, array.ndim]) + b"".join(
      int(d).to_bytes(4, "big") for d in array.shape)
  with gzip.open(path, "wb") as f:
    f.write(header + array.astype(np.uint8).tobytes())


def fake_fashion_mnist(folder) -> None:
  rng = np.random.default_rng(0)
  for split, count in (("train", 300), ("t10k", 150)):
    labels = rng.integers(0, 10, count)
    images = rng.normal(20, 10, (count, 28, 28))
    for image, label in zip(images, labels):
      image[2 * label:2 * label + 8, 4:24] = 200
    write_idx(str(folder / f"{split}-images-idx3-ubyte.gz"),
              np.clip(images, 0, 255))
    write_idx(str(folder / f"{split}-labels-idx1-ubyte.gz"), labels)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  root = tmp_path_factory.mktemp("study")
  (root / "idx").mkdir()
  fake_fashion_mnist(root / "idx")
  result = subprocess.run(
      [sys.executable, "-m", "lab.study", "--smoke",
       f"--fashion_mnist_dir={root / 'idx'}", f"--cache_dir={root / 'cache'}",
       f"--work_dir={root / 'work'}", f"--output_dir={root / 'out'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return root


def test_read_idx_reads_the_shape_and_bytes_of_an_idx_file(tmp_path):
  array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
  write_idx(str(tmp_path / "x.gz"), array)
  np.testing.assert_array_equal(study_data.read_idx(str(tmp_path / "x.gz")),
                                array)


@pytest.mark.parametrize("name", STUDIES)
def test_smoke_study_writes_its_table_json_and_plot(smoke, name):
  out = smoke / "out"
  for ext in (".md", ".json", ".png"):
    assert (out / (name + ext)).stat().st_size > 0, name + ext
  with open(out / (name + ".md")) as f:
    assert "| point | seeds | test top-1 % (mean) |" in f.read()


@pytest.mark.parametrize("name", STUDIES)
def test_every_run_is_recorded_with_its_config_and_every_test_image(smoke,
                                                                    name):
  with open(smoke / "out" / (name + ".json")) as f:
    study = json.load(f)
  assert study["runs"] and study["points"]
  for run in study["runs"]:
    assert run["test_examples"] == NUM_TEST
    assert run["settings"]["num_eval_images"] == NUM_TEST
    assert "model_dir" not in run["settings"]
  assert "Fashion-MNIST" in study["setting"]


def test_the_smoke_reads_jpegs_built_from_the_idx_files(smoke):
  folders = smoke / "cache" / "images_200_100"
  counts = {split: sum(len(files) for _, _, files in os.walk(folders / split))
            for split in ("train", "validation")}
  assert counts == {"train": 200, "validation": NUM_TEST}
  assert sorted(os.listdir(folders / "train")) == list(
      study_data.FASHION_MNIST_CLASSES)
