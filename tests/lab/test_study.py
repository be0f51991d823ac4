"""lab/study.py --smoke runs every study end to end, so the tool cannot rot;
the verdict rules of lab/study_verdict.py are checked on made-up numbers.

The data are a made-up Fashion-MNIST in the package's own idx format (300
training and 150 test images of a bar whose row is the class), so the test
needs neither the Debian package nor a download, and goes through the same
path as `make study`: idx files -> class-folder JPEGs ->
data/build_tfrecords.py -> resnet_tpu.run.run -> eval of every test image.
No accuracy is asserted: results live in bench_results/studies.
"""
import gzip
import json
import math
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from lab import study_data
from lab import study_verdict as sv

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
STUDIES = ("a_distributed_bn", "lr_choice", "b_large_batch",
           "c_batch_size_control", "baseline_stock_keras",
           "crop_small_images", "b_regime")  # ladder, recipe*: below
NUM_TEST = 100  # the smoke scale's test images (study_plan.SMOKE)
BETTER = sv.Criterion("b beats a", (("x", "a"),), (("x", "b"),))
SAME = sv.Criterion("b keeps a", (("x", "a"),), (("x", "b"),), sv.WITHIN,
                    margin=1.0)


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
       "--studies=lr,a,b,c,baseline,crop,ladder,recipe_choice,recipe,regime",
       f"--fashion_mnist_dir={root / 'idx'}", f"--cache_dir={root / 'cache'}",
       f"--work_dir={root / 'work'}", f"--output_dir={root / 'out'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return root


# Seed spreads: [0.50, 0.52] and [0.60, 0.62] pool to 1.4 points.
@pytest.mark.parametrize("criterion, control, treatment, expected", [
    (BETTER, [0.50, 0.52], [0.60, 0.62], sv.HELD),  # +10 > 2 x 1.4
    (BETTER, [0.60, 0.62], [0.50, 0.52], sv.NOT_HELD),  # -10 < -2 x 1.4
    (BETTER, [0.50, 0.52], [0.51, 0.53], sv.UNDECIDED),  # +1 within 2.8
    (SAME, [0.500, 0.501], [0.502, 0.503], sv.HELD),  # 0.2 +- 0.1 in 1
    (SAME, [0.50, 0.52], [0.60, 0.62], sv.NOT_HELD),  # 10 - 2.8 > 1
    (SAME, [0.50, 0.52], [0.51, 0.53], sv.UNDECIDED),  # 1 +- 2.8 spans 1
    (SAME, [0.50, 0.52], [0.505, 0.525], sv.UNDECIDED),  # 0.5 +- 2.8
    (BETTER, [0.10], [0.90], sv.UNDECIDED),  # one seed: no spread
])
def test_verdict_follows_the_pre_declared_rule(criterion, control, treatment,
                                               expected):
  result = sv.verdict(criterion, control, treatment)
  assert result["verdict"] == expected, result


def test_verdict_needs_paired_seeds():
  with pytest.raises(ValueError, match="Paired seeds"):
    sv.verdict(BETTER, [0.5, 0.6], [0.5])


def test_converged_when_top1_at_75_percent_is_within_a_point_of_final():
  assert sv.convergence([(25, 0.5), (75, 0.795), (100, 0.80)], 100)[
      "converged"]
  late_gain = sv.convergence([(25, 0.5), (75, 0.70), (100, 0.80)], 100)
  assert not late_gain["converged"]
  assert late_gain["gain_points"] == pytest.approx(10.0)


def test_decide_pairs_seeds_and_reports_the_largest_batch_steps():
  def record(x, seed, top1, batch, steps):
    return {"point": (("x", x),), "seed": seed, "top1": top1,
            "evals": [(75, top1), (100, top1)], "train_steps": 100,
            "largest_batch": batch, "steps_at_largest_batch": steps}
  records = [record("a", 0, 0.50, 32, 3000), record("a", 1, 0.52, 32, 3000),
             record("b", 1, 0.62, 1024, 100), record("b", 0, 0.60, 1024, 100)]
  result, = sv.decide([BETTER], records)
  assert result["verdict"] == sv.HELD
  assert result["gap_points"] == pytest.approx(10.0)
  assert (result["largest_batch"], result["steps_at_largest_batch"]) == (
      1024, 100)
  assert result["control_converged"]


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
    text = f.read()
  assert "| point | seeds | test top-1 % (mean) |" in text
  assert "| criterion | gap (points) |" in text


