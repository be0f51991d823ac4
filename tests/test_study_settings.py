"""Both sides of the stock-Keras comparison train with one config's settings,
read back from what each side built (lab/study_settings.py, issue 36)."""
import pytest

from lab import study_baseline
from lab import study_data
from lab import study_model
from lab import study_plan
from lab import study_runner
from lab import study_settings


@pytest.fixture(scope="module")
def baseline_pair(tmp_path_factory):
  """The smoke scale's baseline runs at lr's chosen momentum x2 (the case
  the baseline once trained at half the LR it recorded)."""
  folder = str(tmp_path_factory.mktemp("settings"))
  data = study_data.StudyData(folder, 1000, 500, 10, "made up")
  runner = study_runner.Runner(data, study_plan.SMOKE, folder, folder,
                               "cpu", "")
  runs = study_plan.baseline_runs(runner.base, study_plan.SMOKE,
                                  {"momentum": 2.0})
  stock = next(r for r in runs if r.path == "stock_keras")
  cfg = stock.cfg.replace(model_dir=folder)
  project = study_settings.project(cfg, study_model.narrow_resnet)
  steps = cfg.run.total_train_steps
  return cfg, project, study_baseline.trained_with(
      study_baseline.build(cfg), steps)


def test_both_sides_train_with_the_same_shared_settings(baseline_pair):
  cfg, project, stock = baseline_pair
  assert study_settings.differences(project, stock) == []
  batch = cfg.run.global_batch_size
  # The chosen rule: 2 x 0.1 per 256 images, on both sides.
  assert cfg.optim.base_learning_rate == pytest.approx(0.2)
  for side in (project, stock):
    assert side["peak_learning_rate"] == pytest.approx(0.2 * batch / 256,
                                                       rel=1e-3)
    assert side["final_learning_rate"] < 0.05 * side["peak_learning_rate"]
    assert side["momentum"] == cfg.optim.momentum
    assert side["label_smoothing"] == cfg.optim.label_smoothing == 0.1
    assert side["weight_decay"] == pytest.approx(cfg.optim.weight_decay)
  # Every conv kernel and the head's kernel, on both sides.
  assert project["decayed_kernels"] == stock["decayed_kernels"] > 10


def test_the_features_that_differ_are_read_back_not_assumed(baseline_pair):
  """What the comparison prices: the project's zero-init gamma, its conv
  init (variance 1/fan_in against He's 2/fan_in) and BN settings."""
  _, project, stock = baseline_pair
  assert project["zero_gamma_bn_layers"] == 4  # each block's last BN
  assert stock["zero_gamma_bn_layers"] == 0
  assert project["bn_layers"] == stock["bn_layers"]
  assert project["conv_init_gain"] == pytest.approx(1.0, rel=0.15)
  assert stock["conv_init_gain"] == pytest.approx(2 ** 0.5, rel=0.15)
  assert (project["bn_momentum"], project["bn_epsilon"]) == ([0.9], [1e-5])
  assert (stock["bn_momentum"], stock["bn_epsilon"]) == ([0.99], [1e-3])


def test_a_side_that_ignores_the_config_is_named_before_it_trains(
    baseline_pair, monkeypatch):
  """The old baseline: 0.1 per 256 images whatever the config says."""
  cfg, project, _ = baseline_pair
  monkeypatch.setattr(
      study_baseline, "peak_learning_rate",
      lambda cfg, batch: 0.1 * batch / 256)
  with pytest.raises(ValueError, match="peak_learning_rate: "):
    study_runner.check_same_settings(cfg, project)


def test_differences_names_each_setting_with_both_values():
  a = {"peak_learning_rate": 0.2, "warmup_steps": 10, "momentum": 0.9,
       "nesterov": False, "weight_decay": 1e-4, "decayed_kernels": 12,
       "label_smoothing": 0.1,
       "learning_rate_curve": [0.0, 0.1, 0.2, 0.1, 0.05, 0.0]}
  assert study_settings.differences(a, dict(a)) == []
  # A warm-up or decay a step apart is the same rule.
  shifted = dict(a, learning_rate_curve=[0.0, 0.0, 0.1, 0.2, 0.1, 0.05])
  assert study_settings.differences(a, shifted) == []
  b = dict(a, momentum=0.95, warmup_steps=12, nesterov=True,
           learning_rate_curve=[0.0, 0.1, 0.2, 0.1, 0.15, 0.0])
  assert study_settings.differences(a, b) == [
      "warmup_steps: 10 and 12",
      "learning_rate_curve: differs by up to 0.05 at one step",
      "momentum: 0.9 and 0.95", "nesterov: False and True"]
  # A warm-up a step apart (epochs against steps) is the same rule.
  assert study_settings.differences(a, dict(a, warmup_steps=11)) == []


