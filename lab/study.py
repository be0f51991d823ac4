r"""The papers' central claims, each testable either way, on real photos.

  python -m lab.study [--studies=lr,a,b,c,baseline,crop] [--smoke|--full] \
      [--image_dir=D] [--estimate_only] [--budget_minutes=90] \
      [--halvings=N] [--lr_choice=bench_results/studies/lr_choice.json]

Trains lab/study_model.py's narrow ResNet-10 through the real path:
class-folder JPEGs -> data/build_tfrecords.py -> the input pipeline ->
resnet_tpu.run.run(cfg, model_fn=...) on CPU replicas -> evaluation over
every test image at 75 % of the run and at its end. The default data is
Fashion-MNIST from Debian's dataset-fashion-mnist package, written once as
32 px RGB JPEGs and cached (lab/study_data.py); --image_dir takes any
train/<class>/ + validation/<class>/ (or test/<class>/) image set instead.
lab/study_plan.py defines the studies, their LR rules and their
pre-declared criteria (lab/study_verdict.py):

  lr the LR rule of each optimizer, chosen once at the smallest batch
     (the papers' peak LR times 0.5, 1 or 2); every other study runs it
     first and trains with its choice;
  a  distributed BN (Ying et al. 2018 §3.1): BN over 4 images per replica
     on 8 replicas against a BN group of 32 images, each run's final
     weights evaluated with moving and with recomputed statistics;
  b  large batches (Goyal 2017; Ying 2018 §3; Akiba 2017): the ends of a
     32x span of batches at equal epochs for momentum SGD, LARS and RMSprop
     warm-up, then label smoothing off for the best at the largest batch;
  c  batch-size control (Mikami et al. 2018): a growing batch against its
     final batch at equal epochs and at equal steps, and the small batch;
  baseline  the same network in stock Keras model.fit, equal budget;
  crop  the Inception crop (min area 0.08) against min area 0.35 and the
        whole image (stock Keras's plain resize, flip kept);
  ladder  stock Keras gains the project's network choices one at a time
          up to the project's path, which then loses each in turn;
  recipe_choice  each side's rule for the recipe check, chosen on seeds
          0 and 1: stock Keras's momentum LR; the recipe's LARS peak,
          zero-init gamma and flip;
  recipe  flags/small_images.cfg's input, network and optimizer choices
          against stock Keras's momentum at recipe_choice's rule (read
          from --output_dir's recipe_choice.json), on fresh seeds;
  recipe_long_choice, recipe_long  the same at three times the epochs:
          each side's LR around recipe_choice's pick, then the check on
          fresh seeds at the long choice's picks;
  recipe_revised_choice, recipe_revised  at those epochs, stock Keras's
          LR one grid step past its long pick, the recipe's LARS with the
          flip on and stock Keras's momentum with the recipe's input and
          init, each against the long picks; then the check on fresh
          seeds;
  recipe_crop_choice, recipe_crop  the next round: stock Keras's LR one
          more step, the revised recipe with mild train crops, each
          against the revised picks; then the check on fresh seeds;
  regime  b in the papers' regime (study_plan.REGIME: the largest batch
          2.5 % of the images a step, 30 epochs), LARS against momentum at
          the largest batch; it runs alone, at its own scale, with the LR
          rules of --lr_choice, whatever scale chose them.

Each writes <name>.md, .json and .png to --output_dir, the JSON with its
criteria, verdicts, steps at the largest batch and the control's
convergence check. First a few timed steps of each kind of run estimate
the plan's wall time at the current load; over --budget_minutes, the
images are halved (and the batches with them, so every run keeps its
steps) until it fits. --estimate_only stops there. --full (60k images,
batches 128-4096, 3 seeds) is for GPU/TPU hosts (--strategy); --smoke is
the CI test's few-step version.
"""
import dataclasses
import gc
import json
import os
import shutil
import signal
import sys
import time

from absl import app
from absl import flags
from absl import logging

