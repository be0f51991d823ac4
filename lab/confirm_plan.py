"""The confirmatory recipe comparison (issue 51), declared before it runs.

Six earlier checks of flags/small_images.cfg against stock Keras's
`model.fit` (studies README, "History") picked on the test images and
stopped at the first "held". This one is declared whole, here, and
committed before any of its runs:

- Picks are made on a validation split of Fashion-MNIST's training photos
  (VALIDATION_PER_CLASS of each class, seeded, from the photos after the
  first VALIDATION_FIRST, which no study trains on); the test photos are
  scored only by the check, once its picks are fixed.
- Both sides search one LR grid, the same candidates: LR_GRID times
  Goyal et al.'s 0.1 per 256 images (linear scaling, warm-up, cosine).
  When a side's pick (highest mean validation top-1 on PICK_SEEDS; a tie
  keeps the nearer to the grid's centre) sits at an edge of the grid, the
  grid gains one GRID_STEP past that edge, for both sides, up to
  MAX_EXTENSIONS times.
- Stock Keras gets every choice of the recipe that Keras has built in: a
  random zoom (keras.layers.RandomZoom) keeping a square of at least the
  recipe's train_crop_min_area, the random flip off, label smoothing 0.1.
  What it lacks is the rest of the project's path: its input pipeline's
  crop placed at random (RandomZoom zooms on the centre), conv init, input
  normalisation, BN settings, its trainer.
- The check: each side at its pick on CHECK_SEEDS (fresh: seeds 0-17 were
  used before), test top-1 over the 10,000 test photos at the end of each
  run (and at 75 % for the convergence check only), under CRITERION.
  Held means the recipe beats stock Keras by more than twice the pooled
  seed spread: with 3 seeds a side and normal errors that is a one-sided
  t-test at p of about 0.035 (t > 2.45, 4 degrees of freedom).

Everything else is make study-recipe-crop's scale: the narrow ResNet-10
on 2,560 training photos, batch 8, 30 epochs (9,600 steps), warm-up 15 %.
"""
import dataclasses
import math

from resnet_tpu.config import TrainConfig
from lab import study_plan
from lab.study_verdict import Criterion

VALIDATION_PER_CLASS = 200
VALIDATION_SEED = 0
VALIDATION_FIRST = study_plan.DEFAULT.num_train  # 10,240
LR_GRID = (16.0, 32.0, 64.0)  # times 0.1 per 256 images
GRID_STEP = 2.0
MAX_EXTENSIONS = 2
PICK_SEEDS = (0, 1)
CHECK_SEEDS = (18, 19, 20)
STOCK_SIDE, RECIPE_SIDE = study_plan.STOCK_SIDE, study_plan.RECIPE_SIDE
CRITERION = Criterion(
    "flags/small_images.cfg's choices beat stock Keras with its built-in "
    "equivalents", study_plan.STOCK_POINT, study_plan.RECIPE_POINT)
# make study-recipe-crop's scale: two halvings of make study's, 30 epochs.
SCALE = study_plan.long_scale(study_plan.DEFAULT.shrunk().shrunk())
SMOKE_SCALE = study_plan.SMOKE
SMOKE_PER_CLASS = 4


def recipe() -> dict:
  """flags/small_images.cfg's RECIPE_KEYS; ValueError unless its optimizer
  is stock Keras's rule (momentum, linear scaling, cosine), the one LR_GRID
  scales on both sides."""
  found = study_plan.recipe_settings()
  rule = (found["optimizer"], found["learning_rate_scaling"],
          found["lr_schedule"])
  if rule != ("momentum", "linear", "cosine"):
    raise ValueError(f"{study_plan.RECIPE_FLAGFILE} trains with {rule}; the "
                     "confirmatory grid scales momentum, linear, cosine.")
  return found


def candidate(side: str, factor: float) -> str:
  return f"{side}, momentum x{factor:g}"


