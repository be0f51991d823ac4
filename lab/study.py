r"""The papers' central claims at laptop scale, on real photos.

  python -m lab.study [--studies=a,b,c] [--smoke | --full] \
      [--image_dir=D] [--estimate_only]

Trains the project's own ResNet through the real path: class-folder JPEGs
-> data/build_tfrecords.py -> the input pipeline -> resnet_tpu.run.run on
CPU replicas -> evaluation over every test image. The default data is
Fashion-MNIST from Debian's dataset-fashion-mnist package, written once as
32 px RGB JPEGs and cached (lab/study_data.py); --image_dir takes any
train/<class>/ + validation/<class>/ (or test/<class>/) image set instead.
lab/study_plan.py defines the three studies and the one LR rule of each
optimizer:

  a  distributed BN (Ying et al. 2018 §3.1): BN group sizes 1-8 on 8
     replicas of 4 images, same steps and LR; test top-1 and steps/s;
  b  large batches (Goyal 2017; Ying 2018 §3; Akiba 2017): top-1 against
     the global batch at equal epochs for momentum SGD, LARS and RMSprop
     warm-up, then the best at the largest batch without label smoothing;
  c  batch-size control (Mikami et al. 2018): a growing batch against its
     final batch held fixed from the start, same epochs.

Each study writes <name>.md, .json and .png to --output_dir
(bench_results/studies). At start-up a few timed steps of each kind of run
(8 replicas with local and with grouped BN, 2 replicas for b and c) give
the estimated wall time of the whole plan at the current machine load;
--estimate_only stops there. --full (all 60k images, 30 passes, batches to 16384, 3 seeds) is for
GPU/TPU hosts (--strategy), --smoke is the CI test's few-step version.
"""
import dataclasses
import gc
import os
import shutil
import sys
import time

from absl import app
from absl import flags
from absl import logging

from resnet_tpu.parallel.strategy import configure_cpu_replicas
from lab import study_plan
from lab import study_data
from lab import study_runner

FLAGS = flags.FLAGS
STUDIES = ("a", "b", "c")
PATH_FLAGS = ("--work_dir", "--cache_dir", "--output_dir", "--image_dir",
              "--fashion_mnist_dir")


def define_flags() -> None:
  flags.DEFINE_list("studies", list(STUDIES), "Studies to run: a, b, c.")
  flags.DEFINE_bool("smoke", False, "A few steps per point on a few hundred "
                    "images (the CI test).")
  flags.DEFINE_bool("full", False, "All 60k images, 30 passes, batches to "
                    "16384, 3 seeds: for GPU/TPU hosts.")
  flags.DEFINE_bool("estimate_only", False, "Print the estimated wall time "
                    "of the plan and stop.")
  flags.DEFINE_string("image_dir", "", "train/<class>/ and validation/"
                      "<class>/ (or test/) images instead of Fashion-MNIST.")
  flags.DEFINE_string("fashion_mnist_dir", study_data.FASHION_MNIST_DIR,
                      "Folder of the Fashion-MNIST idx files.")
  flags.DEFINE_string("cache_dir", os.path.join(
      os.path.expanduser("~"), ".cache", "resnet_tpu", "fashion_mnist"),
                      "Where the study set's JPEGs and TFRecords are kept.")
  flags.DEFINE_string("work_dir", "/tmp/resnet_tpu_study", "Run folders "
                      "(metrics.jsonl and config.json are kept).")
  flags.DEFINE_string("output_dir", "bench_results/studies",
                      "Where the .md, .json and .png of each study go.")
  flags.DEFINE_enum("strategy", "cpu", ["cpu", "gpu", "tpu"], "--strategy "
                    "of every run; gpu/tpu need as many devices as the "
                    "scale's replicas.")


def command(argv: list[str]) -> str:
  """The command line without machine-specific path flags."""
  kept = [a for a in argv[1:] if not a.startswith(PATH_FLAGS)]
  return " ".join(["python -m lab.study"] + kept)


def run_studies(names: list[str], scale: study_plan.Scale,
                runner: "study_runner.Runner") -> list[str]:
  """Runs the named studies in order; returns the files written."""
  written = []
  base = runner.base
  if "a" in names:
    written += runner.study("a", study_plan.bn_runs(base, scale))
  if "b" in names:
    main_runs = study_plan.large_batch_runs(base, scale)
    records = runner.execute_all(main_runs)
    best = runner.best_optimizer(records, max(scale.batches))
    logging.info("Best optimizer at batch %d: %s; now without label "
                 "smoothing", max(scale.batches), best)
    written += runner.study("b", main_runs + study_plan.label_smoothing_runs(
        base, scale, best), extra={"best_optimizer": best})
  if "c" in names:
    written += runner.study("c", study_plan.batch_control_runs(base, scale))
  return written


def main(argv: list[str]) -> None:
  names = [n.strip() for n in FLAGS.studies]
  unknown = sorted(set(names) - set(STUDIES))
  if unknown or (FLAGS.smoke and FLAGS.full):
    raise app.UsageError(f"--studies must be among {STUDIES} (got "
                         f"{unknown}) and --smoke excludes --full.")
  scale = (study_plan.SMOKE if FLAGS.smoke else
           study_plan.FULL if FLAGS.full else study_plan.DEFAULT)
  start = time.time()
  # Before any TensorFlow op (the data step's) initialises the devices.
  configure_cpu_replicas(max(scale.replicas, scale.micro_replicas))
  try:
    data = study_data.study_data(FLAGS.cache_dir, FLAGS.image_dir,
                                 scale.num_train, scale.num_test,
                                 FLAGS.fashion_mnist_dir)
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  scale = dataclasses.replace(scale, num_train=data.num_train,
                              num_test=data.num_test)
  runner = study_runner.Runner(data, scale, FLAGS.work_dir,
                               FLAGS.output_dir, FLAGS.strategy,
                               command(sys.argv))
  plan = runner.plan(names)
  logging.info("Plan: %d runs of %s; %s", len(plan), data.name,
               runner.describe(plan))
  if not FLAGS.smoke:
    wall, cpu = runner.estimate(plan)
    cores = os.cpu_count() or 1
    print(f"Estimated wall time of the plan ({len(plan)} runs, calibration "
          f"included): {wall / 60:.0f} min at the current load (average "
          f"{os.getloadavg()[0]:.1f}); its {cpu / 60:.0f} CPU-minutes take "
          f"{cpu / cores / 60:.0f}-{cpu / 60:.0f} min on an idle "
          f"{cores}-core machine", flush=True)
    if FLAGS.estimate_only:
      return
  written = run_studies(names, scale, runner)
  gc.collect()
  shutil.rmtree(os.path.join(FLAGS.work_dir, "calibration"),
                ignore_errors=True)
  logging.info("Done in %.1f min: %s", (time.time() - start) / 60,
               ", ".join(written))


if __name__ == "__main__":
  define_flags()
  app.run(main)