def test_the_calibrations_constant_schedule_agrees_too(baseline_pair):
  """lab/study_runner.py calibrates every kind of run, stock Keras's too,
  with --lr_schedule=constant and no warm-up."""
  cfg, _, _ = baseline_pair
  constant = cfg.replace(lr_schedule="constant", warmup_epochs=0.0)
  project = study_settings.project(constant, study_model.narrow_resnet)
  study_runner.check_same_settings(constant, project)
  assert project["final_learning_rate"] == pytest.approx(
      project["peak_learning_rate"])


def _stock(cfg, features):
  return study_baseline.trained_with(study_baseline.build(cfg, features),
                                     cfg.run.total_train_steps)


def test_each_ladder_rung_takes_exactly_its_features_from_the_project(
    baseline_pair):
  """The ladder's stock rungs (study_plan.ladder_points), read back: the
  features a rung claims are the project's, every other is stock's."""
  cfg, project, _ = baseline_pair
  for name, features in study_plan.ladder_points(2.0):
    stock = _stock(cfg, features)
    assert study_settings.feature_differences(project, stock, features) == [], name
    assert study_settings.differences(project, stock) == [], name
  top = _stock(cfg, study_model.FEATURES)
  assert top["input_mean"] == project["input_mean"] == [123.68, 116.28, 103.53]
  assert _stock(cfg, ())["input_std"] == [255.0] * 3
  # A rung that claims a feature it does not have is named.
  assert study_settings.feature_differences(
      project, _stock(cfg, ("conv_init",)), ("conv_init", "zero_gamma")) == [
          "zero_gamma differs (zero_gamma_bn_layers: 4 and 0)"]


def test_the_project_s_flags_give_the_stock_choice_of_each_feature(
    baseline_pair):
  """The reverse ladder: the project's path with study_model.WITHOUT[f]'s
  flags has stock Keras's f and the project's other features."""
  cfg, _, _ = baseline_pair
  for feature in study_model.FEATURES:
    without = study_settings.project(cfg.replace(
        **study_model.WITHOUT[feature]), study_model.narrow_resnet)
    others = tuple(f for f in study_model.FEATURES if f != feature)
    stock = _stock(cfg, others)
    assert study_settings.feature_differences(
        without, stock, study_model.FEATURES) == [], feature


def test_the_recipe_study_trains_the_flagfile_s_choices_on_fresh_seeds(
    tmp_path):
  """study recipe: flags/small_images.cfg's input, network and optimizer
  flags, read from the file, on the project's side only, the rest of the
  budget shared with stock Keras's momentum; seeds no other run used."""
  flagfile = tmp_path / "recipe.cfg"
  flagfile.write_text("--train_crop_min_area=1.0\n--nozero_init_gamma\n"
                      "--conv_init=he_normal\n--optimizer=lars\n"
                      "--learning_rate_scaling=none\n"
                      "--base_learning_rate=5.0\n--lr_schedule=polynomial\n")
  recipe = study_plan.recipe_settings(str(flagfile))
  assert (recipe["train_crop_min_area"], recipe["zero_init_gamma"],
          recipe["conv_init"], recipe["optimizer"],
          recipe["base_learning_rate"]) == (1.0, False, "he_normal", "lars",
                                            5.0)
  data = study_data.StudyData(str(tmp_path), 1000, 500, 10, "made up")
  runner = study_runner.Runner(data, study_plan.SMOKE, str(tmp_path),
                               str(tmp_path), "cpu", "")
  runs = study_plan.recipe_runs(runner.base, study_plan.SMOKE,
                                {"momentum": 2.0}, recipe)
  assert {r.seed for r in runs} == set(study_plan.RECIPE_SEEDS)
  # Seeds 0-1: every other study's and the choice's; 2-5: the earlier
  # recipe checks'.
  assert not set(study_plan.RECIPE_SEEDS) & {0, 1, 2, 3, 4, 5}
  assert not set(study_plan.RECIPE_SEEDS) & set(
      study_plan.RECIPE_CHOICE_SEEDS)
  for run in runs:
    flat = run.cfg.flat()
    mine = {k: flat[k] for k in study_plan.RECIPE_KEYS}
    assert (mine == recipe) == (run.path == "project"), run.path
  stock, project = runs[0].cfg.flat(), runs[1].cfg.flat()
  assert (runs[0].path, runs[1].path) == ("stock_keras", "project")
  assert (stock["optimizer"], stock["base_learning_rate"]) == (
      "momentum", pytest.approx(0.2))
  assert {k for k in stock if stock[k] != project[k]} <= set(
      study_plan.RECIPE_KEYS)


