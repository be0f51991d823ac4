"""Every study figure the docs quote is its JSON's (issue 59).

README.md, docs/*.md, the flagfiles' `#` headers and the studies README
quote figures from bench_results/studies/*.json, fine_tune.json and, where
they point there, study files in git history (HISTORY). Each quoted
figure is a CLAIMS row: a phrase with `{}` where its figures stand, found
in whichever of those files the text stands in now; an expression over
the studies that each figure must equal; the digits it is rounded to. The
results table's gap cells are claimed row by row from
test_readme_verdicts.ROWS. A claim that no text quotes any more fails.

A sentence or table row that speaks of studies (STUDY_WORDS; the studies
README and flags/small_images.cfg throughout) may hold no decimal, nor any
"N points", that neither a claim's phrase nor NOT_STUDY accounts for. A
phrase's own figures name what it quotes (LARS 2.5, min area 0.5).
"""
import glob
import json
import math
import os
import re
import statistics
import subprocess

import pytest

from tests import test_readme_verdicts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXTS = ("README.md", "docs/*.md", "flags/*.cfg",
         "bench_results/studies/README.md")
WHOLLY_STUDIES = ("bench_results/studies/README.md", "docs/studies.md",
                  "flags/small_images.cfg")
STUDY_WORDS = re.compile(r"top-1|\bseeds?\b|spread|\bheld\b|\bstud(y|ies)\b|"
                         r"stock Keras|ladder|\bpoints?\b|zero-init",
                         re.I)
SENTENCE_END = re.compile(r"[.;]\s+(?=[A-Z`*(\[])")
# A decimal (not a version, a section, an LR multiple x0.5 or part of a
# name), or the N of "N points".
FIGURE = re.compile(r"(?<![\w.§/:=])(?:\d+(?:,\d{3})*\.\d+(?![\w]|\.\d)|"
                    r"\d+(?= points?\b))")
HOLE = r"[+-]?\d+(?:,\d{3})*(?:\.\d+)?"