from resnet_tpu.parallel.tensorflow.strategy import configure_cpu_replicas
from lab import study_plan
from lab import study_data
from lab import study_runner
from lab import study_verdict

FLAGS = flags.FLAGS
STUDIES = ("lr", "a", "b", "c", "baseline", "crop", "ladder",
           "recipe_choice", "recipe", "recipe_long_choice", "recipe_long",
           "recipe_revised_choice", "recipe_revised", "recipe_crop_choice",
           "recipe_crop", "regime")
# `make study`: the ladder, the recipe's choices and checks, and the regime
# run on their own (`make study-ladder`, `make study-recipe-choice`,
# `make study-recipe`, `make study-recipe-long`, `make
# study-recipe-revised`, `make study-recipe-crop`, `make study-regime`).
DEFAULT_STUDIES = STUDIES[:-10]
MAX_HALVINGS = 4
PATH_FLAGS = ("--work_dir", "--cache_dir", "--output_dir", "--image_dir",
              "--records_dir",
              "--fashion_mnist_dir")


def define_path_flags() -> None:
  """The data, cache, run and output folders (PATH_FLAGS' machine-specific
  flags), shared with lab/study_confirm.py."""
  flags.DEFINE_string("fashion_mnist_dir", study_data.FASHION_MNIST_DIR,
                      "Folder of the Fashion-MNIST idx files.")
  flags.DEFINE_string("cache_dir", os.path.join(
      os.path.expanduser("~"), ".cache", "resnet_tpu", "fashion_mnist"),
                      "Where the study set's JPEGs and TFRecords are kept.")
  flags.DEFINE_string("work_dir", "/tmp/resnet_tpu_study", "Run folders "
                      "(metrics.jsonl and config.json are kept).")
  flags.DEFINE_string("output_dir", "bench_results/studies",
                      "Where the .md, .json and .png of each study go.")


def define_flags() -> None:
  flags.DEFINE_list("studies", list(DEFAULT_STUDIES), "Studies to run: lr, "
                    "a, b, c, baseline, crop, ladder, recipe_choice, recipe, "
                    "recipe_long_choice, recipe_long, recipe_revised_choice, "
                    "recipe_revised, recipe_crop_choice, recipe_crop, "
                    "regime (each "
                    "runs lr first: it chooses their LR rules, unless "
                    "--lr_choice); regime runs alone.")
  flags.DEFINE_float("budget_minutes", 90.0, "Halve the images until the "
                     "estimate fits (not with --full or --smoke).")
  flags.DEFINE_bool("smoke", False, "A few steps per point on a few hundred "
                    "images (the CI test).")
  flags.DEFINE_bool("full", False, "All 60k images, batches 128-4096, 3 "
                    "seeds: for GPU/TPU hosts.")
  flags.DEFINE_bool("estimate_only", False, "Print the estimated wall time "
                    "of the plan and stop.")
  flags.DEFINE_string("image_dir", "", "train/<class>/ and validation/"
                      "<class>/ (or test/) images instead of Fashion-MNIST.")
  define_path_flags()
  flags.DEFINE_string("lr_choice", "", "A study lr's JSON (lr_choice.json) "
                      "at the same scale: its chosen LR rules are taken "
                      "instead of running lr again.")
  flags.DEFINE_integer("halvings", -1, "Halve the images this many times "
                       "instead of fitting --budget_minutes (-1: fit).")
  flags.DEFINE_enum("strategy", "cpu", ["cpu", "gpu", "tpu"], "--strategy "
                    "of every run; gpu/tpu need as many devices as the "
                    "scale's replicas.")


def command(argv: list[str], module: str = "lab.study") -> str:
  """The command line without machine-specific path flags."""
  kept = [a for a in argv[1:] if not a.startswith(PATH_FLAGS)]
  return " ".join([f"python -m {module}"] + kept)


