"""Writes a study's results: a markdown table, a JSON file and a PNG.

The JSON holds every run's exact TrainConfig (paths left out), its test
top-1/top-5 over every test image, its steps/s and seconds, and the
machine; the markdown and the plot are rendered from the same records, so
what the README quotes is what was measured.
"""
import collections
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from resnet_tpu.config import TrainConfig  # noqa: E402

# Fields that differ between machines, not between settings.
PATH_FIELDS = ("model_dir", "data_dir", "export_dir")
Text = collections.namedtuple(
    "Text", "file_name title claim x_key categorical")
TEXT = {
    "a": Text("a_distributed_bn", "a. Distributed BN with {per} images per "
              "replica (Ying et al. 2018 §3.1)",
              "BN statistics over too few images hurt final accuracy; "
              "pooling them over a group of replicas (distributed BN) "
              "recovers it, at the cost of an all-reduce per BN layer.",
              "bn_group_size", True),
    "lr": Text("lr_choice", "LR rules chosen once at the smallest batch",
               "Each optimizer's rule (lab/study_plan.py: the papers' "
               "values) is chosen once on the smallest batch, from its "
               "peak LR times 0.5, 1 and 2, and then used unchanged at "
               "every batch of b, c, the baseline and the crop study.",
               "lr_scale", False),
    "b": Text("b_large_batch", "b. Top-1 against the global batch at equal "
              "epochs (Goyal 2017; Ying 2018 §3; Akiba 2017)",
              "Momentum SGD with linear scaling and warm-up keeps "
              "small-batch accuracy up to about 8k (Goyal et al.); LARS "
              "goes further (Ying et al. §3, after You et al. 2017); "
              "RMSprop warm-up with a slow start trains at 32k (Akiba et "
              "al.); label smoothing helps at large batches (Ying §5).",
              "global_batch", False),
    "c": Text("c_batch_size_control", "c. Batch-size control against a "
              "fixed final batch (Mikami et al. 2018)",
              "Growing the batch during training is more stable than "
              "training at the final, large batch from the start.",
              "schedule", True),
    "baseline": Text("baseline_stock_keras", "The project's path against "
                     "stock Keras model.fit at equal budget",
                     "What the project's full path (input pipeline, "
                     "zero-init gamma, distributed BN, its schedule and "
                     "trainer) gives over a plain model.fit.", "path", True),
    "crop": Text("crop_small_images", "Train crops for small images",
                 "The ImageNet crop (min area 0.08) cuts small centred "
                 "objects away; a larger minimum area keeps them.",
                 "train_crop", True),
    "ladder": Text("ladder", "The gap to stock Keras, feature by feature "
                   "(issue 36)",
                   "Stock Keras model.fit gains the project's choices one "
                   "at a time (its LR rule, conv init, zero-init gamma, BN "
                   "momentum and epsilon, input normalisation), each read "
                   "back from the built model; the last rung is the "
                   "project's own path (its input pipeline, distributed BN "
                   "at group 1, its trainer) on the same whole images. "
                   "The project's path then loses each choice in turn.",
                   "rung", True),
    "recipe": Text("recipe_small_images", "flags/small_images.cfg against "
                   "stock Keras model.fit at equal budget",
                   "The small-image recipe's input, network and "
                   "optimizer choices, read from the flagfile, train the "
                   "study's network better than a plain model.fit with "
                   "momentum at its own rule (recipe_choice's pick, else "
                   "lr's), the same batch and steps.",
                   "path", True),
    "recipe_choice": Text(
        "recipe_choice", "The small-image recipe's choice at equal "
        "budget, each side's grid on seeds 0 and 1 (issue 36)",
        "Each side of the recipe check takes the highest mean top-1 of a "
        "grid of one size around its rule: stock Keras's momentum LR, and "
        "the recipe's LARS peak with and without zero-init gamma, and "
        "without the random flip; the check then runs on fresh seeds.",
        "candidate", True),
    "recipe_long_choice": Text(
        "recipe_long_choice", "The small-image recipe's choice at three "
        "times the budget, each side's LR on seeds 0 and 1 (issue 36)",
        "Each side of the long recipe check takes the highest mean top-1 "
        "of its peak LR at recipe_choice's pick x0.5, x1 and x2 (stock "
        "Keras's momentum; the flagfile's LARS, its other choices kept), "
        "at three times recipe_choice's epochs; the check then runs on "
        "fresh seeds.", "candidate", True),
    "recipe_long": Text("recipe_long", "flags/small_images.cfg against "
                        "stock Keras model.fit at three times the budget",
                        "The small-image recipe's input, network and "
                        "optimizer choices train the study's network "
                        "better than a plain model.fit with momentum at "
                        "three times the recipe check's epochs, each side "
                        "at its LR picked at that budget "
                        "(recipe_long_choice), the same batch and steps.",
                        "path", True),
    "recipe_revised_choice": Text(
        "recipe_revised_choice", "The revised small-image recipe's choice "
        "at three times the budget, on seeds 0 and 1 (issue 36)",
        "Stock Keras's momentum one grid step past its long pick, and the "
        "recipe's revised candidates (its LARS with the random flip on; "
        "stock Keras's momentum rule at its pick with the recipe's input, "
        "init and network, the flip off and on) compete with the long "
        "choice's picks; each side keeps its highest mean top-1, and the "
        "check then runs on fresh seeds.", "candidate", True),
    "recipe_revised": Text("recipe_revised", "The revised small-image "
                           "recipe against stock Keras model.fit at three "
                           "times the budget",
                           "The revised recipe's input, network and "
                           "optimizer choices (recipe_revised_choice's "
                           "pick) train the study's network better than a "
                           "plain model.fit with momentum at its revised "
                           "LR pick, at the long check's epochs, batch and "
                           "steps, on fresh seeds.", "path", True),
    "recipe_crop_choice": Text(
        "recipe_crop_choice", "The small-image recipe with mild train "
        "crops at three times the budget, on seeds 0 and 1 (issue 36)",
        "Stock Keras's momentum one more grid step past its revised pick, "
        "and the revised recipe with square train crops of at least 0.8 "
        "and 0.5 of the image (the project's input pipeline; stock "
        "Keras's plain fit has none) at stock Keras's momentum rule, "
        "compete with the revised choice's picks; each side keeps its "
        "highest mean top-1, and the check then runs on fresh seeds.",
        "candidate", True),
    "recipe_crop": Text("recipe_crop", "The small-image recipe after the "
                        "crop round against stock Keras model.fit at three "
                        "times the budget",
                        "The recipe's input, network and optimizer choices "
                        "after the crop round (recipe_crop_choice's pick) "
                        "train the study's network better than a plain "
                        "model.fit with momentum at its pick of that round, "
                        "at the long check's epochs, batch and steps, on "
                        "fresh seeds.", "path", True),
    "confirm_choice": Text(
        "confirm_choice", "The confirmatory comparison's picks, on a "
        "validation split, seeds 0 and 1 (issue 51)",
        "Each side takes the highest mean validation top-1 of one shared "
        "LR grid (momentum x16, x32, x64, extended past an edge its pick "
        "sits at): stock Keras model.fit with Keras's RandomZoom to the "
        "recipe's crop area, the flip off and label smoothing; the "
        "project's path with flags/small_images.cfg's choices "
        "(lab/confirm_plan.py, committed before the runs).",
        "candidate", True),
    "confirm": Text("confirm", "The confirmatory comparison: "
                    "flags/small_images.cfg against stock Keras with its "
                    "built-in equivalents, on fresh seeds (issue 51)",
                    "The recipe's choices train the study's network better "
                    "than stock Keras model.fit given every one of them "
                    "that Keras has built in, each side at its LR picked "
                    "on the validation split, the same batch and steps; "
                    "test photos scored once, on fresh seeds, under the "
                    "criterion declared in lab/confirm_plan.py.",
                    "path", True),
    "regime": Text("b_regime", "b in the papers' regime: the largest "
                   "batch 2.5 % of the images a step, 30 epochs (Goyal "
                   "2017; Ying 2018 §3; You 2017)",
                   "Momentum SGD with linear scaling and warm-up keeps "
                   "small-batch accuracy at a large batch (Goyal et al.); "
                   "LARS trains better than momentum at the largest batch "
                   "(You et al. 2017; Ying et al. §3).",
                   "global_batch", False),
}