class Study:
  """One JSON's figures in the units the text quotes: top-1 in %."""

  def __init__(self, path: str, commit: str = ""):
    if commit:
      self.data = json.loads(subprocess.run(
          ["git", "show", f"{commit}:{path}"], cwd=ROOT, check=True,
          capture_output=True, text=True).stdout)
    else:
      with open(os.path.join(ROOT, path)) as f:
        self.data = json.load(f)
    self.runs = self.data.get("runs") or self.data["records"]
    for run in self.runs:
      run.setdefault("label", ", ".join(f"{k}={v}" for k, v in run["point"]))
    self.points = self.data.get("points") or [
        self._pooled(label) for label in dict.fromkeys(
            r["label"] for r in self.runs)]

  def _pooled(self, label: str) -> dict:
    top1 = [r["top1"] for r in self.runs if r["label"] == label]
    return {"label": label, "top1_mean": sum(top1) / len(top1),
            "top1_min": min(top1), "top1_max": max(top1)}

  @staticmethod
  def _one(items, field: str, key: str):
    """The item whose field is `key`, else ends with it, else holds it."""
    found = ([i for i in items if i[field] == key]
             or [i for i in items if i[field].endswith(key)]
             or [i for i in items if key in i[field]])
    assert len(found) == 1, f"{key!r} names {len(found)} of {field}"
    return found[0]

  def point(self, key: str) -> dict:
    return self._one(self.points, "label", key)

  def m(self, key: str) -> float:
    """Mean top-1, %."""
    return 100 * self.point(key)["top1_mean"]

  def mml(self, key: str) -> tuple:
    """Mean (min-max) top-1, %."""
    p = self.point(key)
    return tuple(100 * p[f] for f in ("top1_mean", "top1_min", "top1_max"))

  def loss(self, key: str) -> float:
    return self.point(key)["train_loss"]

  def row(self, key: str) -> tuple:
    """Mean (min-max) top-1 and training loss."""
    return self.mml(key) + (self.loss(key),)

  def sps(self, key: str) -> float:
    """Steps a second."""
    return self.point(key)["steps_per_sec"]

  def _all(self, keys) -> list:
    """The points whose labels hold any of `keys`, in the JSON's order."""
    return [p["label"] for p in self.points
            if any(k in p["label"] for k in keys)]

  def ms(self, *keys: str) -> tuple:
    """Mean top-1 of each point `_all` names, %."""
    return tuple(self.m(label) for label in self._all(keys))

  def mmls(self, *keys: str) -> tuple:
    """Mean (min-max) top-1 of each point `_all` names, %."""
    return tuple(self.mml(label) for label in self._all(keys))

  def run_mean(self, key: str, field: str) -> float:
    """A field's mean over a point's runs."""
    runs = [r for r in self.runs if r["label"] == self.point(key)["label"]]
    return sum(r[field] for r in runs) / len(runs)

  def verdict(self, key: str = "") -> dict:
    return self._one(self.data["verdicts"], "criterion", key)

  def gap(self, key: str = "") -> float:
    return self.verdict(key)["gap_points"]

  def spread(self, key: str = "") -> float:
    return self.verdict(key)["pooled_spread_points"]

  def gs(self, key: str = "") -> tuple:
    """A verdict's gap and pooled seed spread, points."""
    return self.gap(key), self.spread(key)

  def seeds(self, key: str) -> list:
    """Final top-1 of each seed of a point, %, in seed order."""
    runs = sorted((r for r in self.runs if r["label"] == self.point(
        key)["label"]), key=lambda r: r["seed"])
    return [100 * r["top1"] for r in runs]

  def leads(self, a: str, b: str) -> tuple:
    """Per paired seed, a's top-1 minus b's, points."""
    return tuple(x - y for x, y in zip(self.seeds(a), self.seeds(b)))

  def quarter_gains(self, *keys: str) -> list:
    """Each run's top-1 gain over its last quarter, points: the runs of
    the points whose labels hold any of `keys` (all runs without)."""
    labels = self._all(keys or ("",))
    gains = []
    for run in self.runs:
      if run["label"] in labels:
        at, last = dict(run["evals"]), run["evals"][-1][0]
        gains.append(100 * (at[last] - at[last * 3 // 4]))
    return gains

  def gains(self) -> tuple:
    """Each control's top-1 at 75 % of the run and at its end, %."""
    return tuple(100 * c[f] for c in self.data["baseline_convergence"]
                 for f in ("top1_at_75", "final_top1"))

  def control_gains(self) -> list:
    """Each control's top-1 gain over its last quarter, points."""
    return [c["gain_points"] for c in self.data["baseline_convergence"]]


# Files the text quotes from git history: name -> (file, commit that has it).
HISTORY = {
    "check1": ("bench_results/studies/recipe_small_images.json", "ee3dd92"),
    "check2": ("bench_results/studies/recipe_small_images.json", "12ec9dc"),
    "baseline_1202": ("bench_results/studies/baseline_stock_keras.json",
                      "b8791a9"),
    "c_1201": ("bench_results/studies/c_batch_size_control.json", "c8a56a6"),
}


def _studies() -> dict:
  """Each JSON by its name, fine_tune.json, and HISTORY's files."""
  paths = glob.glob(os.path.join(ROOT, "bench_results/studies/*.json"))
  studies = {os.path.basename(p)[:-5]: Study(p) for p in sorted(paths)}
  studies["fine_tune"] = Study("bench_results/fine_tune.json")
  studies.update({name: Study(*where) for name, where in HISTORY.items()})
  return studies


def _smoothing_floor(smoothing: float, classes: int) -> float:
  """The least cross-entropy a label-smoothed target allows."""
  top, rest = 1 - smoothing + smoothing / classes, smoothing / classes
  return -top * math.log(top) - (classes - 1) * rest * math.log(rest)


S = _studies()
# The ladder's rungs with zero-init gamma.
ZERO_GAMMA = ("+ zero_gamma", "+ bn_settings", "+ normalization", "path",
              "- conv_init", "- bn_settings", "- normalization")
ROW = (1, 1, 1, 2)  # a table row: mean (min-max) top-1, training loss
# (phrase, expression over the studies, digits of each figure).
CLAIMS = [
    # The studies README: its preamble and first table.
    ("30-epoch runs log {} with L2 and {} without",
     '(recipe_revised.run_mean("stock", "train_loss_with_l2"), '
     'recipe_revised.loss("stock"))', 2),
    ("the L2 term was about {} of the {} that the long check's stock",
     'recipe_revised.run_mean("stock", "train_loss_with_l2") - '
     'recipe_revised.loss("stock"), recipe_long.loss("stock")', 2),
    ("momentum {} / {} / {}; LARS {} / {} / {}; RMSprop warm-up {} / {} / {}",
     'lr_choice.ms("momentum", "lars", "rmsprop")', 1),
    ("(1 of 3 runs) (top-1 at 75 % -> end: {} -> {}, {} -> {}, {} -> {})",
     "lr_choice.gains()", 1),
    ("group 1: {} ({}-{}) moving, the same weights {} ({}-{}) with "
     "recomputed statistics, training loss {};",
     'a_distributed_bn.mml("=1, bn_stats=moving"), '
     'a_distributed_bn.mml("=1, bn_stats=recompute"), '
     'a_distributed_bn.loss("=1, bn_stats=moving")', (1,) * 6 + (2,)),
    ("group 8: {} ({}-{}) moving, the same weights {} ({}-{}) with "
     "recomputed statistics, training loss {} |",
     'a_distributed_bn.mml("=8, bn_stats=moving"), '
     'a_distributed_bn.mml("=8, bn_stats=recompute"), '
     'a_distributed_bn.loss("=8, bn_stats=moving")', (1,) * 6 + (2,)),
    ("group 8 beats group 1: **held** (gap {} points, pooled seed spread {})",
     'a_distributed_bn.gs("BN group 8 beats group 1")', 1),
    ("recomputed statistics: **held** (gap {} points, pooled seed spread {})",
     'a_distributed_bn.gs("recomputed")', 1),
    ("control **not converged** (1 of 2 runs) (top-1 at 75 % -> end: "
     "{} -> {}, {} -> {})", "a_distributed_bn.gains()", 1),
    ("momentum {} ({}-{}) / {} ({}-{}); LARS {} ({}-{}) / {} ({}-{}); "
     "RMSprop warm-up {} ({}-{}) / {} ({}-{});",
     'b_large_batch.mmls("smoothing=0.1")', 1),
    ("at 256 without label smoothing {} ({}-{})",
     'b_large_batch.mml("smoothing=0.0")', 1),
    ("momentum keeps batch 8's top-1 at 256: **not held** (gap {} points, "
     "pooled seed spread {})", 'b_large_batch.gs("momentum keeps")', 1),
    ("lars keeps batch 8's top-1 at 256: **not held** (gap {} points, "
     "pooled seed spread {})", 'b_large_batch.gs("lars keeps")', 1),
    ("rmsprop_warmup keeps batch 8's top-1 at 256: **not held** (gap {} "
     "points, pooled seed spread {})",
     'b_large_batch.gs("rmsprop_warmup keeps")', 1),
    ("label smoothing helps rmsprop_warmup at 256: **not decided at this "
     "size** (gap {} points, pooled seed spread {})",
     'b_large_batch.gs("label smoothing")', 1),
    ("(4 of 6 runs) (top-1 at 75 % -> end: {} -> {}, {} -> {}, {} -> {}, "
     "{} -> {}, {} -> {}, {} -> {}) |", "b_large_batch.gains()", 1),
    ("growing: {} ({}-{}) (180 steps); final batch, equal epochs: {} ({}-{}) "
     "(100 steps); final batch, equal steps: {} ({}-{}) (180 steps); small "
     "batch (ceiling): {} ({}-{})", 'c_batch_size_control.mmls("schedule=")',
     1),
    ("growing beats the final batch, equal epochs: **held** (gap {} points, "
     "pooled seed spread {})", 'c_batch_size_control.gs("equal epochs")', 1),
    ("growing beats the final batch, equal steps: **not held** (gap {} "
     "points, pooled seed spread {})",
     'c_batch_size_control.gs("equal steps")', 1),
    ("ceiling **not converged** (1 of 2 runs) (top-1 at 75 % -> end: "
     "{} -> {}, {} -> {})", "c_batch_size_control.gains()", 1),
    # The baseline and the ladder.
    ("| project | {} ({}-{}) | {} |",
     'baseline_stock_keras.mml("project"), baseline_stock_keras.sps("project")',
     ROW),
    ("| stock keras | {} ({}-{}) | {} |",
     'baseline_stock_keras.mml("stock_keras"), '
     'baseline_stock_keras.sps("stock_keras")', ROW),
    ("the project's path beats stock Keras: **not held** (gap {} points, "
     "pooled seed spread {})", "baseline_stock_keras.gs()", 1),
    ("| stock Keras, LR x1 (Goyal's 0.1 per 256) | {} ({}-{}) | {} |",
     'ladder.row("LR x1")', ROW),
    ("| stock Keras, LR x2 (lr's choice) | {} ({}-{}) | {} | **held**: {} "
     "(spread {}) |",
     'ladder.row("LR x2"), ladder.gs("beats stock Keras, LR x1")',
     ROW + (1, 1)),
    ("| + conv init variance 1/fan_in (tensorflow/tpu) | {} ({}-{}) | {} | "
     "**held**: {} ({}) |",
     'ladder.row("+ conv_init"), ladder.gs("+ conv_init beats")', ROW + (1, 1)),
    ("| + zero-init last BN gamma (Goyal §5.1) | {} ({}-{}) | {} | "
     "**not held**: {} ({}) |",
     'ladder.row("+ zero_gamma"), ladder.gs("+ zero_gamma beats")',
     ROW + (1, 1)),
    ("| + BN momentum 0.9, epsilon 1e-5 | {} ({}-{}) | {} | not decided: {} "
     "({}) |", 'ladder.row("+ bn_settings"), ladder.gs("+ bn_settings beats")',
     ROW + (1, 1)),
    ("| + ImageNet mean/std input normalisation | {} ({}-{}) | {} | not "
     "decided: {} ({}) |",
     'ladder.row("+ normalization"), ladder.gs("+ normalization beats")',
     ROW + (1, 1)),
    ("| the project's path (pipeline, distributed BN, trainer), whole image | "
     "{} ({}-{}) | {} | not decided: {} ({}) |",
     'ladder.row("path"), ladder.gs("every one")', ROW + (1, 1)),
    ("| project without its conv init | {} ({}-{}) | {} | conv init helps "
     "it: **held**, {} ({}) |",
     'ladder.row("- conv_init"), ladder.gs("conv_init helps")', ROW + (1, 1)),
    ("| project without zero-init gamma | {} ({}-{}) | {} | zero-init gamma "
     "helps it: **not held**, {} ({}) |",
     'ladder.row("- zero_gamma"), ladder.gs("zero_gamma helps")',
     ROW + (1, 1)),
    ("| project without its BN momentum/epsilon | {} ({}-{}) | {} | not "
     "decided: {} ({}) |",
     'ladder.row("- bn_settings"), ladder.gs("bn_settings helps")',
     ROW + (1, 1)),
    ("| project without its input normalisation | {} ({}-{}) | {} | not "
     "decided: {} ({}) |",
     'ladder.row("- normalization"), ladder.gs("normalization helps")',
     ROW + (1, 1)),
    # The recipe checks.
    ("9.5 minutes): {} % against {} %, {} points, pooled seed spread {};",
     'check1.m("small_images"), check1.m("stock"), check1.gs()', 1),
    ("5.8 minutes): {} % against {} %, {} points, spread {}.",
     'check2.m("small_images"), check2.m("stock"), check2.gs()', 1),
    ("| stock Keras, momentum x1 | {} ({}-{}) | {} |",
     'recipe_choice.row("momentum x1")', ROW),
    ("| stock Keras, momentum x2 (lr's rule) | {} ({}-{}) | {} |",
     'recipe_choice.row("momentum x2")', ROW),
    ("| stock Keras, momentum x4: **chosen** | {} ({}-{}) | {} |",
     'recipe_choice.row("momentum x4")', ROW),
    ("| LARS 2.5 | {} ({}-{}) | {} |", 'recipe_choice.row("=LARS 2.5")', ROW),
    ("| LARS 5 (lr's rule) | {} ({}-{}) | {} |",
     'recipe_choice.row("=LARS 5")', ROW),
    ("| LARS 10 | {} ({}-{}) | {} |", 'recipe_choice.row("=LARS 10")', ROW),
    ("| LARS 2.5, zero-init gamma | {} ({}-{}) | {} |",
     'recipe_choice.row("LARS 2.5, zero gamma")', ROW),
    ("| LARS 5, zero-init gamma | {} ({}-{}) | {} |",
     'recipe_choice.row("LARS 5, zero gamma")', ROW),
    ("| LARS 10, zero-init gamma | {} ({}-{}) | {} |",
     'recipe_choice.row("LARS 10, zero gamma")', ROW),
    ("| LARS 5, flip off: **chosen** | {} ({}-{}) | {} |",
     'recipe_choice.row("LARS 5, no flip")', ROW),
    ("edge of lr's grid and gains {} points at twice the LR",
     'recipe_choice.m("momentum x4") - recipe_choice.m("momentum x2")', 1),
    ("costs nothing here ({} against {} at 2.5, {} against {} at 5)",
     'recipe_choice.m("LARS 2.5, zero"), recipe_choice.m("=LARS 2.5"), '
     'recipe_choice.m("LARS 5, zero"), recipe_choice.m("=LARS 5")', 1),
    ("where it cost momentum {} points in the ladder",
     '-ladder.gap("zero_gamma helps")', 0),
    ("The flip's {} points at LARS 5",
     'recipe_choice.m("LARS 5, no flip") - recipe_choice.m("=LARS 5")', 1),
    ("| stock Keras, momentum x4 | {} ({}-{}) | {} | flags/small_images.cfg's "
     "choices beat stock Keras: **not decided** (gap {} points, pooled seed "
     "spread {}) |", 'recipe_small_images.row("stock"), '
     'recipe_small_images.gs()', ROW + (1, 1)),
    ("| flags/small_images.cfg, LARS 5, flip off | {} ({}-{}) | {} | |",
     'recipe_small_images.row("small_images")', ROW),
    ("the pairs give {}, {} and {} points",
     'recipe_small_images.leads("small_images", "stock")', 1),
    ("(The training losses, {} and {}, are not comparable",
     'recipe_small_images.loss("small"), recipe_small_images.loss("stock")',
     2),
    ("LARS had beaten momentum by {} points",
     'b_regime.m("lars, global_batch=32") - '
     'b_regime.m("momentum, global_batch=32")', 1),
    ("| stock Keras, momentum x2 | {} ({}-{}) | {} |",
     'recipe_long_choice.row("momentum x2")', ROW),
    ("| stock Keras, momentum x4 (the pick above) | {} ({}-{}) | {} |",
     'recipe_long_choice.row("momentum x4")', ROW),
    ("| stock Keras, momentum x8: **chosen** | {} ({}-{}) | {} |",
     'recipe_long_choice.row("momentum x8")', ROW),
    ("| LARS 2.5, flip off | {} ({}-{}) | {} |",
     'recipe_long_choice.row("LARS 2.5")', ROW),
    ("| LARS 5, flip off (the flagfile): **chosen** | {} ({}-{}) | {} |",
     'recipe_long_choice.row("LARS 5")', ROW),
    ("| LARS 10, flip off | {} ({}-{}) | {} |",
     'recipe_long_choice.row("LARS 10")', ROW),
    ("| stock Keras, momentum x8 | {} ({}-{}) | {} | flags/small_images.cfg's "
     "choices beat stock Keras: **not held** (gap {} points, pooled seed "
     "spread {}) |", 'recipe_long.row("stock"), recipe_long.gs()',
     ROW + (1, 1)),
    ("| flags/small_images.cfg, LARS 5, flip off, 30 epochs | {} ({}-{}) | "
     "{} | |", 'recipe_long.row("small_images")', ROW),
    ("at its picked LR is {} points ahead of the recipe",
     "-recipe_long.gap()", 1),
    ("ahead on every seed (by {}, {} and {} points)",
     'recipe_long.leads("stock", "small_images")', 1),
    ("The recipe's training loss, {}, sits at label smoothing's floor for "
     "ten classes ({}); stock Keras's {} holds its L2 term (about {},",
     'recipe_long.loss("small"), FLOOR, recipe_long.loss("stock"), '
     'recipe_revised.run_mean("stock", "train_loss_with_l2") - '
     'recipe_revised.loss("stock")', 2),
    ("| stock Keras, momentum x8 (the long pick) | {} ({}-{}) | |",
     'recipe_long_choice.mml("momentum x8")', 1),
    ("| stock Keras, momentum x16: **chosen** | {} ({}-{}) | {} |",
     'recipe_revised_choice.row("=momentum x16")', ROW),
    ("| LARS 5, flip off (the flagfile, the long pick) | {} ({}-{}) | |",
     'recipe_long_choice.mml("LARS 5")', 1),
    ("| LARS 5, flip on | {} ({}-{}) | {} |",
     'recipe_revised_choice.row("=LARS 5")', ROW),
    ("| project's path, momentum x16, flip off: **chosen** | {} ({}-{}) | {} |",
     'recipe_revised_choice.row("x16, no flip")', ROW),
    ("| project's path, momentum x16, flip on | {} ({}-{}) | {} |",
     'recipe_revised_choice.row("=project, momentum x16")', ROW),
    ("| stock Keras, momentum x16 | {} ({}-{}) | {} | the revised recipe's "
     "choices beat stock Keras: **not held** (gap {} points, pooled seed "
     "spread {}) |", 'recipe_revised.row("stock"), recipe_revised.gs()',
     ROW + (1, 1)),
    ("| revised recipe: project's path, momentum x16, flip off | {} ({}-{}) "
     "| {} |", 'recipe_revised.row("small_images")', ROW),
    ("The gap narrows from {} points to {}",
     "-recipe_long.gap(), -recipe_revised.gap()", 1),
    ("on every seed ({}, {}, {})",
     'recipe_revised.leads("stock", "small_images")', 1),
    ("gave LARS {} points at this length ({} against {} on seeds 0 and 1)",
     'recipe_revised_choice.m("=LARS 5") - recipe_long_choice.m("LARS 5"), '
     'recipe_revised_choice.m("=LARS 5"), recipe_long_choice.m("LARS 5")', 1),
    ("the project's path is {} points behind stock Keras on seeds 0 and 1 "
     "({} against {})",
     'recipe_revised_choice.m("=momentum x16") - '
     'recipe_revised_choice.m("=project, momentum x16"), '
     'recipe_revised_choice.m("=project, momentum x16"), '
     'recipe_revised_choice.m("=momentum x16")', 1),
    ("measured alike: {} to {} on both sides, near label smoothing's floor "
     "of {}", 'recipe_revised.loss("small"), recipe_revised.loss("stock"), '
     'FLOOR', 2),
    ("(training loss {}-{}, label smoothing's floor {})",
     'recipe_revised.loss("small"), recipe_revised.loss("stock"), FLOOR', 2),
    ("min area 0.35 cost {} points at 10 epochs",
     'crop_small_images.gap("whole image")', 1),
    ("| stock Keras, momentum x16 (the revised pick) | {} ({}-{}) | |",
     'recipe_revised_choice.mml("=momentum x16")', 1),
    ("| stock Keras, momentum x32: **chosen** | {} ({}-{}) | {} |",
     'recipe_crop_choice.row("=momentum x32")', ROW),
    ("| project's path, momentum x16, flip off (the revised pick) | {} "
     "({}-{}) | |", 'recipe_revised_choice.mml("x16, no flip")', 1),
    ("| the same at x32, crop min area 0.8 | {} ({}-{}) | {} |",
     'recipe_crop_choice.row("crop 0.8")', ROW),
    ("| the same at x32, crop min area 0.5: **chosen** | {} ({}-{}) | {} |",
     'recipe_crop_choice.row("crop 0.5")', ROW),
    ("| stock Keras, momentum x32 | {} ({}-{}) | {} | the recipe's choices "
     "beat stock Keras: **held** (gap {} points, pooled seed spread {}) |",
     'recipe_crop.row("stock"), recipe_crop.gs()', ROW + (1, 1)),
    ("| project's path, momentum x32, crop min area 0.5, flip off | {} "
     "({}-{}) | {} |", 'recipe_crop.row("small_images")', ROW),
    ("ahead on every seed ({}, {} and {} points)",
     'recipe_crop.leads("small_images", "stock")', 1),
    ("its training loss stays at {} against {}, and its test top-1 rises",
     'recipe_crop.loss("small"), recipe_crop.loss("stock")', 2),
    # The confirmatory comparison and the history behind it.
    ("| x8 | {} ({}-{}) | {} ({}-{}) |",
     'confirm_choice.mml("stock Keras, momentum x8"), '
     'confirm_choice.mml("recipe, momentum x8")', 1),
    ("| x16 | {} ({}-{}): **chosen** | {} ({}-{}) |",
     'confirm_choice.mml("stock Keras, momentum x16"), '
     'confirm_choice.mml("recipe, momentum x16")', 1),
    ("| x32 | {} ({}-{}) | {} ({}-{}): **chosen** |",
     'confirm_choice.mml("stock Keras, momentum x32"), '
     'confirm_choice.mml("recipe, momentum x32")', 1),
    ("| x64 | {} ({}-{}) | {} ({}-{}) |",
     'confirm_choice.mml("stock Keras, momentum x64"), '
     'confirm_choice.mml("recipe, momentum x64")', 1),
    ("| path=stock Keras | {} ({}-{}) | {} | held (gap {} points, pooled "
     "seed spread {}) |", 'confirm.row("stock"), confirm.gs()',
     ROW + (2, 2)),
    ("| path=flags/small_images.cfg | {} ({}-{}) | {} | |",
     'confirm.row("small_images")', ROW),
    ("Per seed, the recipe's lead: {}, {}, {} points.",
     'confirm.leads("small_images", "stock")', 1),
    ("Its training loss stays at {} against stock Keras's {}",
     'confirm.loss("small"), confirm.loss("stock")', 2),
    ("with probability 1 - (1 - p)^6, {} to {}",
     "1 - (1 - 0.035) ** 6, 1 - (1 - 0.09) ** 6", 2),
    ("momentum at lr's rule; {} ({}), not decided.", "check1.gs()", 2),
    ("(absolute 5.0); {} ({}), not decided.", "check2.gs()", 2),
    ("LARS 5, flip off; {} ({}), not decided.", "recipe_small_images.gs()", 2),
    ("LR re-picked; {} ({}), **not held**.", "recipe_long.gs()", 2),
    ("project's path, flip off; {} ({}), **not held**.",
     "recipe_revised.gs()", 2),
    ("min area 0.5; {} ({}), **held**.", "recipe_crop.gs()", 2),
    # Study b in the papers' regime.
    ("| momentum, batch 32 | {} ({}-{}) | {} | {} | momentum keeps batch 32's "
     "top-1 at 128 (within 1 point): **not decided** (gap {} points, pooled "
     "seed spread {}) |", 'b_regime.row("momentum, global_batch=32"), '
     'b_regime.sps("momentum, global_batch=32"), b_regime.gs("momentum keeps")',
     ROW + (2, 1, 1)),
    ("| momentum, batch 128 | {} ({}-{}) | {} | {} | LARS beats momentum at "
     "128: **held** (gap {} points, pooled seed spread {}) |",
     'b_regime.row("momentum, global_batch=128"), '
     'b_regime.sps("momentum, global_batch=128"), b_regime.gs("lars beats")',
     ROW + (2, 1, 1)),
    ("| LARS, batch 32 | {} ({}-{}) | {} | {} | LARS keeps batch 32's top-1 "
     "at 128 (within 1 point): **not held** (gap {} points, pooled seed "
     "spread {}) |", 'b_regime.row("lars, global_batch=32"), '
     'b_regime.sps("lars, global_batch=32"), b_regime.gs("lars keeps")',
     ROW + (2, 1, 1)),
    ("| LARS, batch 128 | {} ({}-{}) | {} | {} | |",
     'b_regime.row("lars, global_batch=128"), '
     'b_regime.sps("lars, global_batch=128")', ROW + (2,)),
    ("the batch loses {} points, not {}: within",
     '-b_regime.gap("momentum keeps"), -b_large_batch.gap("momentum")', (2, 1)),
    ("its seed spread ({}) is too wide", 'b_regime.spread("momentum keeps")',
     2),
    ("LARS loses {} points with a spread of {}: not held",
     '-b_regime.gap("lars keeps"), b_regime.spread("lars keeps")', 2),
    ("({} - 2 x {} still misses the 1-point tolerance, by {} points",
     '-b_regime.gap("lars keeps"), b_regime.spread("lars keeps"), '
     '-b_regime.gap("lars keeps") - 2 * b_regime.spread("lars keeps") - 1',
     2),
    ("by {} points at 32 and by less, {}, at 128 (held there: spread {})",
     'b_regime.m("lars, global_batch=32") - '
     'b_regime.m("momentum, global_batch=32"), b_regime.gs("lars beats")', 2),
    ("({} points against {})",
     '-b_regime.gap("lars keeps"), -b_regime.gap("momentum keeps")', 2),
    ("costing momentum about {} points and LARS about 0",
     '-ladder.gap("+ zero_gamma beats")', 1),
    ("Every run still gained {}-{} points in its last quarter",
     "min(b_regime.quarter_gains()), max(b_regime.quarter_gains())", 1),
    # The crop study and the summary.
    ("| Inception, min area 0.08 | {} ({}-{}) | {} |",
     'crop_small_images.row("Inception")', ROW),
    ("beats the Inception crop: **held** (gap {} points, pooled seed spread "
     "{})", 'crop_small_images.gs("Inception")', 1),
    ("the whole image beats min area 0.35: **held** (gap {} points, pooled "
     "seed spread {})", 'crop_small_images.gs("whole image")', 1),
    ("(5 of 6 runs) (top-1 at 75 % -> end: {} -> {}, {} -> {}, {} -> {}, "
     "{} -> {}, {} -> {}, {} -> {}) |", "crop_small_images.gains()", 1),
    ("| min area 0.35 | {} ({}-{}) | {} |",
     'crop_small_images.row("=min area 0.35")', ROW),
    ("| whole image, eval uncropped | {} ({}-{}) | {} |",
     'crop_small_images.row("whole image")', ROW),
    ("momentum's published LR ({} % against {} at x1 and {} at half)",
     'lr_choice.m("momentum, lr_scale=2.0"), '
     'lr_choice.m("momentum, lr_scale=1.0"), '
     'lr_choice.m("momentum, lr_scale=0.5")', 1),
    ("RMSprop warm-up's ({} against {})",
     'lr_choice.m("rmsprop_warmup, lr_scale=2.0"), '
     'lr_choice.m("rmsprop_warmup, lr_scale=1.0")', 1),
    ("halved LARS's ({} against {}; at twice it diverged to chance, {})",
     'lr_choice.m("lars, lr_scale=0.5"), lr_choice.m("lars, lr_scale=1.0"), '
     'lr_choice.m("lars, lr_scale=2.0")', 1),
    ("4 images by {} points with moving statistics and {} with recomputed",
     'a_distributed_bn.gap("BN group 8 beats group 1"), '
     'a_distributed_bn.gap("recomputed")', 1),
    ("same weights ({} against {}, {} against {})",
     'a_distributed_bn.ms("bn_group_size=1", "bn_group_size=8")', 1),
    ("lower training loss ({} against {})",
     'a_distributed_bn.loss("=8, bn_stats=moving"), '
     'a_distributed_bn.loss("=1, bn_stats=moving")', 2),
    ("One control run gained {} points in its last quarter",
     "max(a_distributed_bn.control_gains())", 1),
    ("loses {} (momentum), {} (LARS) and {} (RMSprop warm-up) points",
     '-b_large_batch.gap("momentum"), -b_large_batch.gap("lars"), '
     '-b_large_batch.gap("rmsprop_warmup keeps")', 1),
    ("(RMSprop warm-up): {} points, not decided",
     'b_large_batch.gap("label smoothing")', 1),
    ("momentum lost {} points (not decided), LARS {} (not held against a "
     "1-point tolerance, by {} points)",
     '-b_regime.gap("momentum keeps"), -b_regime.gap("lars keeps"), '
     '-b_regime.gap("lars keeps") - 2 * b_regime.spread("lars keeps") - 1',
     2),
    ("LARS led momentum at both batches, by less at the larger ({} points at "
     "32, {} at 128)", 'b_regime.m("lars, global_batch=32") - '
     'b_regime.m("momentum, global_batch=32"), b_regime.gap("lars beats")',
     2),
    ("beats 256 from the start by {} points at equal epochs",
     'c_batch_size_control.gap("equal epochs")', 1),
    ("slightly better ({} points, seed spread {})",
     'c_batch_size_control.gs("equal steps")', 1),
    ("stock Keras wins by {} points** ({} % against {} %, not held)",
     '-baseline_stock_keras.gap(), baseline_stock_keras.m("stock"), '
     'baseline_stock_keras.m("project")', 1),
    ("to the project's ({} -> {})", 'ladder.m("LR x1"), ladder.m("LR x2")',
     1),
    ("half this LR ({} %, its files in the history at b8791a9)",
     'baseline_1202.m("stock")', 1),
    ("The crop costs {} points: the project's path reaches {} % on the whole "
     "image against {} % with the 0.35 crop (different runs: the crop study "
     "measured the same, {})",
     'ladder.m("path") - baseline_stock_keras.m("project"), ladder.m("path"), '
     'baseline_stock_keras.m("project"), crop_small_images.gap("whole image")',
     1),
    ("Zero-init gamma costs {}-{} points",
     '-ladder.gap("zero_gamma helps"), -ladder.gap("+ zero_gamma beats")', 1),
    ("helps ({} on stock Keras, {} on its own path)",
     'ladder.gap("+ conv_init beats"), ladder.gap("conv_init helps")', 1),
    ("within the seed spread ({} against {}, {}, spread {})",
     'ladder.m("path"), ladder.m("+ normalization"), ladder.gs("every one")',
     1),
    ("without zero-init gamma ({} %) ties stock Keras at the same LR ({} %)",
     'ladder.m("- zero_gamma"), ladder.m("LR x2")', 1),
    ("The 14 runs with it gained {}-{} points (median {}) in their last "
     "quarter, the 8 without {}-{}",
     "min(ladder.quarter_gains(*ZERO_GAMMA)), "
     "max(ladder.quarter_gains(*ZERO_GAMMA)), "
     "median(ladder.quarter_gains(*ZERO_GAMMA)), "
     'min(ladder.quarter_gains("LR x", "+ conv_init", "- zero_gamma")), '
     'max(ladder.quarter_gains("LR x", "+ conv_init", "- zero_gamma"))', 1),
    ("not decided ({} points, spread {})", 'c_1201.gs("equal steps")', 1),
    # README and docs/: the prose around the results table.
    ("stock Keras scored {}-{} % on three earlier seed sets",
     'min(recipe_long.m("stock"), recipe_revised.m("stock"), '
     'recipe_crop.m("stock")), max(recipe_long.m("stock"), '
     'recipe_revised.m("stock"), recipe_crop.m("stock"))', 1),
    ("{} % with the plan's settings", 'confirm.m("stock")', 1),
    ("the recipe led by {}, not {}", "recipe_crop.gap(), confirm.gap()", 2),
    ("the recipe led by {} (recipe check 4), not {}",
     "recipe_crop.gap(), confirm.gap()", 2),
    ("ladder measured at {} on it", 'ladder.gap("+ conv_init beats")', 1),
    ("no zero-init gamma (it cost about {} points)",
     '-ladder.gap("zero_gamma helps")', 0),
    ("beats it: **held** ({}, spread {}); against a plain `fit`, {}",
     "confirm.gs(), recipe_crop.gap()", 2),
    ("it also led at 32, by more ({})",
     'b_regime.m("lars, global_batch=32") - '
     'b_regime.m("momentum, global_batch=32")', 1),
    ("the 0.35 crop costs {} points and zero-init gamma about {}",
     'ladder.m("path") - baseline_stock_keras.m("project"), '
     '-ladder.gap("zero_gamma helps")', (1, 0)),
    ("ended at the first \"held\" ({};", "recipe_crop.gap()", 2),
    ("beats it, {} % against {} %: {} points, pooled seed spread {}",
     'confirm.m("small_images"), confirm.m("stock"), confirm.gs()',
     (1, 1, 2, 2)),
    ("4x the batch cost momentum {} points and LARS {} (not held by {} "
     "points, 2 seeds), and LARS led momentum at both batches, by {} points "
     "at 32 and {} at 128",
     '-b_regime.gap("momentum keeps"), -b_regime.gap("lars keeps"), '
     '-b_regime.gap("lars keeps") - 2 * b_regime.spread("lars keeps") - 1, '
     'b_regime.m("lars, global_batch=32") - '
     'b_regime.m("momentum, global_batch=32"), b_regime.gap("lars beats")', 2),
    ("reaches {} and {} % test top-1 against {} and {} % from scratch at the "
     "same 400 steps (2 paired seeds): {} points, pooled seed spread {}",
     'fine_tune.seeds("fine-tuned"), fine_tune.seeds("scratch"), '
     "fine_tune.gs()", 1),
    ("So {} says the", "confirm.gap()", 2),
    ("stock Keras {} points ahead", "-baseline_stock_keras.gap()", 0),
    ("beats it: **held** ({}, spread {})", "confirm.gs()", 2),
    # flags/small_images.cfg's header.
    ("(recipe_crop.json): {} % against stock Keras model.fit's {} %",
     'recipe_crop.m("small_images"), recipe_crop.m("stock")', 1),
    ("weight decay: {} points, pooled seed spread {}, held (the sixth",
     "recipe_crop.gs()", 2),
    ("the crop gave {} % at min area 0.5 and {} % at 0.8 (stock Keras {} %)",
     'recipe_crop_choice.m("crop 0.5"), recipe_crop_choice.m("crop 0.8"), '
     'recipe_crop_choice.m("=momentum x32")', 1),
    ("this recipe beats it, {} points, pooled seed spread {}, held.",
     "confirm.gs()", 2),
    ("against a plain fit the lead is the {} above", "recipe_crop.gap()", 2),
    ("fan_in init measured {} on it", 'ladder.gap("+ conv_init beats")', 1),
    ("whole image beat min area 0.35 by {} points and 0.35 beat 0.08 by {};",
     'crop_small_images.gap("whole image"), '
     'crop_small_images.gap("Inception")', 1),
    ("(training loss {} against stock Keras's {})",
     'recipe_crop.loss("small_images"), recipe_crop.loss("stock")', 2),
    ("in the ladder it cost {} points on stock Keras and {} on the project's",
     '-ladder.gap("+ zero_gamma beats"), -ladder.gap("zero_gamma helps")', 1),
    ("(tensorflow/tpu): {} and {} points;",
     'ladder.gap("+ conv_init beats"), ladder.gap("conv_init helps")', 1),
    ("(linear scaling, {} per 256 images, x{} of Goyal",
     'recipe_crop.data["recipe"]["base_learning_rate"], '
     'recipe_crop.data["stock_lr_scale"]', (1, 0)),
    ("momentum x2: {} per 256 images",
     'baseline_stock_keras.data["common_settings"]["base_learning_rate"]', 1),
    ("a tie with it on ({} % against {} % at x16)",
     'recipe_revised_choice.m("x16, no flip"), '
     'recipe_revised_choice.m("=project, momentum x16")', 1),
    ("(three checks, {} to {} points) and trails it by {} at 30",
     "min(check1.gap(), check2.gap(), recipe_small_images.gap()), "
     "max(check1.gap(), check2.gap(), recipe_small_images.gap()), "
     "-recipe_long.gap()", 1),
]
# The results table's gap cells, row by row as test_readme_verdicts holds
# their verdicts.
CLAIMS += [
    (f"| {start}...| ...| " + " / ".join(["{} ({})"] * len(quoted)) + " |",
     ", ".join(f"{file[:-5]}.gs({criterion!r})" for file, criterion in quoted),
     2) for start, quoted in test_readme_verdicts.ROWS.items()]
# (pattern, why its figures are not a study's).
NOT_STUDY = [
    (r"\d+(\.\d+)? minutes|[\d.]+ for the (choice|check)|"
     r"calibration's [\d.]+|estimated [\d.]+", "run times, not results"),
    (r"load average [\d.]+(-[\d.]+)?", "the machine's load"),
    (r"0\.1 per 256|Goyal et al\.'s 0\.1|label smoothing 0\.1|"
     r"momentum 0\.9|[\d.]+-epoch warm-up|LARS (peak )?\d+(\.\d+)?|"
     r"absolute peak LR of 5\.0|LR x 0\.5 / 1 / 2",
     "settings: LR rules, smoothing, warm-up"),
    (r"min(-| )area(-| )0\.\d+|0\.35 crop|at least 0\.8 and 0\.5|"
     r"[\d.]+ % centre crop|2\.5 % (of (5,120 training images|the set) )?"
     r"a step", "the crops and batches a study was designed with"),
    (r"p of about 0\.\d+( with 2 seeds a side and 0\.\d+)?",
     "the criterion's false-positive rate, a property of the design"),
    (r"within 1 point|a 1-point", "the declared tolerance"),
    (r"Keras 3\.\d+|TensorFlow 2\.\d+|Python 3\.\d+", "versions"),
    (r"76\.3% top-1", "Ying et al.'s own result, not a study's"),
    (r"top-1 1\.000|scored 1\.000|eval loss 0\.\d+( on JAX, 0\.\d+)?|"
     r"within 0\.03 top-1|\(0\.060 with", "the CPU demo's figures (make demo)"),
    (r"blocks 0\.05 s, of ResNet-50 0\.44 s",
     "the checkpoint bench (bench_results/train.json), not a study"),
]


def _blocks(path: str) -> list[str]:
  """A file's paragraphs, list items and table rows, each on one line;
  a flagfile's `#` lines only; no code blocks."""
  blocks, lines, fenced = [], [], False
  with open(os.path.join(ROOT, path)) as f:
    for line in f:
      if path.endswith(".cfg"):
        line = line[1:] if line.startswith("#") else ""
      elif line.lstrip().startswith("```"):
        fenced, line = not fenced, ""
      text = "" if fenced else line.strip()
      if lines and (not text or text.startswith(("|", "- ", "#"))
                    or lines[-1].startswith("|")):
        blocks.append(" ".join(lines))
        lines = []
      if text:
        lines.append(text)
  return blocks + [" ".join(lines)] * bool(lines)


def _texts() -> list[tuple[str, str]]:
  """(file, block) of every block in TEXTS."""
  return [(os.path.relpath(path, ROOT), re.sub(r"\s+", " ", block))
          for pattern in TEXTS
          for path in sorted(glob.glob(os.path.join(ROOT, pattern)))
          for block in _blocks(os.path.relpath(path, ROOT))]


TEXT = _texts()


def _pattern(phrase: str) -> re.Pattern:
  """`{}` a figure (groups f0, f1, ...), `...` any text within a table
  cell (groups any0, any1, ...)."""
  parts = re.split(r"(\{\}|\.\.\.)", phrase)
  figures, anys = iter(range(len(parts))), iter(range(len(parts)))
  return re.compile("".join(
      f"(?P<f{next(figures)}>{HOLE})" if part == "{}"
      else f"(?P<any{next(anys)}>[^|]*?)" if part == "..."
      else re.escape(part) for part in parts))


def _flat(value) -> tuple:
  if isinstance(value, (tuple, list)):
    return tuple(x for v in value for x in _flat(v))
  return (value,)


def _figures(expression: str) -> tuple:
  names = {"__builtins__": {}, "min": min, "max": max,
           "median": statistics.median, "FLOOR": _smoothing_floor(0.1, 10),
           "ZERO_GAMMA": ZERO_GAMMA, **S}
  return _flat(eval(expression, names))  # pylint: disable=eval-used


def _agrees(printed: str, value: float, digits: int) -> bool:
  """`printed` is `value` rounded to `digits`, either way at a tie: top-1
  counts whole test images, so a tie is one within float32's noise."""
  decimals = len(printed.split(".")[1]) if "." in printed else 0
  error = abs(float(printed.replace(",", "")) - value)
  return decimals == digits and error <= 0.5 * 10**-digits + 1e-4


@pytest.mark.parametrize("phrase,expression,digits", CLAIMS,
                         ids=[c[0] for c in CLAIMS])
def test_each_quoted_figure_is_its_json_value(phrase, expression, digits):
  values = _figures(expression)
  digits = digits if isinstance(digits, tuple) else (digits,) * len(values)
  assert len(values) == phrase.count("{}") == len(digits), phrase
  found = [(path, m) for path, block in TEXT
           for m in _pattern(phrase).finditer(block)]
  assert found, f"no text quotes {phrase!r}"
  for path, match in found:
    printed = [match.group(f"f{i}") for i in range(len(values))]
    wrong = [(p, round(v, 4)) for p, v, d in zip(printed, values, digits)
             if not _agrees(p, v, d)]
    assert not wrong, f"{path}: {match.group(0)!r}: printed, JSON: {wrong}"


def _accounted(block: str) -> set[int]:
  """The characters of a block that a claim's phrase (but its `...`) or
  a NOT_STUDY pattern covers: a phrase's own figures name what it quotes
  (LARS 2.5, min area 0.5)."""
  covered = set()
  for phrase, _, _ in CLAIMS:
    for m in _pattern(phrase).finditer(block):
      covered |= set(range(*m.span())).difference(*(
          range(*m.span(g)) for g in m.groupdict() if g.startswith("any")))
  for pattern, _ in NOT_STUDY:
    for m in re.finditer(pattern, block):
      covered |= set(range(*m.span()))
  return covered


def _study_spans(path: str, block: str) -> list[tuple[int, int]]:
  """The sentences of a block (a table row is one) that speak of studies;
  the whole block in WHOLLY_STUDIES."""
  if path in WHOLLY_STUDIES or block.startswith("|"):
    return [(0, len(block))] * bool(
        path in WHOLLY_STUDIES or STUDY_WORDS.search(block))
  ends = [m.end() for m in SENTENCE_END.finditer(block)] + [len(block)]
  return [(a, b) for a, b in zip([0] + ends, ends)
          if STUDY_WORDS.search(block[a:b])]


def test_every_study_figure_is_claimed():
  unclaimed = []
  for path, block in TEXT:
    covered = _accounted(block)
    unclaimed += [f"{path}: ...{block[max(0, m.start() - 60):m.end() + 20]}"
                  for a, b in _study_spans(path, block)
                  for m in FIGURE.finditer(block, a, b)
                  if not covered.issuperset(range(*m.span()))]
  assert not unclaimed, "\n".join(unclaimed)


@pytest.mark.parametrize("pattern,why", NOT_STUDY)
def test_each_exception_is_still_needed(pattern, why):
  assert any(re.search(pattern, block) for _, block in TEXT), (pattern, why)