@pytest.mark.parametrize("name", STUDIES)
def test_every_run_is_recorded_with_its_config_and_every_test_image(smoke,
                                                                    name):
  with open(smoke / "out" / (name + ".json")) as f:
    study = json.load(f)
  assert study["runs"] and study["points"] and study["baseline_convergence"]
  # lr chooses; the others decide their pre-declared criteria.
  assert name == "lr_choice" or (study["verdicts"] and study["criteria"])
  for run in study["runs"]:
    assert run["test_examples"] == NUM_TEST
    assert "estimated_seconds" in run
    assert run["settings"]["num_eval_images"] == NUM_TEST
    assert "model_dir" not in run["settings"]
  assert "Fashion-MNIST" in study["setting"]


def test_both_paths_record_their_training_loss_alike(smoke):
  """fit's logged loss holds the kernels' L2 term; the project's does not.
  Both records hold the data loss over the last quarter of the steps."""
  from lab import study_baseline
  with open(smoke / "out" / "baseline_stock_keras.json") as f:
    study = json.load(f)
  paths = {run["path"] for run in study["runs"]}
  assert paths == {"stock_keras", "project"}
  for run in study["runs"]:
    assert run["train_loss_measure"] == study_baseline.TRAIN_LOSS
    if run["path"] == "stock_keras":
      assert run["settings"]["weight_decay"] > 0
      assert 0 < run["train_loss"] < run["train_loss_with_l2"]
      assert run["train_losses"][-1][1] == run["train_loss"]
  with open(smoke / "out" / "baseline_stock_keras.md") as f:
    assert f"Train loss: {study_baseline.TRAIN_LOSS}." in f.read()


def test_the_project_s_train_loss_averages_its_last_quarter():
  from lab import study_runner
  loops = [{"step": 5 * (i + 1), "loss": float(10 - i), "examples": 40}
           for i in range(8)]  # 40 steps: the last quarter is 31-40
  assert study_runner.last_quarter_loss(loops) == pytest.approx(3.5)
  loops[-1]["examples"] = 120  # weighted by its examples: (4*40 + 3*120) / 160
  assert study_runner.last_quarter_loss(loops) == pytest.approx(3.25)


def test_records_from_before_the_shared_measure_say_they_differ():
  from lab import study_report
  old = [{"path": "stock_keras"}, {"path": "project"}]
  assert "not comparable" in study_report.train_loss_note(old)
  assert "last host loop" in study_report.train_loss_note(old[1:])


def test_b_c_baseline_and_crop_train_with_lr_s_choice(smoke):
  from lab import study_plan
  with open(smoke / "out" / "lr_choice.json") as f:
    chosen = json.load(f)["chosen_lr_scales"]
  assert set(chosen) == set(study_plan.OPTIMIZERS)
  for name in STUDIES[2:]:
    with open(smoke / "out" / (name + ".json")) as f:
      study = json.load(f)
    assert study["chosen_lr_scales"] == chosen, name
    for run in study["runs"]:
      optimizer = run["settings"]["optimizer"]
      papers = study_plan.optimizer_rule(optimizer, 1.0)
      assert run["settings"]["base_learning_rate"] == pytest.approx(
          chosen[optimizer] * papers["base_learning_rate"]), name


def test_a_evaluates_each_final_weights_with_both_statistics(smoke):
  with open(smoke / "out" / "a_distributed_bn.json") as f:
    runs = json.load(f)["runs"]
  recomputed = [r for r in runs if r["path"] == "recomputed"]
  assert recomputed
  for again in recomputed:
    trained = [r for r in runs if r["path"] == "project" and r["seed"] ==
               again["seed"] and r["point"][0] == again["point"][0]]
    assert len(trained) == 1
    trained = trained[0]
    # The same model_dir: its training, then one more evaluation.
    assert again["train_losses"] == trained["train_losses"]
    assert again["evals"][:-1] == trained["evals"]
    assert again["evals"][-1][0] == trained["evals"][-1][0]
    assert again["settings"]["bn_stats"] == "recompute"