def setting(name: str, scale, source: str, num_test: int,
            seeds: int) -> str:
  """One paragraph of what every run of study `name` (`seeds` seeds a
  point) shares."""
  scored = (f"validation top-1 over {num_test} held-out training images"
            if name == "confirm_choice" else
            f"test top-1 over all {num_test} test images")
  shared = (f"The narrow ResNet-10 of lab/study_model.py at 32 px on "
            f"{scale.num_train} training images of {source}, {scored}, "
            f"evaluated at 75 % and at "
            f"the end of each run (stock Keras: each quarter); "
            + ("the first seed only (lr chooses, it does not decide); "
               if name == "lr" else
               f"{seeds} paired seed(s) per point; ") +
            "warm-up 15 % of each run; LR rules and "
            "criteria of lab/study_plan.py.")
  if name == "a":
    return (f"{scale.bn_replicas} CPU replicas x {scale.bn_per_replica} "
            f"images, {scale.bn_epochs:g} epochs, momentum SGD, label "
            f"smoothing 0.1; recomputed statistics are those of the same "
            f"run's final weights. " + shared)
  replicas = (f"{scale.micro_replicas} CPU replicas" if scale.micro_replicas
              > 1 else "one CPU replica")
  return (f"{replicas}; batches above the "
          f"smallest accumulate micro-batches of the smallest; "
          f"{scale.epochs:g} epochs (at least {scale.min_steps} steps at "
          f"the largest batch {max(scale.batches)}, "
          f"{100 * max(scale.batches) / scale.num_train:.1f} % of the "
          f"training images a step); label smoothing 0.1 "
          f"unless the point says 0.0. " + shared)