def _runner(tmp_path):
  data = study_data.StudyData(str(tmp_path), 1000, 500, 10, "made up")
  return study_runner.Runner(data, study_plan.SMOKE, str(tmp_path),
                             str(tmp_path), "cpu", "")


LR_CHOICE = {"momentum": 2.0, "lars": 0.5}


def test_each_side_of_the_recipe_choice_has_a_grid_of_one_size(tmp_path):
  """recipe_choice: three LRs a side around lr's rule (stock Keras's
  momentum x1, x2, x4; the recipe's LARS 2.5, 5, 10), the recipe's also
  with zero-init gamma and once without the flip; every recipe candidate
  differs from the flagfile only in those keys, every run only in
  RECIPE_KEYS from stock Keras's at lr's rule."""
  recipe = study_plan.LARS_RECIPE
  candidates = study_plan.recipe_candidates(LR_CHOICE, recipe)
  stock = [w["lr_scale"] for s, _, w in candidates
           if s == study_plan.STOCK_SIDE]
  assert stock == [2.0, 1.0, 4.0]  # lr's rule first: it wins a tie
  mine = [(w["base_learning_rate"], w["zero_init_gamma"], w["random_flip"])
          for s, _, w in candidates if s == study_plan.RECIPE_SIDE]
  assert mine == [(5.0, False, True), (2.5, False, True), (10.0, False, True),
                  (5.0, True, True), (2.5, True, True), (10.0, True, True),
                  (5.0, False, False)]
  varied = {"base_learning_rate", "zero_init_gamma", "random_flip"}
  for side, name, what in candidates:
    if side == study_plan.RECIPE_SIDE:
      assert {k for k in recipe if recipe[k] != what[k]} <= varied, name
  runs = study_plan.recipe_choice_runs(_runner(tmp_path).base,
                                       study_plan.SMOKE, LR_CHOICE, recipe)
  assert len(runs) == len(candidates) * len(study_plan.RECIPE_CHOICE_SEEDS)
  reference = next(r for r in runs if r.path == "stock_keras").cfg.flat()
  for run in runs:
    flat = run.cfg.flat()
    side = dict(run.point)["side"]
    assert (run.path == "stock_keras") == (side == study_plan.STOCK_SIDE)
    assert {k for k in flat if flat[k] != reference[k]} <= set(
        study_plan.RECIPE_KEYS) | {"seed"}, run.label
    if run.path == "stock_keras":
      assert flat["optimizer"] == "momentum"
      assert flat["base_learning_rate"] in (
          pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.4))
  assert {r.seed for r in runs} == set(study_plan.RECIPE_CHOICE_SEEDS)


def _choice_record(candidate, top1, seed):
  return {"point": (("side", "x"), ("candidate", candidate)), "seed": seed,
          "top1": top1}


def test_the_recipe_choice_keeps_each_side_s_best_and_a_tie_lr_s_rule():
  recipe = study_plan.LARS_RECIPE
  top1 = {"momentum x1": 0.80, "momentum x2": 0.84, "momentum x4": 0.84,
          "LARS 2.5": 0.83, "LARS 5": 0.84, "LARS 10": 0.82,
          "LARS 5, zero gamma": 0.85, "LARS 2.5, zero gamma": 0.86,
          "LARS 10, zero gamma": 0.70, "LARS 5, no flip": 0.84}
  records = [_choice_record(name, value + 0.01 * seed, seed)
             for name, value in top1.items() for seed in (0, 1)]
  chosen = study_plan.recipe_choice(
      records, study_plan.recipe_candidates(LR_CHOICE, recipe))
  assert chosen[study_plan.STOCK_SIDE]["candidate"] == "momentum x2"
  assert chosen[study_plan.STOCK_SIDE]["lr_scale"] == 2.0
  mine = chosen[study_plan.RECIPE_SIDE]
  assert mine["candidate"] == "LARS 2.5, zero gamma"
  assert mine["top1_mean"] == pytest.approx(0.865)
  assert mine["settings"] == dict(recipe, base_learning_rate=2.5,
                                  zero_init_gamma=True, random_flip=True)