def chosen_lr_scales(path: str, scale: study_plan.Scale,
                     any_scale: bool = False) -> dict | None:
  """The chosen LR rules of the lr_choice.json at `path`; ValueError when
  it was chosen at another scale, unless `any_scale` (a field newer than
  the file counts as its default there)."""
  with open(path) as f:
    record = json.load(f)
  defaults = {f.name: f.default for f in dataclasses.fields(scale)
              if f.default is not dataclasses.MISSING}
  current = json.loads(json.dumps(dataclasses.asdict(scale)))
  if not any_scale and any(record["scale"].get(k, defaults.get(k)) != v
                           for k, v in current.items()):
    raise ValueError(f"--lr_choice={path} was chosen at another scale "
                     f"({record['scale']['num_train']} images, batches "
                     f"{record['scale']['batches']}) than this run's "
                     f"({scale.num_train}, {list(scale.batches)}).")
  return record["chosen_lr_scales"]


def read_choice_record(path: str, scale: study_plan.Scale) -> dict | None:
  """A recipe choice's JSON (recipe_choice.json, recipe_long_choice.json
  or recipe_revised_choice.json) at `path` (None if there is none);
  ValueError when it chose at other images or epochs than `scale`'s."""
  if not os.path.exists(path):
    logging.info("No %s.", path)
    return None
  with open(path) as f:
    record = json.load(f)
  chosen_at = (record["scale"]["num_train"],
               record["scale"].get("train_epochs", 0.0))
  if chosen_at != (scale.num_train, scale.train_epochs):
    raise ValueError(f"{path} was chosen at {chosen_at[0]} training images "
                     f"and train_epochs {chosen_at[1]:g}, this run has "
                     f"{scale.num_train} and {scale.train_epochs:g}: run "
                     "its choice at this scale first.")
  return record


# Each recipe study after recipe_choice: the choice whose picks it trains
# or weighs against (read from --output_dir when that one does not run in
# the same command); and the make target that writes each choice.
NEEDS = {"recipe_long_choice": "recipe_choice",
         "recipe_long": "recipe_long_choice",
         **{name: prior for name, (prior, _) in study_plan.ROUNDS.items()},
         **{name.removesuffix("_choice"): name
            for name in study_plan.ROUNDS}}
MAKES = {"recipe_choice": "study-recipe-choice",
         "recipe_long_choice": "study-recipe-long",
         "recipe_revised_choice": "study-recipe-revised",
         "recipe_crop_choice": "study-recipe-crop"}


def read_choices(names: list[str], output_dir: str,
                 scale: study_plan.Scale) -> dict[str, dict]:
  """The choices that `names` need and do not run (NEEDS; recipe reads
  recipe_choice's if there is one), from `output_dir`: {choice: {"chosen",
  "runs", "file"}}."""
  wanted = {NEEDS[n] for n in names if n in NEEDS}
  wanted |= {"recipe_choice"} if "recipe" in names else set()
  choices = {}
  for name in sorted(wanted - set(names)):
    path = os.path.join(output_dir, f"{name}.json")
    record = read_choice_record(path, scale if name == "recipe_choice"
                                else study_plan.long_scale(scale))
    if record is not None:  # a round's picks may come from its prior
      choices[name] = {"chosen": record["chosen"], "file": path,
                       "runs": record["runs"] + record.get("prior_runs", [])}
  return choices


def needs_choice(names: list[str], choices: dict[str, dict]) -> None:
  """ValueError, before anything trains, when a study's choice (NEEDS)
  neither runs in `names` nor is in `choices`."""
  for name in names:
    needed = NEEDS.get(name)
    if needed and needed not in names and needed not in choices:
      raise ValueError(f"{name} needs {needed}.json's picks and runs: none "
                       f"in --output_dir (run make {MAKES[needed]} first).")