def settings(cfg: TrainConfig) -> dict:
  """The config of a run as a dict, paths left out."""
  return {k: v for k, v in cfg.flat().items() if k not in PATH_FIELDS}


def common_settings(records: list[dict]) -> dict:
  """The settings every run of a study shares."""
  first = records[0]["settings"]
  return {k: v for k, v in first.items()
          if all(r["settings"][k] == v for r in records)}


def non_defaults(values: dict) -> dict:
  """The entries of `values` that differ from TrainConfig's defaults."""
  defaults = TrainConfig("").flat()
  return {k: v for k, v in values.items() if defaults.get(k) != v}


def points(records: list[dict]) -> list[dict]:
  """Seeds of one point merged: top-1 mean, min, max, std; steps/s mean."""
  merged = {}
  for r in records:
    merged.setdefault(r["label"], []).append(r)
  out = []
  for label, runs in merged.items():
    top1 = [r["top1"] for r in runs]
    out.append({
        "label": label, "point": runs[0]["point"], "seeds": len(runs),
        "top1_mean": statistics.fmean(top1), "top1_min": min(top1),
        "top1_max": max(top1),
        "top1_std": statistics.stdev(top1) if len(top1) > 1 else 0.0,
        "train_loss": statistics.fmean(r["train_loss"] for r in runs),
        "steps_per_sec": statistics.fmean(r["steps_per_sec"] for r in runs),
        "train_steps": runs[0]["train_steps"],
        "images_per_run": runs[0]["images"],
    })
  return out


def _percent(x: float) -> str:
  return f"{100 * x:.1f}"


def result(points_: list[dict]) -> str:
  """Each point's mean top-1 against the first point's, and the spread."""
  first = points_[0]
  parts = [f"{p['label']}: {_percent(p['top1_mean'])}% "
           f"({100 * (p['top1_mean'] - first['top1_mean']):+.1f} points)"
           for p in points_[1:]]
  spread = max(100 * (p["top1_max"] - p["top1_min"]) for p in points_)
  return (f"against {first['label']} ({_percent(first['top1_mean'])}%): "
          + "; ".join(parts) + f". Largest min-max spread over seeds at "
          f"one point: {spread:.1f} points.")


def train_loss_note(runs: list[dict]) -> str:
  """What the table's train loss is. Records written before it was
  measured alike on both paths say so (stock Keras's then held fit's L2
  term and averaged its last quarter; the project's, its last host
  loop)."""
  measures = {r.get("train_loss_measure") for r in runs}
  if None not in measures:
    return "Train loss: " + "; ".join(sorted(measures)) + "."
  if any(r.get("path") == "stock_keras" for r in runs):
    return ("Train loss: the project's path's is its last host loop's "
            "cross-entropy; stock Keras's is fit's mean over the last "
            "quarter of the steps with the L2 term of its kernels: they "
            "are not comparable (these runs predate the measure both "
            "paths now share).")
  return "Train loss: the cross-entropy of the run's last host loop."