def _run(base: TrainConfig, scale: study_plan.Scale, study: str, side: str,
         factor: float, seed: int, point: tuple, settings: dict
         ) -> study_plan.Run:
  """One run at the baseline's budget: stock Keras (flip off, random zoom
  to the recipe's crop area) or the project's path with `settings`, each
  at momentum x`factor`."""
  run = study_plan._side_run(base, scale, study, seed, point, factor,
                             None if side == STOCK_SIDE else settings)
  if side != STOCK_SIDE:
    return dataclasses.replace(run, cfg=run.cfg.replace(
        base_learning_rate=0.1 * factor))
  area = settings["train_crop_min_area"]
  return dataclasses.replace(run, zoom_min_area=area, cfg=run.cfg.replace(
      random_flip=False, train_crop_min_area=area, train_crop_max_aspect=1.0,
      eval_crop_fraction=1.0))


def choice_runs(base: TrainConfig, scale: study_plan.Scale,
                factors: list[float], settings: dict) -> list[study_plan.Run]:
  """Both sides at each of `factors`, on PICK_SEEDS."""
  return [_run(base, scale, "confirm_choice", side, f, seed,
               (("side", side), ("candidate", candidate(side, f))), settings)
          for f in factors for side in (STOCK_SIDE, RECIPE_SIDE)
          for seed in PICK_SEEDS]


def pick(records: list[dict], grid: list[float]) -> dict:
  """Each side's factor of the highest mean top-1 over its records (of
  equal ones, the nearer to LR_GRID's centre): {side: {"candidate",
  "lr_scale", "top1_mean", "at_edge"}}."""
  centre = LR_GRID[len(LR_GRID) // 2]
  chosen = {}
  for side in (STOCK_SIDE, RECIPE_SIDE):
    means = {}
    for f in grid:
      top1 = [r["top1"] for r in records
              if dict(r["point"])["candidate"] == candidate(side, f)]
      if not top1:
        raise ValueError(f"No runs of {candidate(side, f)}.")
      means[f] = sum(top1) / len(top1)
    best = max(sorted(grid, key=lambda f: abs(math.log(f / centre))),
               key=lambda f: means[f])
    chosen[side] = {"candidate": candidate(side, best), "lr_scale": best,
                    "top1_mean": means[best],
                    "at_edge": best in (min(grid), max(grid))}
  return chosen


def extension(grid: list[float], chosen: dict) -> list[float]:
  """The factors past each edge of `grid` that a pick sits at."""
  found = []
  for side in (STOCK_SIDE, RECIPE_SIDE):
    f = chosen[side]["lr_scale"]
    step = (f / GRID_STEP if f == min(grid) else
            f * GRID_STEP if f == max(grid) else None)
    if step is not None and step not in found:
      found.append(step)
  return sorted(found)


def check_runs(base: TrainConfig, scale: study_plan.Scale, chosen: dict,
               settings: dict) -> list[study_plan.Run]:
  """Each side at its pick on CHECK_SEEDS (recipe's points)."""
  return [_run(base, scale, "confirm", side, chosen[side]["lr_scale"], seed,
               point, settings)
          for seed in CHECK_SEEDS
          for side, point in ((STOCK_SIDE, study_plan.STOCK_POINT),
                              (RECIPE_SIDE, study_plan.RECIPE_POINT))]


def search_spaces(grid: list[float], settings: dict) -> dict:
  """What each side searched (the LR factors) and what it held fixed."""
  return {
      STOCK_SIDE: {"lr_scales": grid, "fixed": {
          "optimizer": "keras.optimizers.SGD momentum, linear warm-up, "
                       "keras CosineDecay", "random_flip": False,
          "random_zoom_min_area": settings["train_crop_min_area"],
          "label_smoothing": 0.1}},
      RECIPE_SIDE: {"lr_scales": grid, "fixed": {
          k: v for k, v in settings.items() if k != "base_learning_rate"}}}