def run_studies(names: list[str], scale: study_plan.Scale,
                runner: "study_runner.Runner",
                lr_scales: dict | None = None,
                lr_source: dict | None = None,
                choices: dict[str, dict] | None = None) -> list[str]:
  """Runs the named studies in order; returns the files written.
  `lr_scales`: lr's choice, already made (lr does not run again), at
  `lr_source` (its file and scale); `choices`: the recipe choices made
  before, as read_choices gives them."""
  written, base, plan = [], runner.base, study_plan
  choices = dict(choices or {})
  if lr_scales is not None:
    logging.info("LR rules taken from --lr_choice: %s", lr_scales)
  elif any(name in plan.NEEDS_LR for name in names):
    lr_runs = plan.lr_runs(base, scale)
    lr_scales = plan.chosen_lr_scales(runner.execute_all(lr_runs))
    logging.info("LR rules chosen at batch %d: %s", min(scale.batches),
                 lr_scales)
    written += runner.study("lr", lr_runs, [],
                            extra={"chosen_lr_scales": lr_scales})
  if "a" in names:
    written += runner.study("a", plan.bn_runs(base, scale, lr_scales),
                            plan.bn_criteria(scale),
                            extra={"chosen_lr_scales": lr_scales})
  if "b" in names:
    main_runs = plan.large_batch_runs(base, scale, lr_scales)
    best = runner.best_optimizer(runner.execute_all(main_runs),
                                 max(scale.batches))
    logging.info("Best optimizer at batch %d: %s; now without label "
                 "smoothing", max(scale.batches), best)
    written += runner.study(
        "b", main_runs + plan.label_smoothing_runs(base, scale, best,
                                                   lr_scales),
        plan.large_batch_criteria(scale, best),
        extra={"best_optimizer": best, "chosen_lr_scales": lr_scales})
  if "c" in names:
    written += runner.study("c", plan.batch_control_runs(base, scale,
                                                         lr_scales),
                            plan.batch_control_criteria(),
                            extra={"chosen_lr_scales": lr_scales})
  if "baseline" in names:
    written += runner.study("baseline", plan.baseline_runs(base, scale,
                                                           lr_scales), [
        study_verdict.Criterion(
            "the project's path beats stock Keras",
            (("path", "stock_keras"),), (("path", "project"),))],
        extra={"chosen_lr_scales": lr_scales})
  if "crop" in names:
    written += runner.study("crop", plan.crop_runs(base, scale, lr_scales),
                            plan.crop_criteria(),
                            extra={"chosen_lr_scales": lr_scales})
  if "ladder" in names:
    written += runner.study(
        "ladder", plan.ladder_runs(base, scale, lr_scales),
        plan.ladder_criteria(plan.lr_scale(lr_scales, "momentum")),
        extra={"chosen_lr_scales": lr_scales})
  if "recipe_choice" in names:
    runs = plan.recipe_choice_runs(base, scale, lr_scales)
    records = runner.execute_all(runs)
    choice = plan.recipe_choice(records, plan.recipe_candidates(lr_scales))
    logging.info("Recipe choice on seeds %s: %s", plan.RECIPE_CHOICE_SEEDS,
                 choice)
    written += runner.study("recipe_choice", runs, [],
                            extra={"chosen_lr_scales": lr_scales,
                                   "chosen": choice})
    choices["recipe_choice"] = {"chosen": choice, "runs": records,
                                "file": written[-2]}
  if "recipe" in names:
    written += recipe_check(runner, scale, lr_scales,
                            choices.get("recipe_choice"))
  if "recipe_long_choice" in names:
    choices["recipe_long_choice"], runs, centre = long_recipe_choice(
        runner, scale, choices["recipe_choice"])
    written += runner.study(
        "recipe_long_choice", runs, [], scale=plan.long_scale(scale),
        extra={"centre": centre,
               "chosen": choices["recipe_long_choice"]["chosen"]})
    choices["recipe_long_choice"]["file"] = written[-2]
  if "recipe_long" in names:
    written += picked_check(runner, "recipe_long", scale,
                            choices["recipe_long_choice"])
  for name, (prior_name, _) in plan.ROUNDS.items():
    if name in names:
      prior = choices[prior_name]
      choices[name], runs = next_recipe_choice(runner, scale, name, prior)
      written += runner.study(
          name, runs, [], scale=plan.long_scale(scale),
          extra={"prior": {"file": prior["file"], **{
              side: {k: prior["chosen"][side][k] for k in ("candidate",
                                                           "top1_mean")}
              for side in (plan.STOCK_SIDE, plan.RECIPE_SIDE)}},
                 "chosen": choices[name]["chosen"],
                 "prior_runs": choices[name]["prior_runs"]})
      choices[name]["file"] = written[-2]
    check = name.removesuffix("_choice")
    if check in names:
      written += picked_check(runner, check, scale, choices[name])
  if "regime" in names:
    written += runner.study(
        "regime", plan.regime_runs(base, scale, lr_scales),
        plan.regime_criteria(scale),
        extra={"chosen_lr_scales": lr_scales, "lr_chosen_at": lr_source})
  return written