def markdown(study: dict) -> str:
  """Claim, setting, a table of every point, and what differs per point."""
  lines = [f"# {study['title']}", "", f"Claim: {study['claim']}", "",
           f"Command: `{study['command']}`  ", f"Machine: {study['machine']}"
           f"  ", f"Date: {study['date']}  ",
           f"Wall time: {study['seconds'] / 60:.1f} min"
           + (f" (calibration's estimate: "
              f"{study['estimated_seconds'] / 60:.1f} min)"
              if study.get("estimated_seconds") else ""), "",
           "Setting: " + study["setting"], "",
           "Result, " + result(study["points"]), ""]
  if study.get("code_version"):  # added to a record after it ran
    version = study["code_version"]
    lines += [f"Code: commit {version['commit']}. {version['note']}", ""]
  if study.get("chosen_lr_scales"):
    lines += ["LR rules chosen by study lr, as scales of the papers' "
              "peak LR: " + ", ".join(
                  f"{opt} x{factor:g}" for opt, factor in
                  study["chosen_lr_scales"].items()), ""]
  if study.get("stock_lr_scale"):  # recipe: stock Keras's own pick
    choice, recipe = study.get("choice"), study["recipe"]
    lines += [f"Stock Keras's momentum trained at "
              f"x{study['stock_lr_scale']:g} of the papers' peak LR"
              + (f", the pick of {choice['file']}" if choice else "")
              + f"; the recipe side at {recipe['optimizer']} "
              + ("peak " if recipe["learning_rate_scaling"] == "none" else
                 "base LR ") + f"{recipe['base_learning_rate']:g}"
              + ("" if recipe["learning_rate_scaling"] == "none" else
                 " per 256 images")
              + (f", train crops of at least "
                 f"{recipe['train_crop_min_area']:g} of the image"
                 if recipe["train_crop_min_area"] < 1 else "")
              + "; the flagfile holds the "
              "recipe side's pick: "
              + ("yes" if study.get("recipe_is_choice") else "no") + ".",
              ""]
  split = study.get("validation_split")  # the confirmatory comparison
  scored = "validation top-1" if study["name"] == "confirm_choice" else (
      "test top-1")
  if split:
    lines += [f"Validation split: {split['images']} of the "
              f"{split['source']} ({split['per_class']} a class, seed "
              f"{split['seed']}, drawn after the first "
              f"{split['drawn_after_index']}); every pick was made on it. "
              "LR grid searched by both sides: " + ", ".join(
                  f"x{f:g}" for f in study["search_spaces"][
                      "stock Keras"]["lr_scales"]) + ".", ""]
  if study.get("chosen"):  # a recipe choice: each side's pick
    centre = study.get("centre")
    rule = ("highest mean validation top-1; a tie keeps the nearer to the "
            "grid's centre" if split else "highest mean top-1; a tie keeps "
            "the first, the rule the grid is centred on")
    lines += [f"Picks ({rule}): " + "; ".join(
                  f"{side}: {pick['candidate']} "
                  f"({_percent(pick['top1_mean'])}%)"
                  for side, pick in study["chosen"].items())
              + (". Centred on " + "; ".join(
                  f"{side}: {name}" for side, name in centre.items()
                  if side != "file")
                 + f" (stock Keras's pick in {centre['file']}, the "
                 "recipe's flagfile)" if centre else "") + ".", ""]
  if study.get("prior"):  # the revised choice: the long picks compete
    prior = study["prior"]
    lines += [f"Also candidates, measured in {prior['file']} on the same "
              "seeds and listed first: " + "; ".join(
                  f"{side}: {pick['candidate']} "
                  f"({_percent(pick['top1_mean'])}%)"
                  for side, pick in prior.items() if side != "file")
              + ".", ""]
  lines += [
           "| criterion | gap (points) | pooled seed spread | steps at "
           "largest batch | control converged | verdict |",
           "|---|---|---|---|---|---|"]
  for v in study["verdicts"]:
    lines.append(
        f"| {v['criterion']} | {v['gap_points']:+.2f} | "
        f"{v['pooled_spread_points']:.2f} | {v['steps_at_largest_batch']} "
        f"(batch {v['largest_batch']}) | "
        f"{'yes' if v['control_converged'] else 'not converged'} | "
        f"{v['verdict']} |")
  lines += ["", "Criteria, declared before the runs: " + " ".join(
      study["criteria"]), "", train_loss_note(study["runs"]), "",
            f"| point | seeds | {scored} % (mean) | min-max | std | "
            "train loss | steps | steps/s |",
            "|---|---|---|---|---|---|---|---|"]
  for p in study["points"]:
    lines.append(
        f"| {p['label']} | {p['seeds']} | {_percent(p['top1_mean'])} | "
        f"{_percent(p['top1_min'])}-{_percent(p['top1_max'])} | "
        f"{_percent(p['top1_std'])} | {p['train_loss']:.3f} | "
        f"{p['train_steps']} | "
        f"{p['steps_per_sec']:.2f} |")
  shared = non_defaults(study["common_settings"])
  lines += ["", "Flags every run shares, where they differ from the "
            "defaults (the points differ in the rest):", "", "```",
            " ".join(f"--{k}={v}" for k, v in sorted(shared.items())),
            "```", "",
            f"Each run's full config is in {study['name']}.json."]
  return "\n".join(lines) + "\n"


