"""Runs a study's TrainConfigs through resnet_tpu.run.run and times them.

Runs share one process, one after another: each gets its own model_dir and
a fresh MirroredStrategy, whose collective keys are shifted first (as
tests/conftest.py does) so that two strategies never share an instance.
A run whose config equals an earlier one (study c's fixed batch is study
b's LARS run at that batch) is not trained twice. After a run only its
metrics.jsonl and config.json are kept.
"""
import dataclasses
import datetime
import gc
import json
import os
import platform
import shutil
import statistics
import time

from absl import logging
import keras
import tensorflow as tf

from resnet_tpu.runtime import compat
from resnet_tpu.config import TrainConfig
from resnet_tpu.train.metrics_log import read_metrics
from resnet_tpu.run import run
from lab import study_plan
from lab import study_report
from lab.study_data import StudyData

# Eval images per step over all replicas (divisible by 8 and by 2).
EVAL_BATCH = 1000
CALIBRATION_STEPS = 5
TEXT = {
    "a": ("a_distributed_bn", "a. Distributed BN with {per} images per "
          "replica (Ying et al. 2018 §3.1)",
          "BN statistics over too few images hurt accuracy; pooling them "
          "over a group of replicas (distributed BN) recovers it, at the "
          "cost of an all-reduce per BN layer.", "bn_group_size", True),
    "b": ("b_large_batch", "b. Top-1 against the global batch at equal "
          "epochs (Goyal 2017; Ying 2018 §3; Akiba 2017)",
          "Momentum SGD with linear scaling and warm-up keeps small-batch "
          "accuracy up to about 8k (Goyal et al.); LARS goes further, to 32k "
          "(Ying et al. §3, after You et al. 2017); RMSprop warm-up with a "
          "slow start trains at 32k (Akiba et al.); label smoothing helps "
          "at large batches (Ying et al. §5).", "global_batch", False),
    "c": ("c_batch_size_control", "c. Batch-size control against a fixed "
          "final batch (Mikami et al. 2018)",
          "Growing the batch during training is more stable than training "
          "at the final, large batch from the start, at the same epochs.",
          "batch_size_schedule", True),
}


def machine() -> str:
  """CPU model, cores, TensorFlow version and load at start (no host name)."""
  model = platform.processor() or platform.machine()
  if os.path.exists("/proc/cpuinfo"):
    with open("/proc/cpuinfo") as f:
      names = [line.split(":", 1)[1].strip() for line in f
               if line.startswith("model name")]
    model = names[0] if names else model
  load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
  return (f"{model}, {os.cpu_count()} cores, TensorFlow {tf.__version__}, "
          f"load average {load:.1f} at start")


def steady_steps_per_sec(train: list[dict]) -> float:
  """Steps/s of the host loops after the first (which traces), if any."""
  loops, previous = [], 0
  for record in train:
    seconds = record["examples"] / max(record["images_per_sec"], 1e-9)
    loops.append((record["step"] - previous, seconds))
    previous = record["step"]
  steady = loops[1:] or loops
  return sum(s for s, _ in steady) / sum(t for _, t in steady)