def test_the_recipe_check_trains_stock_keras_at_the_chosen_rule(tmp_path):
  recipe = study_plan.recipe_settings()
  runs = study_plan.recipe_runs(_runner(tmp_path).base, study_plan.SMOKE,
                                LR_CHOICE, recipe, stock_lr_scale=4.0)
  stock = [r.cfg.optim for r in runs if r.path == "stock_keras"]
  assert stock and all(o.base_learning_rate == pytest.approx(0.4)
                       for o in stock)
  mine = [r.cfg.flat() for r in runs if r.path == "project"]
  assert mine and all({k: f[k] for k in recipe} == recipe for f in mine)


def test_a_recipe_choice_made_at_another_scale_is_refused(tmp_path):
  import dataclasses
  import json
  from lab import study
  scale = study_plan.DEFAULT.shrunk().shrunk()
  path = tmp_path / "recipe_choice.json"
  assert study.read_choices(["recipe"], str(tmp_path), scale) == {}
  path.write_text(json.dumps({"scale": dataclasses.asdict(scale),
                              "chosen": {"stock Keras": {"lr_scale": 4.0}},
                              "runs": []}))
  assert study.read_choices(["recipe"], str(tmp_path), scale) == {
      "recipe_choice": {"chosen": {"stock Keras": {"lr_scale": 4.0}},
                        "runs": [], "file": str(path)}}
  with pytest.raises(ValueError, match=r"chosen at 2560 training images "
                     r"and train_epochs 0, this run has 5120 and 0"):
    study.read_choices(["recipe"], str(tmp_path),
                       study_plan.DEFAULT.shrunk())
  # A round's file adds the runs of the picks it kept from its prior.
  long = json.loads(path.read_text())
  long["scale"] = dataclasses.asdict(study_plan.long_scale(scale))
  (tmp_path / "recipe_revised_choice.json").write_text(json.dumps(
      dict(long, runs=[{"seed": 0}], prior_runs=[{"seed": 1}])))
  assert study.read_choices(["recipe_crop_choice"], str(tmp_path), scale)[
      "recipe_revised_choice"]["runs"] == [{"seed": 0}, {"seed": 1}]
  # The long choice is read at three times the epochs: this one is not.
  (tmp_path / "recipe_long_choice.json").write_text(path.read_text())
  with pytest.raises(ValueError, match=r"this run has 2560 and 30"):
    study.read_choices(["recipe_long"], str(tmp_path), scale)


def test_the_long_choice_centres_each_side_s_lr_on_recipe_choice_s_pick(
    tmp_path):
  """recipe_long_choice: stock Keras's momentum at the pick x0.5, x1, x2
  and the flagfile's LARS peak x0.5, x1, x2 (its other RECIPE_KEYS
  kept), the pick first; every run at three times the recipe check's
  steps and warm-up, on RECIPE_CHOICE_SEEDS."""
  recipe = study_plan.LARS_RECIPE
  candidates = study_plan.recipe_long_candidates(4.0, recipe)
  assert [(s, n) for s, n, _ in candidates] == [
      ("stock Keras", "momentum x4"), ("stock Keras", "momentum x2"),
      ("stock Keras", "momentum x8"), ("recipe", "LARS 5, no flip"),
      ("recipe", "LARS 2.5, no flip"), ("recipe", "LARS 10, no flip")]
  for side, name, what in candidates[3:]:
    assert {k for k in recipe if recipe[k] != what[k]} <= {
        "base_learning_rate"}, name
  scale = study_plan.DEFAULT.shrunk().shrunk()  # make study-recipe's
  base = _runner(tmp_path).base.replace(num_train_images=scale.num_train)
  runs = study_plan.recipe_long_choice_runs(base, scale, 4.0, recipe)
  short = study_plan.recipe_runs(base, scale, LR_CHOICE, recipe, 4.0)[0]
  assert len(runs) == 6 * len(study_plan.RECIPE_CHOICE_SEEDS)
  assert {r.seed for r in runs} == set(study_plan.RECIPE_CHOICE_SEEDS)
  for run in runs:
    assert run.cfg.run.total_train_steps == 3 * 3200
    assert run.cfg.run.total_train_steps == (
        study_plan.RECIPE_LONG_FACTOR * short.cfg.run.total_train_steps)
    assert run.cfg.optim.warmup_epochs == pytest.approx(
        study_plan.RECIPE_LONG_FACTOR * short.cfg.optim.warmup_epochs)
  stock = sorted(r.cfg.optim.base_learning_rate for r in runs
                 if r.path == "stock_keras")
  assert stock == pytest.approx([0.2, 0.2, 0.4, 0.4, 0.8, 0.8])