def plot(study: dict, path: str) -> None:
  """Top-1 per point with min-max bars, grouped by the first point key;
  for c, the training loss of the first seed's runs beside it."""
  losses = study["x_key"] == "schedule"
  figure = Figure(figsize=(12 if losses else 7, 4))
  axis = figure.add_subplot(1, 2 if losses else 1, 1)
  if losses:
    _loss_curves(study, figure.add_subplot(1, 2, 2))
  order = list(dict.fromkeys(dict(p["point"])[study["x_key"]]
                             for p in study["points"]))
  series = {}
  for p in study["points"]:
    keys = dict(p["point"])
    x_key = study["x_key"]
    name = ", ".join(f"{k}={v}" for k, v in keys.items() if k != x_key)
    series.setdefault(name or "top-1", []).append((keys[x_key], p))
  for name, items in series.items():
    x = [order.index(v) if study["x_categorical"] else v for v, _ in items]
    mean = [100 * p["top1_mean"] for _, p in items]
    low = [100 * (p["top1_mean"] - p["top1_min"]) for _, p in items]
    high = [100 * (p["top1_max"] - p["top1_mean"]) for _, p in items]
    axis.errorbar(x, mean, yerr=[low, high], marker="o", capsize=3,
                  label=name)
    if study["x_categorical"]:
      axis.set_xticks(x, [str(v) for v, _ in items])
  if not study["x_categorical"]:
    axis.set_xscale("log", base=2)
  if study["x_key"] == "bn_group_size":  # a: the cost of grouping
    cost = axis.twinx()
    cost.plot([order.index(dict(p["point"])["bn_group_size"])
               for p in study["points"]],
              [p["steps_per_sec"] for p in study["points"]], "s",
              color="grey", label="steps/s")
    cost.set_ylabel("steps/s (grey squares)")
  axis.set_xlabel(study["x_key"])
  scored = ("validation" if study["name"] == "confirm_choice" else "test")
  axis.set_ylabel(f"{scored} top-1 % (mean; bars: min-max over seeds)")
  axis.set_title(study["title"], fontsize=9)
  axis.legend(fontsize=7)
  figure.tight_layout()
  figure.savefig(path, dpi=100)


def _loss_curves(study: dict, axis) -> None:
  """Training loss per host loop against the step, first seed."""
  seed = min(r["seed"] for r in study["runs"])
  for r in study["runs"]:
    if r["seed"] == seed:
      steps, loss = zip(*r["train_losses"])
      axis.plot(steps, loss, label=r["label"], linewidth=1)
  axis.set_xlabel("step")
  axis.set_ylabel(f"training loss per host loop (seed {seed})")
  axis.set_xscale("log")
  axis.legend(fontsize=7)


def write(study: dict, output_dir: str) -> list[str]:
  """Writes <name>.md, .json and .png into output_dir; returns the paths."""
  os.makedirs(output_dir, exist_ok=True)
  base = os.path.join(output_dir, study["name"])
  with open(base + ".json", "w") as f:
    json.dump(study, f, indent=1, sort_keys=True)
    f.write("\n")
  with open(base + ".md", "w") as f:
    f.write(markdown(study))
  plot(study, base + ".png")
  return [base + ext for ext in (".md", ".json", ".png")]