def recipe_check(runner: "study_runner.Runner", scale: study_plan.Scale,
                 lr_scales: dict | None, choice: dict | None) -> list[str]:
  """recipe: the flagfile against stock Keras at `choice`'s pick (else
  lr's rule); returns the files written."""
  plan = study_plan
  recipe, chosen = plan.recipe_settings(), choice and choice["chosen"]
  stock = (plan.lr_scale(lr_scales, "momentum") if chosen is None else
           chosen[plan.STOCK_SIDE]["lr_scale"])
  return runner.study(
      "recipe", plan.recipe_runs(runner.base, scale, lr_scales, recipe,
                                 stock),
      plan.recipe_criteria(),
      extra={"chosen_lr_scales": lr_scales, "recipe": recipe,
             "stock_lr_scale": stock,
             "choice": chosen and {"file": choice["file"], **chosen},
             "recipe_is_choice": bool(chosen) and recipe == chosen[
                 plan.RECIPE_SIDE]["settings"]})


def long_recipe_choice(runner: "study_runner.Runner",
                       scale: study_plan.Scale, choice: dict
                       ) -> tuple[dict, list[study_plan.Run], dict]:
  """recipe_long_choice: each side's grid centred on its pick in `choice`
  (recipe_choice's). Returns {"chosen", "runs" (records)}, the runs and
  the centre (`choice`'s file and each side's candidate)."""
  plan = study_plan
  stock, recipe = (choice["chosen"][plan.STOCK_SIDE]["lr_scale"],
                   choice["chosen"][plan.RECIPE_SIDE]["settings"])
  candidates = plan.recipe_long_candidates(stock, recipe)
  runs = plan.recipe_long_choice_runs(runner.base, scale, stock, recipe)
  records = runner.execute_all(runs)
  chosen = plan.recipe_choice(records, candidates)
  logging.info("Long recipe choice on seeds %s: %s",
               plan.RECIPE_CHOICE_SEEDS, chosen)
  centre = {side: next(name for s, name, _ in candidates if s == side)
            for side in (plan.STOCK_SIDE, plan.RECIPE_SIDE)}
  return ({"chosen": chosen, "runs": records}, runs,
          {"file": choice["file"], **centre})


def picked_check(runner: "study_runner.Runner", name: str,
                 scale: study_plan.Scale, choice: dict) -> list[str]:
  """A check at long_scale(scale) (study_plan.CHECK_SEEDS's) training each
  side at the pick of `choice` ({"chosen", "file"}); returns the files
  written."""
  plan, chosen = study_plan, choice["chosen"]
  recipe = chosen[plan.RECIPE_SIDE]["settings"]
  stock = chosen[plan.STOCK_SIDE]["lr_scale"]
  return runner.study(
      name, plan.long_check_runs(runner.base, scale, name, recipe, stock),
      plan.recipe_criteria(), scale=plan.long_scale(scale),
      extra={"recipe": recipe, "stock_lr_scale": stock,
             "choice": {"file": choice["file"], **chosen},
             "recipe_is_choice": recipe == plan.recipe_settings()})


