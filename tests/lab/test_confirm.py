"""The confirmatory comparison (lab/confirm_plan.py, lab/study_confirm.py):
its validation split, its shared grid and picks, and a smoke run end to
end."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from lab import confirm_plan as cp
from lab import study_data
from lab import study_plan
from lab.study_runner import Runner
from tests.lab.test_study import fake_fashion_mnist

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
STOCK, RECIPE = cp.STOCK_SIDE, cp.RECIPE_SIDE


def test_the_validation_split_is_stratified_seeded_and_after_the_training_images():
  labels = np.random.default_rng(1).integers(0, 10, 5000)
  held = study_data.validation_indices(labels, 30, seed=0, first=1000)
  assert len(held) == 300 and len(set(held)) == 300
  assert held.min() >= 1000
  assert np.bincount(labels[held], minlength=10).tolist() == [30] * 10
  again = study_data.validation_indices(labels, 30, seed=0, first=1000)
  other = study_data.validation_indices(labels, 30, seed=1, first=1000)
  assert held.tolist() == again.tolist() and held.tolist() != other.tolist()


def test_a_validation_split_too_large_for_a_class_is_refused():
  labels = np.zeros(100, int)
  with pytest.raises(ValueError, match="class 1"):
    study_data.validation_indices(labels, 5, seed=0, first=0)


def _records(means: dict) -> list[dict]:
  """Two seeds a candidate at means[(side, factor)] +- 0.01."""
  return [{"point": (("side", side), ("candidate", cp.candidate(side, f))),
           "top1": m + d, "seed": s}
          for (side, f), m in means.items()
          for s, d in ((0, -0.01), (1, 0.01))]


def test_each_side_keeps_its_best_mean_and_a_tie_the_centre():
  grid = [16.0, 32.0, 64.0]
  chosen = cp.pick(_records({
      (STOCK, 16.0): 0.85, (STOCK, 32.0): 0.85, (STOCK, 64.0): 0.80,
      (RECIPE, 16.0): 0.90, (RECIPE, 32.0): 0.85, (RECIPE, 64.0): 0.80}),
      grid)
  assert chosen[STOCK]["lr_scale"] == 32.0 and not chosen[STOCK]["at_edge"]
  assert chosen[RECIPE]["lr_scale"] == 16.0 and chosen[RECIPE]["at_edge"]
  assert chosen[RECIPE]["top1_mean"] == pytest.approx(0.90)
  # The recipe's pick sits at the low edge: both sides gain x8.
  assert cp.extension(grid, chosen) == [8.0]


def test_picks_at_both_edges_extend_the_grid_both_ways_and_inside_not():
  grid = [16.0, 32.0, 64.0]
  edges = cp.pick(_records({
      (STOCK, 16.0): 0.7, (STOCK, 32.0): 0.8, (STOCK, 64.0): 0.9,
      (RECIPE, 16.0): 0.9, (RECIPE, 32.0): 0.8, (RECIPE, 64.0): 0.7}), grid)
  assert cp.extension(grid, edges) == [8.0, 128.0]
  inside = cp.pick(_records({
      (STOCK, 16.0): 0.7, (STOCK, 32.0): 0.9, (STOCK, 64.0): 0.8,
      (RECIPE, 16.0): 0.7, (RECIPE, 32.0): 0.9, (RECIPE, 64.0): 0.8}), grid)
  assert cp.extension(grid, inside) == []


def test_both_sides_search_the_same_grid_with_the_recipe_s_built_ins(
    tmp_path):
  data = study_data.StudyData(str(tmp_path), 2560, 2000, 10, "x")
  runner = Runner(data, cp.SCALE, str(tmp_path), str(tmp_path), "cpu", "")
  settings = cp.recipe()
  runs = cp.choice_runs(runner.base, cp.SCALE, list(cp.LR_GRID), settings)
  sides = {}
  for run in runs:
    sides.setdefault(dict(run.point)["side"], []).append(run)
  assert len(sides[STOCK]) == len(sides[RECIPE]) == 2 * len(cp.LR_GRID)
  for run in runs:
    assert run.seed in cp.PICK_SEEDS
    assert run.cfg.run.total_train_steps == 9600
    assert run.cfg.input.random_flip is False
    assert run.cfg.optim.label_smoothing == 0.1
  stock = sides[STOCK][0]
  assert stock.path == "stock_keras"
  assert stock.zoom_min_area == settings["train_crop_min_area"] == 0.5
  recipe = sides[RECIPE][0]
  assert recipe.path == "project" and recipe.zoom_min_area == 1.0
  for key, value in settings.items():
    if key != "base_learning_rate":
      assert recipe.cfg.flat()[key] == value, key
  # One LR rule on both sides: 0.1 x factor per 256 images.
  for run in runs:
    factor = float(dict(run.point)["candidate"].rsplit("x", 1)[1])
    assert run.cfg.optim.base_learning_rate == pytest.approx(0.1 * factor)
    assert run.cfg.optim.learning_rate_scaling == "linear"


def test_the_check_uses_fresh_seeds_only():
  earlier = (set(study_plan.RECIPE_CHOICE_SEEDS) | set(study_plan.RECIPE_SEEDS)
             | set(study_plan.RECIPE_LONG_SEEDS)
             | set(study_plan.RECIPE_REVISED_SEEDS)
             | set(study_plan.RECIPE_CROP_SEEDS) | {2, 3, 4, 5})
  assert len(cp.CHECK_SEEDS) >= 3
  assert not earlier & set(cp.CHECK_SEEDS)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
  root = tmp_path_factory.mktemp("confirm")
  (root / "idx").mkdir()
  fake_fashion_mnist(root / "idx")
  result = subprocess.run(
      [sys.executable, "-m", "lab.study_confirm", "--smoke",
       f"--fashion_mnist_dir={root / 'idx'}", f"--cache_dir={root / 'cache'}",
       f"--work_dir={root / 'work'}", f"--output_dir={root / 'out'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert result.returncode == 0, result.stderr[-3000:]
  return root


def test_the_smoke_picks_on_validation_images_and_checks_on_test_images(
    smoke):
  with open(smoke / "out" / "confirm_choice.json") as f:
    choice = json.load(f)
  with open(smoke / "out" / "confirm.json") as f:
    check = json.load(f)
  split = choice["validation_split"]
  assert split["images"] == 10 * cp.SMOKE_PER_CLASS
  assert {r["test_examples"] for r in choice["runs"]} == {split["images"]}
  assert {r["test_examples"] for r in check["runs"]} == {100}
  assert {r["seed"] for r in choice["runs"]} == set(cp.PICK_SEEDS)
  assert {r["seed"] for r in check["runs"]} == set(cp.CHECK_SEEDS)
  assert check["fresh_seeds"] == list(cp.CHECK_SEEDS)
  spaces = check["search_spaces"]
  assert spaces[STOCK]["lr_scales"] == spaces[RECIPE]["lr_scales"]
  assert choice["rounds"][0]["grid"] == list(cp.LR_GRID)
  for side in (STOCK, RECIPE):
    factor = check["chosen"][side]["lr_scale"]
    assert factor in spaces[side]["lr_scales"]
  stock = [r for r in check["runs"] if r["path"] == "stock_keras"]
  assert {r["trained_with"]["random_zoom_min_area"] for r in stock} == {0.5}
  assert {r["trained_with"]["random_flip"] for r in stock} == {False}
  assert [v["criterion"] for v in check["verdicts"]] == [
      cp.CRITERION.name]
  assert "validation top-1 over 40 held-out" in choice["setting"]


def test_a_committed_choice_is_taken_only_from_the_plan_s_split(tmp_path):
  from absl import app
  from lab import study_confirm
  split = {"seed": 0, "per_class": 200, "images": 2000}
  path = tmp_path / "confirm_choice.json"
  chosen = {STOCK: {"lr_scale": 16.0}, RECIPE: {"lr_scale": 32.0}}
  path.write_text(json.dumps({"validation_split": split, "chosen": chosen,
                              "search_spaces": {"x": 1}}))
  assert study_confirm.read_choice(str(path), split) == (chosen, {"x": 1})
  with pytest.raises(app.UsageError, match="another validation split"):
    study_confirm.read_choice(str(path), dict(split, seed=1))
