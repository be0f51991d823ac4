"""Runs a study's TrainConfigs through resnet_tpu.run.run and times them.

Project runs train lab/study_model.narrow_resnet as run()'s model_fn;
stock-Keras runs go through lab/study_baseline.fit instead.

Runs share one process, one after another: each gets its own model_dir and
a fresh MirroredStrategy, whose collective keys are shifted first (as
tests/conftest.py does) so that two strategies never share an instance.
A run whose config equals an earlier one (study c's fixed batch is study
b's LARS run at that batch) is not trained twice. A "recomputed" run
(study a) evaluates the previous run's final checkpoint again with
--bn_stats=recompute: run() on a finished model_dir only evaluates. Only
metrics.jsonl and config.json are kept, the checkpoints until the next run.
"""
import dataclasses
import datetime
import gc
import json
import math
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
from lab import study_baseline
from lab.run_records import RecordStore
from lab import study_model
from lab import study_plan
from lab import study_report
from lab import study_settings
from lab import study_verdict
from lab.study_data import StudyData

# Eval images per step over all replicas (divisible by 8 and by 2).
EVAL_BATCH = 1000
CALIBRATION_STEPS = 5
RECORD_POLL_S = 15  # a worker waiting for another's run looks this often


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


def last_quarter_loss(train: list[dict]) -> float:
  """The mean training loss of the host loops in the run's last quarter of
  steps, weighted by their examples (study_baseline.TRAIN_LOSS)."""
  last = train[-1]["step"]
  kept = [r for r in train
          if r["step"] > last - last // study_baseline.EVALS] or train[-1:]
  kept = [r for r in kept if r["examples"]]  # a loop of skipped steps
  return (sum(r["loss"] * r["examples"] for r in kept)
          / sum(r["examples"] for r in kept))


class Runner:
  """Trains, remembers and reports the runs of the studies."""

  def __init__(self, data: StudyData, scale: study_plan.Scale, work_dir: str,
               output_dir: str, strategy: str, command: str,
               costs: dict[str, tuple[float, float, float, float]] | None
               = None, records: RecordStore | None = None):
    """costs: a calibration already made (kinds priced at another scale
    keep their prices: every run keeps its steps); records: where finished
    runs are kept and found again (a resumed study, or several workers)."""
    self.scale, self.work_dir, self.output_dir = scale, work_dir, output_dir
    self.command, self.data = command, data
    # The study's fixed choices; the plans add each run's own.
    self.base = TrainConfig.from_flat(
        model_dir="", data_dir=data.data_dir, strategy=strategy,
        resnet_depth=18, num_classes=data.num_classes, image_size=32,
        eval_batch_size=min(EVAL_BATCH, 8 * max(1, data.num_test // 8)),
        num_eval_images=data.num_test, num_train_images=data.num_train,
        steps_per_loop=scale.steps_per_loop,
        keep_checkpoints=1, shuffle_buffer_size=data.num_train,
        train_crop_min_area=study_plan.SMALL_IMAGE_CROP,
        label_smoothing=0.1)
    self._done: dict[str, dict] = {}
    self.records = records
    self._costs: dict[str, tuple[float, float, float, float]] = dict(
        costs or {})
    self._count = 0
    self._kept = ("", "")  # (key, model_dir) of the last checkpoints kept

  @property
  def costs(self) -> dict[str, tuple[float, float, float, float]]:
    """Each calibrated kind's step s, fixed s, CPU s a wall s, eval s."""
    return dict(self._costs)

  def _key(self, item: study_plan.Run) -> str:
    return json.dumps([item.path, list(item.features), item.zoom_min_area,
                       study_report.settings(item.cfg)], sort_keys=True)

  def execute(self, item: study_plan.Run, folder: str = "") -> dict:
    """Trains `item` (once per distinct config); returns its record."""
    key = self._key(item)
    if key in self._done:
      done = self._done[key]
      return dict(done, study=item.study, label=item.label,
                  point=item.point, reused=done["study"] != item.study)
    stored = self.records and item.path != "recomputed" and (
        self.records.get(key))
    if stored:
      logging.info("study %s, %s, seed %d: the stored record", item.study,
                   item.label, item.seed)
      self._done[key] = stored
      return dict(stored, study=item.study, label=item.label,
                  point=item.point, reused=stored["study"] != item.study)
    record = self._train(item, key, folder)
    self._done[key] = record
    if self.records and item.path != "recomputed":
      self.records.put(key, record)
    logging.info("study %s, %s, seed %d: test top-1 %.4f over %d images, "
                 "%.2f steps/s, %.0f s (estimated %.0f s)", item.study,
                 item.label, item.seed, record["top1"],
                 record["test_examples"], record["steps_per_sec"],
                 record["seconds"], record["estimated_seconds"])
    return record

  def _train(self, item: study_plan.Run, key: str, folder: str) -> dict:
    """Trains `item` (a recomputed run: evaluates again); its record."""
    if item.path == "recomputed":
      model_dir = self._trained_dir(item)
    else:
      self.discard_checkpoints()
      self._count += 1
      model_dir = os.path.join(self.work_dir, folder or item.study,
                               f"{self._count:03d}")
      shutil.rmtree(model_dir, ignore_errors=True)
    cfg = item.cfg.replace(model_dir=model_dir)
    # What the project's path trains cfg with, read back (study_settings).
    project_side = study_settings.project(cfg, study_model.narrow_resnet)
    start, cpu_start = time.time(), time.process_time()
    if item.path == "stock_keras":
      check_same_settings(cfg, project_side, item.features)
      record = study_baseline.fit(cfg, item.features, item.zoom_min_area)
      record.update(top5=float("nan"), test_examples=self.data.num_test)
    else:
      compat.shift_collective_keys(tf.distribute.MirroredStrategy, 100000)
      run(cfg, model_fn=study_model.narrow_resnet)
      record = self._project_record(model_dir)
      record["trained_with"] = project_side
      self._kept = (key, model_dir)
      if item.path == "recomputed":
        self.discard_checkpoints()
    record["trained_with"] = study_settings.without_curve(
        record["trained_with"])
    keras.backend.clear_session()
    gc.collect()
    largest = max(b for _, b in cfg.run.clock.batch_size_schedule)
    record.update(
        study=item.study, label=item.label, point=item.point, seed=item.seed,
        path=item.path, seconds=time.time() - start,
        estimated_seconds=self.estimated_seconds(item),
        cpu_seconds=time.process_time() - cpu_start, largest_batch=largest,
        steps_at_largest_batch=steps_at_batch(cfg, largest),
        settings=study_report.settings(cfg), reused=False)
    return record

  def _trained_dir(self, item: study_plan.Run) -> str:
    """The model_dir of the run `item` evaluates again: the last one,
    trained with `item`'s config but moving statistics."""
    trained = dataclasses.replace(
        item, path="project", cfg=item.cfg.replace(
            bn_stats="moving_average"))
    key, model_dir = self._kept
    if key != self._key(trained):
      raise ValueError(f"{item.study}, {item.label}: a recomputed run "
                       "must follow the run it evaluates again.")
    return model_dir

  def discard_checkpoints(self) -> None:
    """Removes the checkpoints kept for a recomputed run."""
    _, model_dir = self._kept
    for name in os.listdir(model_dir) if model_dir else []:
      if name.startswith(("ckpt", "checkpoint")):
        os.remove(os.path.join(model_dir, name))
    self._kept = ("", "")

  def _project_record(self, model_dir: str) -> dict:
    """The run's final eval, its quarter evals and training losses."""
    records = read_metrics(model_dir)
    train = [r for r in records if r["split"] == "train"]
    evals = [r for r in records if r["split"] == "eval"]
    final = evals[-1]
    return {"top1": final["top1"], "top5": final["top5"],
            "eval_seconds": final["examples"] / final["images_per_sec"],
            "eval_loss": final["loss"], "test_examples": final["examples"],
            "train_steps": final["step"], "train_loss": last_quarter_loss(train),
            "train_loss_measure": study_baseline.TRAIN_LOSS,
            "images": sum(r["examples"] for r in train),
            "steps_per_sec": steady_steps_per_sec(train),
            "evals": [(r["step"], r["top1"]) for r in evals],
            "train_losses": [(r["step"], r["loss"]) for r in train]}

  def execute_all(self, runs: list[study_plan.Run]) -> list[dict]:
    """Each run's record, in order. With `records`, a run another worker
    is training is passed by and waited for (RecordStore)."""
    if not self.records:
      return [self.execute(r) for r in runs]
    found: dict[int, dict] = {}
    while len(found) < len(runs):
      for i, run_ in enumerate(runs):
        key, claimed = self._key(run_), False
        if i in found:
          continue
        if not (key in self._done or self.records.get(key)):
          claimed = self.records.claim(key)
          if not claimed:
            continue
        try:
          found[i] = self.execute(run_)
        finally:
          if claimed:
            self.records.release(key)
      if len(found) < len(runs):
        time.sleep(RECORD_POLL_S)
    return [found[i] for i in range(len(runs))]

  def study(self, name: str, runs: list[study_plan.Run],
            criteria: list[study_verdict.Criterion],
            extra: dict | None = None,
            scale: study_plan.Scale | None = None) -> list[str]:
    """Runs `runs`, decides `criteria` and writes the md, json and png;
    `scale`: the runs' own, where it is not the runner's (recipe_long)."""
    records = self.execute_all(runs)
    scale = scale or self.scale
    text = study_report.TEXT[name]
    study = dict(
        name=text.file_name, title=text.title.format(
            per=scale.bn_per_replica), claim=text.claim,
        x_key=text.x_key, x_categorical=text.categorical,
        command=self.command, machine=machine(),
        date=datetime.date.today().isoformat(),
        seconds=sum(r["seconds"] for r in records if not r["reused"]),
        estimated_seconds=sum(r["estimated_seconds"] for r in records
                              if not r["reused"]),
        setting=study_report.setting(name, scale, self.data.name,
                                     self.data.num_test,
                                     len({r.seed for r in runs})),
        network=study_model.NAME, scale=dataclasses.asdict(scale),
        source=self.data.name,
        criteria=[c.describe() for c in criteria],
        verdicts=study_verdict.decide(criteria, records),
        baseline_convergence=study_verdict.baseline_convergence(
            records, study_plan.baselines(name, scale, runs)),
        common_settings=study_report.common_settings(records),
        points=study_report.points(records), runs=records, **(extra or {}))
    return study_report.write(study, self.output_dir)

  def best_optimizer(self, records: list[dict], batch: int) -> str:
    """The optimizer of the highest mean top-1 at `batch` (declared)."""
    at_batch = {}
    for r in records:
      point = dict(r["point"])
      if point["global_batch"] == batch:
        at_batch.setdefault(point["optimizer"], []).append(r["top1"])
    return max(at_batch, key=lambda k: statistics.fmean(at_batch[k]))

  def plan(self, names: list[str], with_lr: bool = True
           ) -> list[study_plan.Run]:
    """Every run the studies will train (b's last runs assume LARS, and
    b, c, baseline and crop the papers' LR rules: lr's choice only moves
    the LR, not the cost); without lr's when its choice is given."""
    base, scale, runs = self.base, self.scale, []
    if "a" in names:
      runs += study_plan.bn_runs(base, scale)
    if with_lr and any(name in study_plan.NEEDS_LR for name in names):
      runs += study_plan.lr_runs(base, scale)
    if "b" in names:
      runs += study_plan.large_batch_runs(base, scale)
      runs += study_plan.label_smoothing_runs(base, scale, "lars")
    if "c" in names:
      runs += study_plan.batch_control_runs(base, scale)
    if "baseline" in names:
      runs += study_plan.baseline_runs(base, scale)
    if "crop" in names:
      runs += study_plan.crop_runs(base, scale)
    if "ladder" in names:
      runs += study_plan.ladder_runs(base, scale)
    if "recipe_choice" in names:
      runs += study_plan.recipe_choice_runs(base, scale)
    if "recipe" in names:
      runs += study_plan.recipe_runs(base, scale)
    # The long grid's and the rounds' costs do not depend on the picks.
    recipe = study_plan.LARS_RECIPE
    if "recipe_long_choice" in names:
      runs += study_plan.recipe_long_choice_runs(base, scale, 1.0, recipe)
    for name, (_, candidates) in study_plan.ROUNDS.items():
      if name in names:
        runs += study_plan.round_choice_runs(
            base, scale, name, study_plan.next_stock_candidates(1.0)
            + candidates(1.0, recipe))
    for name in study_plan.CHECK_SEEDS:
      if name in names:
        runs += study_plan.long_check_runs(base, scale, name, recipe, 1.0)
    if "regime" in names:
      runs += study_plan.regime_runs(base, scale)
    unique = {self._key(r): r for r in runs}
    return list(unique.values())

  def describe(self, plan: list[study_plan.Run]) -> str:
    images = sum(micro_steps(r.cfg) * r.cfg.run.global_batch_size
                 for r in plan)
    return f"{images} training images in all"

  def estimate(self, plan: list[study_plan.Run]) -> tuple[float, float]:
    """Wall and CPU seconds of the plan from a few timed steps of each kind.

    Kinds already timed are not timed again (a shrunk plan times only its
    new ones). The CPU seconds bound the wall time on an idle machine:
    between them / cores and them. The calibration's run evaluates once;
    each further evaluation of a run (evaluations()) costs its kind's
    eval seconds (stock Keras: the slowest project kind's).
    """
    costs = self._costs
    trained = [r for r in plan if r.path != "recomputed"]
    for kind in sorted({kind_of(r) for r in trained} - set(costs)):
      # The largest BN group of a kind costs the most.
      example = max((r for r in trained if kind_of(r) == kind),
                    key=lambda r: r.cfg.model.bn_group_size)
      costs[kind] = self._calibrate(example)
      logging.info("Calibration of %s: %.3f s a micro-step, %.0f s fixed "
                   "(start-up, tracing, eval, checkpoint), %.2f CPU s a "
                   "wall s, %.0f s an evaluation", kind, *costs[kind])
    wall = cpu = 0.0
    by_study: dict[str, float] = {}
    for r in plan:
      seconds = self.estimated_seconds(r)
      wall, cpu = wall + seconds, cpu + seconds * costs[kind_of(r)][2]
      by_study[r.study] = by_study.get(r.study, 0.0) + seconds
    logging.info("Estimated minutes by study (a run shared by two counts "
                 "in the first): %s", ", ".join(
                     f"{k} {v / 60:.0f}" for k, v in by_study.items()))
    return wall, cpu

  def estimated_seconds(self, item: study_plan.Run) -> float:
    """Wall seconds of `item` by its kind's calibration (0 if none)."""
    if kind_of(item) not in self._costs:
      return 0.0
    step, fixed, _, eval_s = self._costs[kind_of(item)]
    if item.path == "recomputed":  # start-up and one evaluation
      return fixed
    if item.path == "stock_keras":
      eval_s = max(c[3] for c in self._costs.values())
    return (step * micro_steps(item.cfg) + fixed +
            (evaluations(item) - 1) * eval_s)

  def rescale(self, scale: study_plan.Scale) -> None:
    """Plans at `scale` from now on (its images, same data folder)."""
    self.scale = scale
    self.base = self.base.replace(num_train_images=scale.num_train,
                                  shuffle_buffer_size=scale.num_train)

  def _calibrate(self, item: study_plan.Run
                 ) -> tuple[float, float, float, float]:
    cfg = item.cfg.replace(
        batch_size_schedule="", train_steps=2 * CALIBRATION_STEPS,
        steps_per_loop=CALIBRATION_STEPS, train_epochs=0.0,
        lr_schedule="constant", warmup_epochs=0.0, eval_every_steps=0)
    record = self.execute(dataclasses.replace(item, cfg=cfg), "calibration")
    step = 1.0 / record["steps_per_sec"]
    return (step, max(0.0, record["seconds"] - 2 * CALIBRATION_STEPS * step),
            record["cpu_seconds"] / record["seconds"],
            record.get("eval_seconds", 0.0))


def check_same_settings(cfg: TrainConfig, project_side: dict,
                        features: tuple[str, ...] = ()) -> None:
  """Raises ValueError, before the stock run trains, when the stock-Keras
  side of `cfg` (with the project's `features`) would train with other
  shared settings (study_settings.SHARED) than the project's side read
  back as `project_side`, or its features are not what it claims."""
  stock = study_baseline.trained_with(study_baseline.build(cfg, features),
                                      cfg.run.total_train_steps)
  differ = (study_settings.differences(project_side, stock) +
            study_settings.feature_differences(project_side, stock,
                                               features))
  if differ:
    raise ValueError("The stock-Keras baseline and the project's path would "
                     "train with different settings (project, stock): "
                     + "; ".join(differ))


def evaluations(item: study_plan.Run) -> int:
  """Evaluations of the test set a run makes (the last at its end)."""
  if item.path == "stock_keras":
    return study_baseline.EVALS
  total = item.cfg.run.total_train_steps
  every = item.cfg.run.eval_every_steps or total
  return math.ceil(total / every)


def kind_of(item: study_plan.Run) -> str:
  """Runs of one kind cost the same per micro-step."""
  cfg = item.cfg
  if item.path == "stock_keras":
    return f"stock Keras, batch {cfg.run.clock.batch_size_schedule[-1][1]}"
  replicas = cfg.distribution.num_cpu_replicas
  return (f"{replicas} replicas x "
          f"{cfg.run.global_batch_size // replicas} images, BN group "
          f"{'1' if cfg.model.bn_group_size == 1 else '>1'}")


def steps_at_batch(cfg: TrainConfig, batch: int) -> int:
  """Optimizer steps of a run taken at global batch `batch`."""
  total = cfg.run.total_train_steps
  starts = list(cfg.run.clock.phase_start_steps()) + [total]
  return sum(min(end, total) - start for start, end, (_, b) in zip(
      starts, starts[1:], cfg.run.clock.batch_size_schedule)
      if b == batch and start < total)


def micro_steps(cfg: TrainConfig) -> int:
  """Forward-backward passes of a run, accumulated micro-batches included."""
  clock = cfg.run.clock
  total = cfg.run.total_train_steps
  starts = list(clock.phase_start_steps()) + [total]
  return sum((min(b, total) - a) * batch // cfg.run.global_batch_size
             for a, b, (_, batch) in zip(starts, starts[1:],
                                         clock.batch_size_schedule)
             if a < total)