class Runner:
  """Trains, remembers and reports the runs of the studies."""

  def __init__(self, data: StudyData, scale: study_plan.Scale, work_dir: str,
               output_dir: str, strategy: str, command: str):
    self.scale, self.work_dir, self.output_dir = scale, work_dir, output_dir
    self.command, self.data = command, data
    # The study's fixed choices; the plans add each run's own.
    self.base = TrainConfig(
        model_dir="", data_dir=data.data_dir, strategy=strategy,
        resnet_depth=18, num_classes=data.num_classes, image_size=32,
        eval_batch_size=min(EVAL_BATCH, 8 * max(1, data.num_test // 8)),
        num_eval_images=data.num_test, steps_per_loop=scale.steps_per_loop,
        keep_checkpoints=1, shuffle_buffer_size=data.num_train,
        train_crop_min_area=0.25, label_smoothing=0.1)
    self._done: dict[str, dict] = {}
    self._count = 0

  def _key(self, cfg: TrainConfig) -> str:
    return json.dumps(study_report.settings(cfg), sort_keys=True)

  def execute(self, item: study_plan.Run, folder: str = "") -> dict:
    """Trains `item` (once per distinct config); returns its record."""
    key = self._key(item.cfg)
    if key in self._done:
      done = self._done[key]
      return dict(done, study=item.study, label=item.label,
                  point=item.point, reused=done["study"] != item.study)
    self._count += 1
    model_dir = os.path.join(self.work_dir, folder or item.study,
                             f"{self._count:03d}")
    shutil.rmtree(model_dir, ignore_errors=True)
    cfg = dataclasses.replace(item.cfg, model_dir=model_dir)
    compat.shift_collective_keys(tf.distribute.MirroredStrategy, 100000)
    start, cpu_start = time.time(), time.process_time()
    run(cfg)
    seconds, cpu_seconds = (time.time() - start,
                            time.process_time() - cpu_start)
    records = read_metrics(model_dir)
    train = [r for r in records if r["split"] == "train"]
    final = [r for r in records if r["split"] == "eval"][-1]
    for name in os.listdir(model_dir):
      if name.startswith(("ckpt", "checkpoint")):
        os.remove(os.path.join(model_dir, name))
    keras.backend.clear_session()
    gc.collect()
    record = {
        "study": item.study, "label": item.label, "point": item.point,
        "seed": item.seed, "top1": final["top1"], "top5": final["top5"],
        "eval_loss": final["loss"], "test_examples": final["examples"],
        "train_steps": final["step"], "images": sum(r["examples"]
                                                    for r in train),
        "steps_per_sec": steady_steps_per_sec(train), "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "settings": study_report.settings(cfg), "reused": False}
    self._done[key] = record
    logging.info("study %s, %s, seed %d: test top-1 %.4f over %d images, "
                 "%.2f steps/s, %.0f s", item.study, item.label, item.seed,
                 record["top1"], record["test_examples"],
                 record["steps_per_sec"], seconds)
    return record

  def execute_all(self, runs: list[study_plan.Run]) -> list[dict]:
    return [self.execute(r) for r in runs]

  def study(self, name: str, runs: list[study_plan.Run],
            extra: dict | None = None) -> list[str]:
    """Runs `runs` and writes the study's md, json and png."""
    records = self.execute_all(runs)
    file_name, title, claim, x_key, categorical = TEXT[name]
    study = dict(
        name=file_name, title=title.format(per=self.scale.bn_per_replica),
        claim=claim, x_key=x_key,
        x_categorical=categorical, command=self.command, machine=machine(),
        date=datetime.date.today().isoformat(),
        seconds=sum(r["seconds"] for r in records if not r["reused"]),
        setting=self.setting(name, runs),
        scale=dataclasses.asdict(self.scale), source=self.data.name,
        common_settings=study_report.common_settings(records),
        points=study_report.points(records), runs=records, **(extra or {}))
    return study_report.write(study, self.output_dir)

  def best_optimizer(self, records: list[dict], batch: int) -> str:
    """The optimizer of the highest mean top-1 at `batch`."""
    at_batch = {}
    for r in records:
      point = dict(r["point"])
      if point["global_batch"] == batch:
        at_batch.setdefault(point["optimizer"], []).append(r["top1"])
    return max(at_batch, key=lambda k: statistics.fmean(at_batch[k]))

  def setting(self, name: str, runs: list[study_plan.Run]) -> str:
    """One paragraph of what every run of the study shares."""
    s, d = self.scale, self.data
    shared = (f"ResNet-18 at 32 px on {d.num_train} training images of "
              f"{d.name}, test top-1 over all {d.num_test} test "
              f"images; Inception crop of at least 25% of the area "
              f"(--train_crop_min_area=0.25), eval crop 0.875; "
              f"{len(s.seeds)} seed(s) per point. Each run follows its "
              f"recipe's 90-epoch schedule compressed into the images it "
              f"sees (one recipe epoch = --num_train_images = "
              f"{runs[0].cfg.num_train_images} images).")
    if name == "a":
      return (f"{s.replicas} CPU replicas x {s.bn_per_replica} images, "
              f"{s.bn_steps} steps, momentum SGD (0.1 per 256 images, 5 "
              f"warm-up epochs, x0.1 at 30/60/80), label smoothing 0.1. "
              + shared)
    return (f"{s.micro_replicas} CPU replicas x {s.micro_per_replica} "
            f"images a micro-batch (the BN batch); larger global batches "
            f"accumulate micro-batches; {s.passes:g} passes over the "
            f"training images per run; LR rules of lab/study_plan.py; "
            f"label smoothing 0.1 unless the point says 0.0. " + shared)

  def plan(self, names: list[str]) -> list[study_plan.Run]:
    """Every run the studies will train (b's last runs assume LARS)."""
    runs = []
    if "a" in names:
      runs += study_plan.bn_runs(self.base, self.scale)
    if "b" in names:
      runs += study_plan.large_batch_runs(self.base, self.scale)
      runs += study_plan.label_smoothing_runs(self.base, self.scale, "lars")
    if "c" in names:
      runs += study_plan.batch_control_runs(self.base, self.scale)
    unique = {self._key(r.cfg): r for r in runs}
    return list(unique.values())

  def describe(self, plan: list[study_plan.Run]) -> str:
    images = sum(micro_steps(r.cfg) * r.cfg.global_batch_size for r in plan)
    return f"{images} training images in all"

  def estimate(self, plan: list[study_plan.Run]) -> tuple[float, float]:
    """Wall and CPU seconds of the plan from a few timed steps of each kind.

    Both include the calibration itself. The CPU seconds bound the wall
    time on an idle machine: between them / cores and them.
    """
    start, cpu_start = time.time(), time.process_time()
    costs = {}
    for kind in sorted({kind_of(r.cfg) for r in plan}):
      # The largest BN group of a kind costs the most.
      example = max((r for r in plan if kind_of(r.cfg) == kind),
                    key=lambda r: r.cfg.bn_group_size)
      costs[kind] = self._calibrate(example)
      logging.info("Calibration of %s: %.3f s a micro-step, %.0f s fixed "
                   "(start-up, tracing, eval, checkpoint), %.2f CPU s a "
                   "wall s", kind, *costs[kind])
    wall = cpu = 0.0
    for r in plan:
      step, fixed, cpu_per_wall = costs[kind_of(r.cfg)]
      seconds = step * micro_steps(r.cfg) + fixed
      wall, cpu = wall + seconds, cpu + seconds * cpu_per_wall
    return (wall + time.time() - start,
            cpu + time.process_time() - cpu_start)

  def _calibrate(self, item: study_plan.Run) -> tuple[float, float, float]:
    cfg = dataclasses.replace(
        item.cfg, batch_size_schedule="", train_steps=2 * CALIBRATION_STEPS,
        steps_per_loop=CALIBRATION_STEPS, train_epochs=0.0,
        lr_schedule="constant", warmup_epochs=0.0)
    record = self.execute(dataclasses.replace(item, cfg=cfg), "calibration")
    step = 1.0 / record["steps_per_sec"]
    return (step, max(0.0, record["seconds"] - 2 * CALIBRATION_STEPS * step),
            record["cpu_seconds"] / record["seconds"])


def kind_of(cfg: TrainConfig) -> str:
  """Runs of one kind cost the same per micro-step."""
  return (f"{cfg.num_cpu_replicas} replicas x "
          f"{cfg.global_batch_size // cfg.num_cpu_replicas} images, BN group "
          f"{'1' if cfg.bn_group_size == 1 else '>1'}")


def micro_steps(cfg: TrainConfig) -> int:
  """Forward-backward passes of a run, accumulated micro-batches included."""
  clock = cfg.clock
  total = cfg.total_train_steps
  starts = list(clock.phase_start_steps()) + [total]
  return sum((min(b, total) - a) * batch // cfg.global_batch_size
             for a, b, (_, batch) in zip(starts, starts[1:],
                                         clock.batch_size_schedule)
             if a < total)