def next_recipe_choice(runner: "study_runner.Runner",
                       scale: study_plan.Scale, name: str, prior: dict
                       ) -> tuple[dict, list[study_plan.Run]]:
  """A round's choice (study_plan.ROUNDS[name]): stock Keras's new LR
  first, its pick then sets the recipe's momentum candidates; each side
  keeps the best of its candidates and its pick in `prior` (a choice's
  {"chosen", "runs", "file"}, the pick measured in its runs). Returns
  {"chosen", "runs" (records of the prior picks and the new runs),
  "prior_runs" (the prior picks')} and the new runs; ValueError when
  `prior` holds no runs of a pick."""
  plan = study_plan
  stock_pick, recipe_pick = (prior["chosen"][plan.STOCK_SIDE],
                             prior["chosen"][plan.RECIPE_SIDE])
  picks = (stock_pick["candidate"], recipe_pick["candidate"])
  records = [r for r in prior["runs"] if dict(r["point"])["candidate"] in
             picks]
  missing = set(picks) - {dict(r["point"])["candidate"] for r in records}
  if missing:
    raise ValueError(f"{name}: {prior['file']} holds no runs of its picks "
                     f"{sorted(missing)}; rerun its make target.")
  prior_runs = list(records)
  stock = [(plan.STOCK_SIDE, stock_pick["candidate"],
            {"lr_scale": stock_pick["lr_scale"]})
           ] + plan.next_stock_candidates(stock_pick["lr_scale"])
  stock_runs = plan.round_choice_runs(runner.base, scale, name, stock[1:])
  records += runner.execute_all(stock_runs)
  stock_scale = plan.recipe_choice(records, stock)[plan.STOCK_SIDE][
      "lr_scale"]
  recipe = [(plan.RECIPE_SIDE, recipe_pick["candidate"],
             recipe_pick["settings"])] + plan.ROUNDS[name][1](
                 stock_scale, recipe_pick["settings"])
  recipe_runs = plan.round_choice_runs(runner.base, scale, name, recipe[1:])
  records += runner.execute_all(recipe_runs)
  chosen = plan.recipe_choice(records, stock + recipe)
  logging.info("%s on seeds %s (with %s's picks): %s", name,
               plan.RECIPE_CHOICE_SEEDS, prior["file"], chosen)
  return ({"chosen": chosen, "runs": records, "prior_runs": prior_runs},
          stock_runs + recipe_runs)


def fit_budget(names: list[str], runner: "study_runner.Runner",
               budget_s: float, shrink: bool,
               with_lr: bool = True) -> study_plan.Scale:
  """Estimates the plan; halves its images until it fits `budget_s`.

  Every halving is estimated (a step's cost is not monotonic in its batch:
  per-step overhead can dominate), up to MAX_HALVINGS; when none fits, the
  cheapest scale is taken and said.
  """
  estimates = []
  for halvings in range(MAX_HALVINGS + 1):
    plan = runner.plan(names, with_lr)
    wall, cpu = runner.estimate(plan)
    estimates.append((wall, runner.scale))
    cores = os.cpu_count() or 1
    print(f"Estimated wall time of the plan at {runner.scale.num_train} "
          f"training images ({len(plan)} runs): {wall / 60:.0f} min at the "
          f"current load (average {os.getloadavg()[0]:.1f}); its "
          f"{cpu / 60:.0f} CPU-minutes take {cpu / cores / 60:.0f}-"
          f"{cpu / 60:.0f} min on an idle {cores}-core machine", flush=True)
    if not shrink or wall <= budget_s:
      return runner.scale
    if halvings < MAX_HALVINGS:
      runner.rescale(runner.scale.shrunk())
  wall, scale = min(estimates, key=lambda e: e[0])
  print(f"No scale fits --budget_minutes={budget_s / 60:g}: the cheapest, "
        f"{scale.num_train} training images, takes about {wall / 60:.0f} "
        "min.", flush=True)
  return scale


def lr_choice_source(path: str) -> dict | None:
  """The file of --lr_choice and the images and batches it chose at."""
  if not path:
    return None
  with open(path) as f:
    scale = json.load(f)["scale"]
  return {"file": path, "num_train": scale["num_train"],
          "batches": scale["batches"]}