def test_the_long_check_trains_the_long_picks_on_fresh_seeds(tmp_path):
  """recipe_long: each side at the long choice's pick, three times the
  steps, on seeds no other recipe study used."""
  recipe = dict(study_plan.LARS_RECIPE, base_learning_rate=2.5)
  scale = study_plan.DEFAULT.shrunk().shrunk()
  runs = study_plan.long_check_runs(
      _runner(tmp_path).base.replace(num_train_images=scale.num_train),
      scale, "recipe_long", recipe, 8.0)
  assert [(r.path, r.seed) for r in runs] == [
      (path, seed) for seed in (9, 10, 11)
      for path in ("stock_keras", "project")]
  assert not set(study_plan.RECIPE_LONG_SEEDS) & set(
      study_plan.RECIPE_SEEDS + study_plan.RECIPE_CHOICE_SEEDS + (2, 3, 4, 5))
  for run in runs:
    assert run.study == "recipe_long"
    assert run.cfg.run.total_train_steps == 9600
    if run.path == "stock_keras":
      assert run.cfg.optim.base_learning_rate == pytest.approx(0.8)
    else:
      flat = run.cfg.flat()
      assert {k: flat[k] for k in recipe} == recipe


def test_the_long_studies_refuse_to_start_without_their_choice():
  from lab import study
  with pytest.raises(ValueError, match="recipe_choice.json's picks"):
    study.needs_choice(["recipe_long_choice"], {})
  with pytest.raises(ValueError, match="recipe_long_choice.json's picks"):
    study.needs_choice(["recipe_long"], {})
  study.needs_choice(["recipe_long_choice", "recipe_long"],
                     {"recipe_choice": {}})
  study.needs_choice(["recipe_choice", "recipe_long_choice"], {})


def test_the_revised_choice_adds_one_stock_lr_and_three_recipes(tmp_path):
  """recipe_revised_choice: stock Keras one grid step past its long pick;
  the recipe's LARS with only the flip changed, and stock Keras's own
  momentum rule with the flagfile's input, init and network, flip off and
  on; every run at the long budget on RECIPE_CHOICE_SEEDS."""
  recipe = study_plan.LARS_RECIPE
  stock = study_plan.next_stock_candidates(8.0)
  assert stock == [("stock Keras", "momentum x16", {"lr_scale": 16.0})]
  candidates = study_plan.revised_recipe_candidates(8.0, recipe)
  assert [(s, n) for s, n, _ in candidates] == [
      ("recipe", "LARS 5"), ("recipe", "project, momentum x8, no flip"),
      ("recipe", "project, momentum x8")]
  assert {k for k in recipe if recipe[k] != candidates[0][2][k]} == {
      "random_flip"}
  rule = {"optimizer": "momentum", "learning_rate_scaling": "linear",
          "base_learning_rate": 0.8, "lr_schedule": "cosine"}
  for (_, name, what), flip in zip(candidates[1:], (False, True)):
    assert {k: what[k] for k in rule} == rule, name
    assert what["random_flip"] is flip
    assert {k for k in recipe if recipe[k] != what[k]} <= set(rule) | {
        "random_flip"}, name
  scale = study_plan.DEFAULT.shrunk().shrunk()
  base = _runner(tmp_path).base.replace(num_train_images=scale.num_train)
  runs = study_plan.round_choice_runs(base, scale, "recipe_revised_choice",
                                     stock + candidates)
  assert {r.seed for r in runs} == set(study_plan.RECIPE_CHOICE_SEEDS)
  assert {r.cfg.run.total_train_steps for r in runs} == {9600}
  momentum = [r for r in runs if r.path == "project"
              and r.cfg.optim.optimizer == "momentum"]
  assert len(momentum) == 4
  for run in momentum:  # the same schedule as stock Keras's at x8
    assert run.cfg.optim.learning_rate_scaling == "linear"
    assert run.cfg.optim.warmup_epochs == pytest.approx(4.5)


