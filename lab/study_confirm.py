"""The confirmatory recipe comparison (issue 51): lab/confirm_plan.py's plan.

  python -m lab.study_confirm [--output_dir=bench_results/studies]
      [--smoke]

Picks each side's LR on a validation split of the training photos
(confirm_choice: .md, .json, .png), extending the shared grid while a pick
sits at its edge, then runs the check on fresh seeds against the test
photos (confirm). `make study-confirm` runs it (about 75 minutes on 2 CPU
cores); --smoke is the CI test's few-step version.
"""
import json
import sys
import time

from absl import app
from absl import flags
from absl import logging

from resnet_tpu.parallel.tensorflow.strategy import configure_cpu_replicas
from lab import confirm_plan
from lab import study
from lab import study_data
from lab import study_runner
from lab.run_records import RecordStore

FLAGS = flags.FLAGS
STUDIES = ("confirm_choice", "confirm")  # study_report.TEXT's names


def define_flags() -> None:
  flags.DEFINE_bool("smoke", False, "A few steps per run on a few hundred "
                    "images (the CI test).")
  study.define_path_flags()
  flags.DEFINE_string("choice_file", "", "A confirm_choice.json made "
                      "before: the check runs at its picks, and the choice "
                      "is not run again.")
  flags.DEFINE_string("records_dir", "", "Keep each finished run's record "
                      "here: a second start resumes, and workers started "
                      "with the same folder share the runs (each its own "
                      "--output_dir).")


def choose(runner: study_runner.Runner, scale, settings: dict
           ) -> tuple[dict, list, list[float], list[dict]]:
  """confirm_choice: the grid's runs, extended while a pick is at an edge.
  Returns the picks, the runs, the final grid and each round's picks."""
  grid, runs, rounds = list(confirm_plan.LR_GRID), [], []
  new = list(grid)
  while True:
    more = confirm_plan.choice_runs(runner.base, scale, new, settings)
    runs += more
    chosen = confirm_plan.pick(runner.execute_all(runs), grid)
    rounds.append({"grid": list(grid), "chosen": chosen})
    logging.info("Validation picks on grid %s: %s", grid, chosen)
    new = confirm_plan.extension(grid, chosen)
    if not new or len(rounds) > confirm_plan.MAX_EXTENSIONS:
      return chosen, runs, grid, rounds
    grid = sorted(grid + new)


def read_choice(path: str, split: dict) -> tuple[dict, dict]:
  """The picks and search spaces of a confirm_choice.json; UsageError
  unless it was made on `split`."""
  with open(path) as f:
    record = json.load(f)
  if record.get("validation_split") != split:
    raise app.UsageError(f"--choice_file={path} was picked on another "
                         f"validation split: {record.get('validation_split')}"
                         f", this plan's is {split}.")
  return record["chosen"], record["search_spaces"]


def main(argv: list[str]) -> None:
  del argv
  start = time.time()
  scale = confirm_plan.SMOKE_SCALE if FLAGS.smoke else confirm_plan.SCALE
  per_class = (confirm_plan.SMOKE_PER_CLASS if FLAGS.smoke else
               confirm_plan.VALIDATION_PER_CLASS)
  first = scale.num_train if FLAGS.smoke else confirm_plan.VALIDATION_FIRST
  # Before any TensorFlow op (the data step's) initialises the devices.
  configure_cpu_replicas(max(scale.bn_replicas, scale.micro_replicas))
  try:
    settings = confirm_plan.recipe()
    validation = study_data.validation_data(
        FLAGS.cache_dir, scale.num_train, per_class,
        confirm_plan.VALIDATION_SEED, first, FLAGS.fashion_mnist_dir)
    test = study_data.study_data(FLAGS.cache_dir, "", scale.num_train,
                                 scale.num_test, FLAGS.fashion_mnist_dir)
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  command = study.command(sys.argv, "lab.study_confirm")
  split = {"source": "Fashion-MNIST training photos", "seed":
           confirm_plan.VALIDATION_SEED, "per_class": per_class,
           "images": validation.num_test, "drawn_after_index": first,
           "training_images": scale.num_train}
  records = RecordStore(FLAGS.records_dir) if FLAGS.records_dir else None
  picker = study_runner.Runner(validation, scale, FLAGS.work_dir,
                               FLAGS.output_dir, "cpu", command,
                               records=records)
  if FLAGS.choice_file:
    chosen, spaces = read_choice(FLAGS.choice_file, split)
    written, choice_file = [], FLAGS.choice_file
  else:
    chosen, runs, grid, rounds = choose(picker, scale, settings)
    spaces = confirm_plan.search_spaces(grid, settings)
    written = picker.study("confirm_choice", runs, [], scale=scale, extra={
        "validation_split": split, "search_spaces": spaces,
        "rounds": rounds, "chosen": chosen,
        "pick_seeds": list(confirm_plan.PICK_SEEDS),
        "picks_inside_grid": not any(c["at_edge"]
                                     for c in chosen.values())})
    choice_file = written[1]  # its .json
  checker = study_runner.Runner(test, scale, FLAGS.work_dir,
                                FLAGS.output_dir, "cpu", command,
                                records=records)
  written += checker.study(
      "confirm", confirm_plan.check_runs(checker.base, scale, chosen,
                                         settings),
      [confirm_plan.CRITERION], scale=scale, extra={
          "validation_split": split, "search_spaces": spaces,
          "chosen": chosen, "choice_file": choice_file,
          "fresh_seeds": list(confirm_plan.CHECK_SEEDS),
          "recipe": settings})
  checker.discard_checkpoints()
  logging.info("Done in %.1f min: %s", (time.time() - start) / 60,
               ", ".join(written))


if __name__ == "__main__":
  define_flags()
  app.run(main)