def test_a_recomputed_run_follows_the_run_whose_weights_it_evaluates():
  from lab import study_plan
  from resnet_tpu.config import TrainConfig
  scale = study_plan.DEFAULT
  runs = study_plan.bn_runs(TrainConfig.from_flat(
      "", num_train_images=scale.num_train), scale, {"momentum": 2.0})
  assert len(runs) == len(scale.bn_groups) * len(scale.seeds) * 2
  for previous, run in zip(runs, runs[1:]):
    if run.path == "recomputed":
      assert previous.path == "project"
      assert run.cfg.replace(bn_stats="moving_average") == previous.cfg
  assert {r.cfg.optim.base_learning_rate for r in runs} == {0.2}


def test_sigterm_stops_the_studies_even_in_a_run_s_final_eval(smoke,
                                                               tmp_path):
  """The trainer lets a run in its last host loop or final eval finish on
  SIGTERM; lab/study.py must still stop after it, not train on (seen with
  an 8-replica eval of 85 s). SIGTERM comes once the first run has logged
  its second-last host loop (smoke: 4 steps a loop), so it lands in the
  last loop or the final eval."""
  log_path = tmp_path / "study.log"
  with open(log_path, "w") as log:
    process = subprocess.Popen(
        [sys.executable, "-m", "lab.study", "--smoke", "--studies=lr",
         f"--fashion_mnist_dir={smoke / 'idx'}",
         f"--cache_dir={smoke / 'cache'}", f"--work_dir={tmp_path / 'work'}",
         f"--output_dir={tmp_path / 'out'}"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
  try:
    deadline = time.time() + 300
    while not any(0 < int(total) - int(step) <= 4 for step, total in
                  re.findall(r"step (\d+)/(\d+):", log_path.read_text())):
      assert process.poll() is None and time.time() < deadline, (
          log_path.read_text()[-3000:])
      time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    code = process.wait(timeout=120)
  finally:
    if process.poll() is None:
      process.kill()
      process.wait()
  text = log_path.read_text()
  assert code != 0, text[-3000:]
  assert "study lr, " not in text.split("SIGTERM")[-1], text[-3000:]
  assert not (tmp_path / "out" / "lr_choice.json").exists()


def test_the_smoke_reads_jpegs_built_from_the_idx_files(smoke):
  folders = smoke / "cache" / "images_200_100"
  counts = {split: sum(len(files) for _, _, files in os.walk(folders / split))
            for split in ("train", "validation")}
  assert counts == {"train": 200, "validation": NUM_TEST}
  assert sorted(os.listdir(folders / "train")) == list(
      study_data.FASHION_MNIST_CLASSES)


def test_project_runs_evaluate_at_75_percent_and_at_the_end():
  from lab import study_plan
  from resnet_tpu.config import TrainConfig
  base = TrainConfig.from_flat("", num_train_images=1000, label_smoothing=0.1)
  for run in study_plan.crop_runs(base, study_plan.DEFAULT):
    total = run.cfg.run.total_train_steps
    every = run.cfg.run.eval_every_steps
    evals = [s for s in range(1, total + 1) if s % every == 0 or s == total]
    assert len(evals) == 2 and abs(evals[0] - 0.75 * total) <= 1, evals


def test_the_estimate_prices_each_evaluation_after_the_calibrated_one(
    tmp_path):
  from lab import study_plan
  from lab import study_runner
  data = study_data.StudyData(str(tmp_path), 1000, 500, 10, "made up")
  runner = study_runner.Runner(data, study_plan.SMOKE, str(tmp_path),
                               str(tmp_path), "cpu", "")
  plan = runner.plan(["crop", "baseline"])
  # step s, fixed s, CPU s a wall s, eval s: made up, one kind each.
  runner._costs = {study_runner.kind_of(r): (0.0, 0.0, 1.0, 10.0)
                   for r in plan}
  wall, _ = runner.estimate(plan)
  stock = [r for r in plan if r.path == "stock_keras"]
  assert stock and len(stock) < len(plan)
  # Project runs: one more evaluation than the calibration's; stock: three.
  assert wall == 10.0 * ((len(plan) - len(stock)) * 1 + len(stock) * 3)
  # Each run's record carries its own share (estimated against measured).
  assert sum(runner.estimated_seconds(r) for r in plan) == wall


def test_a_runner_of_the_fitted_scale_keeps_the_calibration(tmp_path):
  """lab/study.py makes a new runner for the data of the scale that fits;
  without the calibration its runs would record an estimate of 0 s."""
  from lab import study_plan
  from lab import study_runner
  data = study_data.StudyData(str(tmp_path), 1000, 500, 10, "made up")
  runner = study_runner.Runner(data, study_plan.SMOKE, str(tmp_path),
                               str(tmp_path), "cpu", "")
  plan = runner.plan(["crop"])
  runner._costs = {study_runner.kind_of(r): (0.5, 7.0, 1.0, 10.0)
                   for r in plan}
  smaller = study_data.StudyData(str(tmp_path), 500, 500, 10, "made up")
  fitted = study_runner.Runner(smaller, study_plan.SMOKE, str(tmp_path),
                               str(tmp_path), "cpu", "", runner.costs)
  assert fitted.costs == runner.costs
  assert all(fitted.estimated_seconds(r) == runner.estimated_seconds(r) > 7
             for r in fitted.plan(["crop"]))


def _lr_record(optimizer, factor, top1, seed=0):
  return {"point": (("optimizer", optimizer), ("lr_scale", factor)),
          "seed": seed, "top1": top1}


def test_the_lr_choice_keeps_the_best_scale_and_a_tie_the_papers_value():
  from lab import study_plan
  records = [_lr_record("momentum", 0.5, 0.70), _lr_record("momentum", 1.0,
                                                           0.71),
             _lr_record("momentum", 2.0, 0.74),
             _lr_record("lars", 0.5, 0.72), _lr_record("lars", 1.0, 0.72),
             _lr_record("lars", 2.0, 0.60),
             _lr_record("rmsprop_warmup", 0.5, 0.65),
             _lr_record("rmsprop_warmup", 0.5, 0.63, seed=1),
             _lr_record("rmsprop_warmup", 1.0, 0.62)]
  assert study_plan.chosen_lr_scales(records) == {
      "momentum": 2.0, "lars": 1.0, "rmsprop_warmup": 0.5}


def test_the_chosen_lr_reaches_every_run_of_b_c_baseline_and_crop():
  from lab import study_plan
  from resnet_tpu.config import TrainConfig
  scale = study_plan.DEFAULT
  base = TrainConfig.from_flat("", num_train_images=scale.num_train,
                               label_smoothing=0.1)
  chosen = {"momentum": 2.0, "lars": 0.5, "rmsprop_warmup": 1.0}
  runs = (study_plan.large_batch_runs(base, scale, chosen)
          + study_plan.label_smoothing_runs(base, scale, "lars", chosen)
          + study_plan.batch_control_runs(base, scale, chosen)
          + study_plan.baseline_runs(base, scale, chosen)
          + study_plan.crop_runs(base, scale, chosen))
  papers = {opt: study_plan.optimizer_rule(opt, 1.0)["base_learning_rate"]
            for opt in study_plan.OPTIMIZERS}
  for run in runs:
    optimizer = run.cfg.optim.optimizer
    assert run.cfg.optim.base_learning_rate == pytest.approx(
        chosen[optimizer] * papers[optimizer]), (run.study, run.label)
  assert {r.cfg.optim.optimizer for r in runs} == set(chosen)


def test_lr_trains_the_papers_values_once_with_b():
  from lab import study_plan
  from lab import study_runner
  scale = study_plan.DEFAULT
  data = study_data.StudyData("", scale.num_train, scale.num_test, 10,
                              "made up")
  runner = study_runner.Runner(data, scale, "", "", "cpu", "")
  lr = runner.plan(["lr"])
  b = study_plan.large_batch_runs(runner.base, scale)
  assert len(lr) == len(study_plan.OPTIMIZERS) * len(study_plan.LR_SCALES)
  shared = {runner._key(r) for r in lr} & {runner._key(r) for r in b}
  assert len(shared) == len(study_plan.OPTIMIZERS)  # the 1.0 runs, seed 0


def test_a_smaller_scale_keeps_every_run_s_steps():
  from lab import study_plan
  from resnet_tpu.config import TrainConfig
  base = TrainConfig.from_flat("", label_smoothing=0.1)

  def steps(scale):
    sized = base.replace(num_train_images=scale.num_train)
    plan = (study_plan.bn_runs(sized, scale)
            + study_plan.lr_runs(sized, scale)
            + study_plan.large_batch_runs(sized, scale)
            + study_plan.batch_control_runs(sized, scale)
            + study_plan.baseline_runs(sized, scale)
            + study_plan.crop_runs(sized, scale))
    return [(r.study, r.seed, r.cfg.run.total_train_steps) for r in plan]

  default = study_plan.DEFAULT
  assert steps(default.shrunk().shrunk()) == steps(default)


class _FakeRunner:
  """Estimates in minutes by training images, as the calibration would."""

  def __init__(self, minutes: dict):
    from lab import study_plan
    self.scale, self.minutes = study_plan.DEFAULT, minutes

  def plan(self, names, with_lr=True):
    return []

  def estimate(self, plan):
    return 60 * self.minutes[self.scale.num_train], 0.0

  def rescale(self, scale):
    self.scale = scale


@pytest.mark.parametrize("minutes, budget, expected", [
    # Per-step overhead: one halving saves nothing, the next does.
    ({10240: 137, 5120: 133, 2560: 65}, 90, 2560),
    ({10240: 80}, 90, 10240),
    # Nothing fits: the cheapest, not the last.
    ({10240: 137, 5120: 120, 2560: 125, 1280: 130, 640: 140}, 90, 5120),
])
def test_the_budget_fit_halves_the_images_until_the_plan_fits(
    minutes, budget, expected):
  from lab import study
  runner = _FakeRunner(minutes)
  assert study.fit_budget([], runner, 60 * budget, True).num_train == expected


def test_the_ladder_adds_one_feature_a_rung_and_records_what_each_took(smoke):
  from lab import study_model
  from lab import study_plan
  with open(smoke / "out" / "ladder.json") as f:
    study = json.load(f)
  rungs = [dict(p["point"])["rung"] for p in study["points"]]
  chosen = study["chosen_lr_scales"]["momentum"]
  assert rungs == [name for name, _ in study_plan.ladder_points(chosen)] + [
      study_plan.PROJECT_RUNG] + [f"project - {f}"
                                  for f in study_model.FEATURES]
  gains = {dict(r["point"])["rung"]: r["trained_with"]["conv_init_gain"]
           for r in study["runs"]}
  assert gains["stock Keras, LR x1 (Goyal's 0.1 per 256)"] > 1.3
  assert gains["+ conv_init"] < 1.1 and gains["project - conv_init"] > 1.3
  assert len(study["verdicts"]) == len(rungs) - 1


def test_lr_choice_is_taken_only_at_the_scale_it_was_chosen_at(tmp_path):
  import dataclasses
  from lab import study
  from lab import study_plan
  scale = study_plan.DEFAULT.shrunk().shrunk()
  path = tmp_path / "lr_choice.json"
  path.write_text(json.dumps({"scale": dataclasses.asdict(scale),
                              "chosen_lr_scales": {"momentum": 2.0}}))
  assert study.chosen_lr_scales(str(path), scale) == {"momentum": 2.0}
  with pytest.raises(ValueError, match=r"--lr_choice=.* was chosen at "
                     r"another scale \(2560 images, batches \[8, 256\]\) "
                     r"than this run's \(5120, \[16, 512\]\)"):
    study.chosen_lr_scales(str(path), study_plan.DEFAULT.shrunk())


def test_the_regime_scale_is_in_the_papers_regime():
  """Issue 36: the largest batch at most 2.5 % of the images a step (Ying
  et al.'s 32k of ImageNet), at least 30 epochs, and every regime run
  trains those epochs at its batch with the given LR rules."""
  from lab import study_plan
  from lab import study_runner
  from resnet_tpu.config import TrainConfig
  scale = study_plan.REGIME
  largest = max(scale.batches)
  assert largest <= study_plan.REGIME_MAX_BATCH_FRACTION * scale.num_train
  assert scale.epochs >= study_plan.REGIME_MIN_EPOCHS
  base = TrainConfig.from_flat("", num_train_images=scale.num_train,
                               label_smoothing=0.1)
  chosen = {"momentum": 2.0, "lars": 0.5}
  runs = study_plan.regime_runs(base, scale, chosen)
  assert len(runs) == (len(study_plan.REGIME_OPTIMIZERS)
                       * len(scale.batches) * len(scale.seeds))
  for run in runs:
    batch = dict(run.point)["global_batch"]
    steps = study_runner.steps_at_batch(run.cfg, batch)
    assert steps * batch == scale.epochs * scale.num_train, run.label
    optimizer = run.cfg.optim.optimizer
    assert run.cfg.optim.base_learning_rate == pytest.approx(
        chosen[optimizer] * study_plan.optimizer_rule(
            optimizer, 1.0)["base_learning_rate"])
  assert {dict(r.point)["optimizer"] for r in runs
          if dict(r.point)["global_batch"] == largest} == {"momentum",
                                                           "lars"}
  names = [c.name for c in study_plan.regime_criteria(scale)]
  assert f"lars beats momentum at {largest}" in names


def test_the_regime_runs_alone_at_its_own_scale():
  result = subprocess.run(
      [sys.executable, "-m", "lab.study", "--studies=regime,b"],
      cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  assert "--studies=regime runs alone" in result.stderr


def test_the_regime_takes_an_lr_choice_made_at_another_scale(tmp_path):
  import dataclasses
  from lab import study
  from lab import study_plan
  scale = study_plan.DEFAULT.shrunk().shrunk()
  record = dataclasses.asdict(scale)
  del record["train_epochs"]  # a file older than the field: its default
  path = tmp_path / "lr_choice.json"
  path.write_text(json.dumps({"scale": record,
                              "chosen_lr_scales": {"momentum": 2.0}}))
  assert study.chosen_lr_scales(str(path), scale) == {"momentum": 2.0}
  with pytest.raises(ValueError, match="another scale"):
    study.chosen_lr_scales(str(path), study_plan.REGIME)
  assert study.chosen_lr_scales(str(path), study_plan.REGIME,
                                any_scale=True) == {"momentum": 2.0}
  assert study.lr_choice_source(str(path)) == {
      "file": str(path), "num_train": 2560, "batches": [8, 256]}


def test_the_recipe_check_trains_stock_keras_at_the_choice_s_rule(smoke):
  """recipe_choice picks each side's rule on its seeds; recipe, run in the
  same command, trains stock Keras at the chosen LR, records the choice
  and whether the flagfile holds the recipe side's choice."""
  from lab import study_plan
  with open(smoke / "out" / "recipe_choice.json") as f:
    choice = json.load(f)
  with open(smoke / "out" / "recipe_small_images.json") as f:
    check = json.load(f)
  assert not choice["verdicts"] and choice["baseline_convergence"]
  assert {r["seed"] for r in choice["runs"]} == set(
      study_plan.RECIPE_CHOICE_SEEDS)
  assert {r["seed"] for r in check["runs"]} == set(study_plan.RECIPE_SEEDS)
  assert "3 paired seed(s)" in check["setting"]
  chosen = choice["chosen"]
  assert check["choice"]["stock Keras"] == chosen["stock Keras"]
  assert check["choice"]["file"].endswith("recipe_choice.json")
  scale = chosen["stock Keras"]["lr_scale"]
  assert check["stock_lr_scale"] == scale
  for run in check["runs"]:
    if run["path"] == "stock_keras":
      assert run["settings"]["base_learning_rate"] == pytest.approx(
          0.1 * scale)
  assert check["recipe_is_choice"] == (
      check["recipe"] == chosen["recipe"]["settings"])
  with open(smoke / "out" / "recipe_small_images.md") as f:
    assert f"Stock Keras's momentum trained at x{scale:g} of the papers' " \
        "peak LR, the pick of " in f.read()


def smoke_again(folder, studies: str):
  """`studies` as a command of their own in the smoke's `folder` (as
  their make target): they read the choices the smoke wrote there."""
  result = subprocess.run(
      [sys.executable, "-m", "lab.study", "--smoke", f"--studies={studies}",
       f"--fashion_mnist_dir={folder / 'idx'}",
       f"--cache_dir={folder / 'cache'}", f"--work_dir={folder / 'work'}",
       f"--output_dir={folder / 'out'}"],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  return folder


@pytest.fixture(scope="module")
def smoke_long(smoke):
  """The long recipe studies, a command of their own (as make
  study-recipe-long): they read the smoke's recipe_choice.json."""
  return smoke_again(smoke, "recipe_long_choice,recipe_long")


def test_the_long_check_trains_the_long_choice_s_picks_at_3x_the_steps(
    smoke_long):
  """recipe_long_choice centres each side's LR grid on recipe_choice.json's
  picks at three times the epochs; recipe_long, in the same command,
  trains each side at the long choice's pick on RECIPE_LONG_SEEDS."""
  from lab import study_plan
  out = smoke_long / "out"
  choice, long_choice, check = (
      json.loads((out / f"{name}.json").read_text()) for name in (
          "recipe_choice", "recipe_long_choice", "recipe_long"))
  centre = choice["chosen"]["stock Keras"]["lr_scale"]
  assert sorted({r["settings"]["base_learning_rate"] for r in
                 long_choice["runs"] if r["path"] == "stock_keras"}) == \
      pytest.approx([0.05 * centre, 0.1 * centre, 0.2 * centre])
  assert long_choice["centre"]["file"].endswith("recipe_choice.json")
  assert {r["seed"] for r in check["runs"]} == set(
      study_plan.RECIPE_LONG_SEEDS)
  epochs, scale = study_plan.SMOKE.epochs, check["scale"]
  assert long_choice["scale"]["train_epochs"] == scale["train_epochs"] == (
      3 * epochs)
  # Three times the epochs, in whole quarters (model.fit's evaluations).
  steps = 3 * epochs * scale["num_train"] / min(scale["batches"])
  assert {r["train_steps"] for r in long_choice["runs"] + check["runs"]} \
      == {4 * math.ceil(steps / 4)}
  picks = long_choice["chosen"]
  assert check["choice"]["stock Keras"] == picks["stock Keras"]
  assert check["stock_lr_scale"] == picks["stock Keras"]["lr_scale"]
  for run in check["runs"]:
    if run["path"] == "stock_keras":
      assert run["settings"]["base_learning_rate"] == pytest.approx(
          0.1 * picks["stock Keras"]["lr_scale"])
    else:
      assert {k: run["settings"][k] for k in check["recipe"]} == \
          picks["recipe"]["settings"]
  assert long_choice["centre"]["stock Keras"] == f"momentum x{centre:g}"
  with open(out / "recipe_long_choice.md") as f:
    text = f.read()
  assert "Picks (highest mean top-1" in text
  assert f"Centred on stock Keras: momentum x{centre:g}; recipe: LARS " in text


@pytest.fixture(scope="module")
def smoke_revised(smoke_long):
  """The revised recipe studies, as make study-recipe-revised: they read
  the smoke's recipe_long_choice.json."""
  return smoke_again(smoke_long, "recipe_revised_choice,recipe_revised")


def test_the_revised_check_trains_the_revised_picks(smoke_revised):
  """recipe_revised_choice weighs its new candidates against the long
  picks (read from the file); recipe_revised trains the revised picks on
  RECIPE_REVISED_SEEDS, each run's training loss measured alike."""
  from lab import study_baseline
  from lab import study_plan
  out = smoke_revised / "out"
  long_choice, revised, check = (
      json.loads((out / f"{name}.json").read_text()) for name in (
          "recipe_long_choice", "recipe_revised_choice", "recipe_revised"))
  stock = long_choice["chosen"]["stock Keras"]
  assert revised["prior"]["stock Keras"]["candidate"] == stock["candidate"]
  assert revised["prior"]["file"].endswith("recipe_long_choice.json")
  assert [r["settings"]["base_learning_rate"] for r in revised["runs"]
          if r["path"] == "stock_keras"] == pytest.approx(
              [0.2 * stock["lr_scale"]] * 2)
  assert revised["scale"]["train_epochs"] == check["scale"]["train_epochs"]
  assert {r["seed"] for r in check["runs"]} == set(
      study_plan.RECIPE_REVISED_SEEDS)
  picks = revised["chosen"]
  assert check["stock_lr_scale"] == picks["stock Keras"]["lr_scale"]
  for run in check["runs"]:
    assert run["train_loss_measure"] == study_baseline.TRAIN_LOSS
    if run["path"] != "stock_keras":
      assert {k: run["settings"][k] for k in check["recipe"]} == \
          picks["recipe"]["settings"]
  with open(out / "recipe_revised_choice.md") as f:
    assert "Also candidates, measured in " in f.read()


@pytest.fixture(scope="module")
def smoke_crop(smoke_revised):
  """The crop round, as make study-recipe-crop: it reads the smoke's
  recipe_revised_choice.json."""
  return smoke_again(smoke_revised, "recipe_crop_choice,recipe_crop")


def test_the_crop_round_trains_mild_crops_against_the_revised_picks(
    smoke_crop):
  """recipe_crop_choice weighs stock Keras's next LR and the revised pick
  with mild crops against the revised picks (read from the file);
  recipe_crop trains the round's picks on RECIPE_CROP_SEEDS."""
  from lab import study_plan
  out = smoke_crop / "out"
  revised, crop, check = (
      json.loads((out / f"{name}.json").read_text()) for name in (
          "recipe_revised_choice", "recipe_crop_choice", "recipe_crop"))
  stock = revised["chosen"]["stock Keras"]
  assert crop["prior"]["file"].endswith("recipe_revised_choice.json")
  assert crop["prior"]["recipe"]["candidate"] == \
      revised["chosen"]["recipe"]["candidate"]
  assert [r["settings"]["base_learning_rate"] for r in crop["runs"]
          if r["path"] == "stock_keras"] == pytest.approx(
              [0.2 * stock["lr_scale"]] * 2)
  assert sorted(r["settings"]["train_crop_min_area"] for r in crop["runs"]
                if r["path"] != "stock_keras") == [0.5, 0.5, 0.8, 0.8]
  assert {r["seed"] for r in check["runs"]} == set(
      study_plan.RECIPE_CROP_SEEDS)
  picks = crop["chosen"]
  assert check["stock_lr_scale"] == picks["stock Keras"]["lr_scale"]
  for run in check["runs"]:
    if run["path"] != "stock_keras":
      assert {k: run["settings"][k] for k in check["recipe"]} == \
          picks["recipe"]["settings"]
  with open(out / "recipe_crop_choice.md") as f:
    assert "Also candidates, measured in " in f.read()


def test_a_check_s_report_names_the_recipe_s_train_crop():
  """A recipe check whose recipe crops says so beside its LR (the crop
  round); the committed whole-image checks do not."""
  from lab import study_report
  with open(os.path.join(ROOT, "bench_results", "studies",
                         "recipe_revised.json")) as f:
    study = json.load(f)
  assert "train crops" not in study_report.markdown(study)
  study["recipe"]["train_crop_min_area"] = 0.8
  assert ("base LR 1.6 per 256 images, train crops of at least 0.8 of the "
          "image; the flagfile holds") in study_report.markdown(study)