class _Runner:
  """Trains nothing: each run's top-1 is `top1[candidate]`."""

  def __init__(self, base, top1):
    self.base, self.top1, self.ran = base, top1, []

  def execute_all(self, runs):
    self.ran += runs
    return [{"point": r.point, "top1": self.top1[dict(r.point)["candidate"]]}
            for r in runs]


  def study(self, name, runs, criteria, extra=None, scale=None):
    self.studies = getattr(self, "studies", {})
    self.studies[name] = (runs, criteria, extra, scale)
    return [f"{name}.md", f"{name}.json", f"{name}.png"]


def _long_choice(recipe):
  chosen = {"stock Keras": {"candidate": "momentum x8", "lr_scale": 8.0,
                            "top1_mean": 0.877},
            "recipe": {"candidate": "LARS 5, no flip", "settings": recipe,
                       "top1_mean": 0.869}}
  records = [{"point": [["side", side], ["candidate", name]], "top1": top1}
             for side, name, top1 in (
                 ("stock Keras", "momentum x4", 0.99),  # not a pick
                 ("stock Keras", "momentum x8", 0.877),
                 ("recipe", "LARS 5, no flip", 0.869))]
  return chosen, records


@pytest.mark.parametrize("stock_top, recipe_top, stock_pick, recipe_pick", [
    (0.870, 0.860, 8.0, "LARS 5, no flip"),  # the long picks stay
    (0.877, 0.869, 8.0, "LARS 5, no flip"),  # a tie keeps them
    (0.890, 0.880, 16.0, "project, momentum x16"),  # x16 sets momentum's
])
def test_the_revised_choice_weighs_new_candidates_against_the_long_picks(
    tmp_path, stock_top, recipe_top, stock_pick, recipe_pick):
  from lab import study
  recipe = study_plan.LARS_RECIPE
  chosen, records = _long_choice(recipe)
  top1 = {"momentum x16": stock_top, "LARS 5": 0.5,
          **{f"project, momentum x{x}{flip}": recipe_top - 0.01 * bool(flip)
             for x in (8, 16) for flip in ("", ", no flip")}}
  scale = study_plan.DEFAULT.shrunk().shrunk()
  runner = _Runner(_runner(tmp_path).base.replace(
      num_train_images=scale.num_train), top1)
  revised, runs = study.next_recipe_choice(
      runner, scale, "recipe_revised_choice",
      {"chosen": chosen, "runs": records, "file": "long.json"})
  assert runs == runner.ran and len(runs) == 8
  assert revised["chosen"]["stock Keras"]["lr_scale"] == stock_pick
  assert revised["chosen"]["recipe"]["candidate"] == recipe_pick
  # The picks' runs compete, the grid's others do not.
  assert len(revised["runs"]) == 2 + len(runs)
  # The recipe's momentum trains at stock Keras's revised pick.
  assert [r.cfg.optim.base_learning_rate for r in runs
          if r.path == "project" and r.cfg.optim.optimizer == "momentum"] \
      == pytest.approx([0.1 * stock_pick] * 4)


def test_the_revised_studies_read_the_committed_long_choice(tmp_path):
  """make study-recipe-revised's wiring, nothing trained: the committed
  recipe_long_choice.json's picks and runs compete; the check trains the
  revised picks and names the revised choice's file."""
  import os
  from lab import study
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  path = os.path.join(root, "bench_results/studies/recipe_long_choice.json")
  scale = study_plan.DEFAULT.shrunk().shrunk()
  record = study.read_choice_record(path, study_plan.long_scale(scale))
  top1 = {"momentum x16": 0.5, "LARS 5": 0.5,
          "project, momentum x8, no flip": 0.95,
          "project, momentum x8": 0.9}
  runner = _Runner(_runner(tmp_path).base.replace(
      num_train_images=scale.num_train), top1)
  written = study.run_studies(
      ["recipe_revised_choice", "recipe_revised"], scale, runner,
      choices={"recipe_long_choice": {"chosen": record["chosen"],
                                      "runs": record["runs"], "file": path}})
  assert written[1] == "recipe_revised_choice.json"
  runs, _, extra, at = runner.studies["recipe_revised_choice"]
  assert at == study_plan.long_scale(scale) and len(runs) == 8
  assert extra["prior"]["file"] == path
  assert extra["prior"]["stock Keras"]["candidate"] == "momentum x8"
  # The long picks' runs go into the file: the next round may keep them.
  assert sorted((dict(r["point"])["candidate"], r["seed"])
                for r in extra["prior_runs"]) == [
      ("LARS 5, no flip", 0), ("LARS 5, no flip", 1),
      ("momentum x8", 0), ("momentum x8", 1)]
  picks = extra["chosen"]
  assert picks["stock Keras"]["candidate"] == "momentum x8"
  assert picks["recipe"]["candidate"] == "project, momentum x8, no flip"
  runs, criteria, extra, at = runner.studies["recipe_revised"]
  assert extra["choice"]["file"] == "recipe_revised_choice.json"
  assert extra["recipe"] == picks["recipe"]["settings"]
  assert extra["stock_lr_scale"] == 8.0
  assert not extra["recipe_is_choice"]
  assert {r.seed for r in runs} == set(study_plan.RECIPE_REVISED_SEEDS)


