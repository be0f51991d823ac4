"""Writes a study's results: a markdown table, a JSON file and a PNG.

The JSON holds every run's exact TrainConfig (paths left out), its test
top-1/top-5 over every test image, its steps/s and seconds, and the
machine; the markdown and the plot are rendered from the same records, so
what the README quotes is what was measured.
"""
import dataclasses
import json
import os
import statistics

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from resnet_tpu.config import TrainConfig  # noqa: E402

# Fields that differ between machines, not between settings.
PATH_FIELDS = ("model_dir", "data_dir", "export_dir")


def settings(cfg: TrainConfig) -> dict:
  """The config of a run as a dict, paths left out."""
  return {k: v for k, v in dataclasses.asdict(cfg).items()
          if k not in PATH_FIELDS}


def common_settings(records: list[dict]) -> dict:
  """The settings every run of a study shares."""
  first = records[0]["settings"]
  return {k: v for k, v in first.items()
          if all(r["settings"][k] == v for r in records)}


def non_defaults(values: dict) -> dict:
  """The entries of `values` that differ from TrainConfig's defaults."""
  defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
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


def markdown(study: dict) -> str:
  """Claim, setting, a table of every point, and what differs per point."""
  lines = [f"# {study['title']}", "", f"Claim: {study['claim']}", "",
           f"Command: `{study['command']}`  ", f"Machine: {study['machine']}"
           f"  ", f"Date: {study['date']}  ",
           f"Wall time: {study['seconds'] / 60:.1f} min", "",
           "Setting: " + study["setting"], "",
           "Result, " + result(study["points"]), "",
           "| point | seeds | test top-1 % (mean) | min-max | std | "
           "steps | steps/s |", "|---|---|---|---|---|---|---|"]
  for p in study["points"]:
    lines.append(
        f"| {p['label']} | {p['seeds']} | {_percent(p['top1_mean'])} | "
        f"{_percent(p['top1_min'])}-{_percent(p['top1_max'])} | "
        f"{_percent(p['top1_std'])} | {p['train_steps']} | "
        f"{p['steps_per_sec']:.2f} |")
  shared = non_defaults(study["common_settings"])
  lines += ["", "Flags every run shares, where they differ from the "
            "defaults (the points differ in the rest):", "", "```",
            " ".join(f"--{k}={v}" for k, v in sorted(shared.items())),
            "```", "",
            f"Each run's full config is in {study['name']}.json."]
  return "\n".join(lines) + "\n"


def plot(study: dict, path: str) -> None:
  """Top-1 per point with min-max bars, grouped by the first point key."""
  figure = Figure(figsize=(7, 4))
  axis = figure.add_subplot()
  series = {}
  for p in study["points"]:
    keys = dict(p["point"])
    x_key = study["x_key"]
    name = ", ".join(f"{k}={v}" for k, v in keys.items() if k != x_key)
    series.setdefault(name or "top-1", []).append((keys[x_key], p))
  for name, items in series.items():
    x = list(range(len(items))) if study["x_categorical"] else [
        v for v, _ in items]
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
    cost.plot(range(len(study["points"])),
              [p["steps_per_sec"] for p in study["points"]], "s--",
              color="grey", label="steps/s")
    cost.set_ylabel("steps/s (dashed)")
  axis.set_xlabel(study["x_key"])
  axis.set_ylabel("test top-1 % (mean; bars: min-max over seeds)")
  axis.set_title(study["title"], fontsize=9)
  axis.legend(fontsize=7)
  figure.tight_layout()
  figure.savefig(path, dpi=100)


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