def load_data(scale: study_plan.Scale) -> study_data.StudyData:
  try:
    return study_data.study_data(FLAGS.cache_dir, FLAGS.image_dir,
                                 scale.num_train, scale.num_test,
                                 FLAGS.fashion_mnist_dir)
  except ValueError as error:
    raise app.UsageError(str(error)) from error


def make_runner(scale: study_plan.Scale, data: study_data.StudyData,
                costs: dict | None = None
                ) -> tuple[study_plan.Scale, "study_runner.Runner"]:
  """The scale at the data's real counts and a runner of it (with the
  calibration's `costs`, so that each run records its estimate)."""
  scale = dataclasses.replace(scale, num_train=data.num_train,
                              num_test=data.num_test)
  return scale, study_runner.Runner(data, scale, FLAGS.work_dir,
                                    FLAGS.output_dir, FLAGS.strategy,
                                    command(sys.argv), costs)


def stop(signum: int, frame: object) -> None:
  """SIGTERM: stop (a project run in flight first checkpoints, or ends if
  it was in its last host loop); the studies written so far stay."""
  del frame
  logging.warning("SIGTERM: stopping; the studies already written stay in "
                  "--output_dir=%s.", FLAGS.output_dir)
  sys.exit(128 + signum)


def main(argv: list[str]) -> None:
  names = [n.strip() for n in FLAGS.studies]
  unknown = sorted(set(names) - set(STUDIES))
  if unknown or (FLAGS.smoke and FLAGS.full):
    raise app.UsageError(f"--studies must be among {STUDIES} (got "
                         f"{unknown}) and --smoke excludes --full.")
  regime = "regime" in names and not FLAGS.smoke
  if regime and (names != ["regime"] or FLAGS.full or FLAGS.halvings > 0):
    raise app.UsageError("--studies=regime runs alone, at its own scale "
                         "(study_plan.REGIME): without other studies, "
                         "--full or --halvings.")
  scale = (study_plan.SMOKE if FLAGS.smoke else
           study_plan.FULL if FLAGS.full else
           study_plan.REGIME if regime else study_plan.DEFAULT)
  for _ in range(max(FLAGS.halvings, 0)):
    scale = scale.shrunk()
  start = time.time()
  signal.signal(signal.SIGTERM, stop)
  # Before any TensorFlow op (the data step's) initialises the devices.
  configure_cpu_replicas(max(scale.bn_replicas, scale.micro_replicas))
  data = load_data(scale)
  scale, runner = make_runner(scale, data)
  plan = runner.plan(names, with_lr=not FLAGS.lr_choice)
  logging.info("Plan: %d runs of %s; %s", len(plan), data.name,
               runner.describe(plan))
  if not FLAGS.smoke:
    # Calibrated with --halvings too: each run records its estimate. A
    # user's --image_dir is used whole: only Fashion-MNIST is subset.
    fitted = fit_budget(names, runner, 60 * FLAGS.budget_minutes,
                        shrink=FLAGS.halvings < 0 and not (
                            FLAGS.full or FLAGS.image_dir or regime),
                        with_lr=not FLAGS.lr_choice)
    if FLAGS.estimate_only:
      return
    if fitted.num_train != scale.num_train:
      scale, runner = make_runner(fitted, load_data(fitted), runner.costs)
  try:
    lr_scales = (chosen_lr_scales(FLAGS.lr_choice, scale, any_scale=regime)
                 if FLAGS.lr_choice else None)
    choices = read_choices(names, FLAGS.output_dir, scale)
    needs_choice(names, choices)
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  written = run_studies(names, scale, runner, lr_scales,
                        lr_choice_source(FLAGS.lr_choice), choices)
  runner.discard_checkpoints()
  gc.collect()
  shutil.rmtree(os.path.join(FLAGS.work_dir, "calibration"),
                ignore_errors=True)
  logging.info("Done in %.1f min: %s", (time.time() - start) / 60,
               ", ".join(written))


if __name__ == "__main__":
  define_flags()
  app.run(main)