def test_the_revised_check_trains_its_picks_on_fresh_seeds(tmp_path):
  recipe = study_plan.revised_recipe_candidates(
      8.0, study_plan.LARS_RECIPE)[1][2]
  scale = study_plan.DEFAULT.shrunk().shrunk()
  runs = study_plan.long_check_runs(
      _runner(tmp_path).base.replace(num_train_images=scale.num_train),
      scale, "recipe_revised", recipe, 16.0)
  assert [(r.path, r.seed) for r in runs] == [
      (path, seed) for seed in (12, 13, 14)
      for path in ("stock_keras", "project")]
  assert not set(study_plan.RECIPE_REVISED_SEEDS) & set(
      study_plan.RECIPE_LONG_SEEDS + study_plan.RECIPE_SEEDS
      + study_plan.RECIPE_CHOICE_SEEDS + (2, 3, 4, 5))
  for run in runs:
    assert run.study == "recipe_revised"
    assert run.cfg.run.total_train_steps == 9600
    if run.path == "stock_keras":
      assert run.cfg.optim.base_learning_rate == pytest.approx(1.6)
    else:
      flat = run.cfg.flat()
      assert {k: flat[k] for k in recipe} == recipe


def test_the_revised_studies_refuse_to_start_without_their_choice():
  from lab import study
  with pytest.raises(ValueError, match="recipe_long_choice.json's picks "
                     "and runs"):
    study.needs_choice(["recipe_revised_choice"], {})
  with pytest.raises(ValueError, match="recipe_revised_choice.json's"):
    study.needs_choice(["recipe_revised"], {})
  study.needs_choice(["recipe_revised_choice", "recipe_revised"],
                     {"recipe_long_choice": {}})
  study.needs_choice(["recipe_long_choice", "recipe_revised_choice"],
                     {"recipe_choice": {}})


def test_the_crop_round_adds_one_stock_lr_and_two_mild_crops(tmp_path):
  """recipe_crop_choice: stock Keras one grid step past its revised pick;
  the revised pick with square train crops of at least 0.8 and 0.5 of
  the image at stock Keras's momentum rule, nothing else changed."""
  revised = study_plan.revised_recipe_candidates(
      16.0, study_plan.LARS_RECIPE)[1][2]
  assert study_plan.next_stock_candidates(16.0) == [
      ("stock Keras", "momentum x32", {"lr_scale": 32.0})]
  candidates = study_plan.crop_recipe_candidates(32.0, revised)
  assert [(s, n) for s, n, _ in candidates] == [
      ("recipe", "project, momentum x32, no flip, crop 0.8"),
      ("recipe", "project, momentum x32, no flip, crop 0.5")]
  for (_, _, what), area in zip(candidates, (0.8, 0.5)):
    assert {k: (revised[k], what[k]) for k in revised
            if revised[k] != what[k]} == {
                "base_learning_rate": (1.6, 3.2),
                "train_crop_min_area": (1.0, area)}
  assert study_plan.ROUNDS["recipe_crop_choice"] == (
      "recipe_revised_choice", study_plan.crop_recipe_candidates)
  scale = study_plan.DEFAULT.shrunk().shrunk()
  base = _runner(tmp_path).base.replace(num_train_images=scale.num_train)
  runs = study_plan.round_choice_runs(base, scale, "recipe_crop_choice",
                                      candidates)
  assert {r.seed for r in runs} == set(study_plan.RECIPE_CHOICE_SEEDS)
  assert {r.cfg.run.total_train_steps for r in runs} == {9600}
  assert sorted(r.cfg.flat()["train_crop_min_area"] for r in runs) == [
      0.5, 0.5, 0.8, 0.8]
  assert {r.cfg.flat()["eval_crop_fraction"] for r in runs} == {1.0}


def test_the_crop_studies_read_the_committed_revised_choice(tmp_path):
  """make study-recipe-crop's wiring, nothing trained: the committed
  recipe_revised_choice.json's picks and their runs compete with the new
  candidates; the check trains the round's picks on fresh seeds."""
  import os
  from lab import study
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  out = os.path.join(root, "bench_results/studies")
  scale = study_plan.DEFAULT.shrunk().shrunk()
  choices = study.read_choices(["recipe_crop_choice", "recipe_crop"], out,
                               scale)
  assert list(choices) == ["recipe_revised_choice"]
  # x32 loses to the revised x16 (0.8786); crop 0.8 beats its 0.87715.
  top1 = {"momentum x32": 0.87, "project, momentum x16, no flip, crop 0.8":
          0.88, "project, momentum x16, no flip, crop 0.5": 0.87}
  runner = _Runner(_runner(tmp_path).base.replace(
      num_train_images=scale.num_train), top1)
  study.run_studies(["recipe_crop_choice", "recipe_crop"], scale, runner,
                    choices=choices)
  runs, _, extra, _ = runner.studies["recipe_crop_choice"]
  assert len(runs) == 6
  assert extra["prior"]["file"].endswith("recipe_revised_choice.json")
  assert extra["prior"]["recipe"]["candidate"] == (
      "project, momentum x16, no flip")
  picks = extra["chosen"]
  assert picks["stock Keras"]["candidate"] == "momentum x16"
  assert picks["recipe"]["candidate"] == (
      "project, momentum x16, no flip, crop 0.8")
  runs, _, extra, _ = runner.studies["recipe_crop"]
  assert extra["choice"]["file"] == "recipe_crop_choice.json"
  assert extra["stock_lr_scale"] == 16.0
  assert extra["recipe"]["train_crop_min_area"] == 0.8
  assert [(r.path, r.seed) for r in runs] == [
      (path, seed) for seed in (15, 16, 17)
      for path in ("stock_keras", "project")]
  assert not set(study_plan.RECIPE_CROP_SEEDS) & set(
      study_plan.RECIPE_REVISED_SEEDS + study_plan.RECIPE_LONG_SEEDS
      + study_plan.RECIPE_SEEDS + study_plan.RECIPE_CHOICE_SEEDS
      + (2, 3, 4, 5))
  # A prior whose file lacks a pick's runs stops before the round trains.
  choices["recipe_revised_choice"]["runs"] = [
      r for r in choices["recipe_revised_choice"]["runs"]
      if dict(r["point"])["candidate"] != "momentum x16"]
  runner.ran = []
  with pytest.raises(ValueError, match=r"holds no runs of its picks "
                     r"\['momentum x16'\]"):
    study.next_recipe_choice(runner, scale, "recipe_crop_choice",
                             choices["recipe_revised_choice"])
  assert not runner.ran
  with pytest.raises(ValueError, match="recipe_crop_choice.json's picks"):
    study.needs_choice(["recipe_crop"], {})
  with pytest.raises(ValueError, match="make study-recipe-revised"):
    study.needs_choice(["recipe_crop_choice"], {})


def test_the_flagfile_ships_the_pick_whose_check_held():
  """flags/small_images.cfg holds, in every RECIPE_KEYS setting, the
  recipe pick of the committed recipe_crop_choice.json, whose check
  (recipe_crop.json) held and trained it; LARS_RECIPE, the flagfile
  before, is recipe_choice.json's pick."""
  import json
  import os
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

  def read(name):
    with open(os.path.join(root, "bench_results/studies", name)) as f:
      return json.load(f)
  crop, check = read("recipe_crop_choice.json"), read("recipe_crop.json")
  shipped = crop["chosen"][study_plan.RECIPE_SIDE]["settings"]
  assert study_plan.recipe_settings() == shipped == check["recipe"]
  assert [v["verdict"] for v in check["verdicts"]] == ["held"]
  assert read("recipe_choice.json")["chosen"][study_plan.RECIPE_SIDE][
      "settings"] == study_plan.LARS_RECIPE


def test_every_study_has_its_title_and_claim():
  """The studies' runner writes each study under study_report.TEXT's
  name: a study without one would train for an hour, then fail."""
  from lab import study
  from lab import study_confirm
  from lab import study_report
  assert set(study.STUDIES) | set(study_confirm.STUDIES) == set(
      study_report.TEXT)
