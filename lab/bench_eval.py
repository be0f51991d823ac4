"""Where users wait: evaluation, checkpoint saves and the end of a run.

  python -m lab.bench_eval --output_dir=bench_results [--tiny] \
      [--variants=long_lived,per_evaluation]

Each sample is one training run in its own process, as `make study` runs
them: 8 virtual CPU replicas under MirroredStrategy, the study's narrow
ResNet on Fashion-MNIST (lab/study_data.py), evaluating the whole test set
every --eval_every steps, by run.run. --variants, alternating A B A B:

- `long_lived`: today's engine (resnet_tpu/engines/tensorflow/iterators.py):
  one evaluation iterator for the run, input iterators dropped on a thread
  of their own when fit returns; alone in `make bench` (eval.json);
- `per_evaluation`: the trainer as it was before issue 38, patched back in
  for this variant only: a new evaluation iterator per evaluation, each
  input iterator deleted on the thread that trained. It waits minutes per
  run, so the before/after comparison has a target of its own, `make
  bench-eval-stall` (eval_stall.json).

Each sample records every evaluation's seconds, evaluation and training
images/s, the seconds each checkpoint save blocked training, the seconds
from the end of the last host loop (last step) to the return of run(), and
from there to the end of the process. A child that outlives --timeout_s is
killed and counted at the timeout.

Then, in one more process, a ResNet-50 checkpoint (the size users save, 1
replica) alternates between the trainer's synchronous save and
tf.train.CheckpointOptions(enable_async=True): the seconds each blocks the
caller, and the async save's seconds until its files are written.
"""
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags
from absl import logging

FLAGS = flags.FLAGS
VARIANTS = ("long_lived", "per_evaluation")
# What the before/after run adds to summary.json.
STALL_HEADLINES = ("eval_seconds_old_over_new", "last_step_to_return_s_old")
REPLICAS = 8


@contextlib.contextmanager
def per_evaluation_iterators():
  """The evaluation and teardown of the trainer before issue 38: each
  evaluation reads a new iterator and deletes it when it returns, and fit
  deletes the training iterator itself."""
  from resnet_tpu.engines.tensorflow import iterators

  def release_now(owned: list) -> None:
    owned.clear()  # deletes the iterators here, on the caller's thread

  saved = (iterators.release, iterators.EvalInput.serves)
  iterators.release = release_now
  iterators.EvalInput.serves = lambda self, *args: False
  try:
    yield
  finally:
    iterators.release, iterators.EvalInput.serves = saved


def child(variant: str, data_dir: str, model_dir: str, result_path: str,
          setup: dict) -> None:
  """One timed training run (in a child process of its own)."""
  from resnet_tpu.runtime import process_setup
  process_setup.apply_cpu_kernel_choice("auto", "cpu")
  from lab import study_model
  from resnet_tpu.config import TrainConfig
  from resnet_tpu.run import run
  from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine

  cfg = TrainConfig.from_flat(
      model_dir=model_dir, data_dir=data_dir, strategy="cpu",
      num_cpu_replicas=REPLICAS, resnet_depth=18, num_classes=10,
      image_size=32, global_batch_size=setup["batch"],
      eval_batch_size=setup["eval_batch"],
      num_eval_images=setup["num_test"], num_train_images=setup["num_train"],
      train_steps=setup["steps"], eval_every_steps=setup["eval_every"],
      steps_per_loop=setup["eval_every"], keep_checkpoints=1,
      shuffle_buffer_size=setup["num_train"], lr_schedule="constant",
      warmup_epochs=0.0)
  saves, loop_ends, eval_ends, eval_walls = [], [], [], []
  original_save, original_evaluate = (TensorFlowEngine.save,
                                     TensorFlowEngine.evaluate)

  def timed_save(self):
    start = time.time()
    path = original_save(self)
    saves.append(time.time() - start)
    return path

  def timed_evaluate(self, *args):
    start = time.time()
    result = original_evaluate(self, *args)
    eval_ends.append(time.time())
    eval_walls.append((eval_ends[-1] - start, result.examples))
    return result

  TensorFlowEngine.save, TensorFlowEngine.evaluate = (timed_save,
                                                      timed_evaluate)
  patch = (per_evaluation_iterators() if variant == "per_evaluation"
           else contextlib.nullcontext())
  with patch:
    run(cfg, model_fn=study_model.narrow_resnet,
        loop_callback=lambda record: loop_ends.append(time.time()))
  returned = time.time()
  with open(os.path.join(model_dir, "metrics.jsonl")) as f:
    trains = [r for r in map(json.loads, f) if r["split"] == "train"]
  with open(result_path, "w") as f:
    json.dump({
        # The wall time of each TensorFlowEngine.evaluate call, iterators
        # included.
        "eval_seconds": [seconds for seconds, _ in eval_walls],
        "eval_images_per_sec": [n / seconds for seconds, n in eval_walls],
        # The first loop traces the step.
        "train_images_per_sec": [r["images_per_sec"] for r in trains[1:]],
        "save_seconds": saves,
        "last_step_to_return_s": returned - loop_ends[-1],
        "last_eval_to_return_s": returned - eval_ends[-1],
        "returned_at": returned}, f)


def save_child(result_path: str, repetitions: int, depth: int,
               image_size: int, model_dir: str) -> None:
  """Times ResNet-`depth` saves, sync against async (a child process)."""
  from resnet_tpu.runtime import process_setup
  process_setup.apply_cpu_kernel_choice("auto", "cpu")
  import tensorflow as tf
  from resnet_tpu import preflight
  from resnet_tpu.config import TrainConfig
  from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine

  cfg = TrainConfig.from_flat(
      model_dir=model_dir, use_synthetic_data=True, resnet_depth=depth,
      num_classes=1000, image_size=image_size, global_batch_size=8,
      train_steps=1, keep_checkpoints=2,
      num_train_images=preflight.IMAGENET_TRAIN_IMAGES)
  checkpoints = TensorFlowEngine(cfg, tf.distribute.get_strategy()).checkpoints
  options = tf.train.CheckpointOptions(enable_async=True)
  times = {"sync_blocks_s": [], "async_blocks_s": [], "async_done_s": []}
  checkpoints.save()  # the first save builds its graph; not timed
  number = 1
  # Synchronous saves first: a checkpoint that tried an async save keeps
  # saving through its async helper.
  for _ in range(repetitions):
    number += 1
    start = time.time()
    checkpoints.manager.save(checkpoint_number=number)
    times["sync_blocks_s"].append(time.time() - start)
  for _ in range(repetitions):
    number += 1
    start = time.time()
    try:
      checkpoints.manager.save(checkpoint_number=number, options=options)
    except (ValueError, TypeError, tf.errors.OpError) as error:
      # TF 2.21 with Keras 3 variables: the async copy creates variables
      # inside a tf.function and fails; recorded.
      last = [line for line in str(error).splitlines() if line.strip()][-1]
      times["async_error"] = (f"{type(error).__name__}: "
                              + last.strip().split(". ")[0].removeprefix(
                                  "ValueError: ") + ".")
      number -= 1
      break
    times["async_blocks_s"].append(time.time() - start)
    checkpoints.checkpoint.sync()
    times["async_done_s"].append(time.time() - start)
  times["megabytes"] = sum(
      os.path.getsize(os.path.join(model_dir, name))
      for name in os.listdir(model_dir)
      if name.startswith(f"ckpt-{number}.")) / 1e6
  with open(result_path, "w") as f:
    json.dump(times, f)


def run_child(variant: str, data_dir: str, tag: str, setup: dict) -> dict:
  """Runs one sample; returns its measurements plus `exit_s`, the seconds
  from the return of run() to the end of the process."""
  model_dir = os.path.join(FLAGS.scratch_dir, tag)
  result_path = model_dir + ".json"
  subprocess.run(["rm", "-rf", model_dir, result_path], check=True)
  command = [sys.executable, "-m", "lab.bench_eval", f"--child={variant}",
             f"--child_data_dir={data_dir}", f"--child_model_dir={model_dir}",
             f"--child_result={result_path}",
             f"--child_setup={json.dumps(setup)}"]
  timed_out = False
  with open(model_dir + ".log", "w") as log:
    try:
      code = subprocess.run(command, timeout=FLAGS.timeout_s, stdout=log,
                            stderr=subprocess.STDOUT).returncode
    except subprocess.TimeoutExpired:
      timed_out, code = True, 0
  ended = time.time()
  if code:
    with open(model_dir + ".log") as log:
      raise RuntimeError(f"{variant} run {tag} failed (exit code {code}):\n"
                         + "".join(log.readlines()[-20:]))
  with open(result_path) as f:
    result = json.load(f)
  result["exit_s"] = ended - result.pop("returned_at")
  result["timed_out"] = timed_out
  return result


def run_save_child(setup: dict) -> dict:
  """The ResNet-50 save timings, from a process of their own."""
  model_dir = os.path.join(FLAGS.scratch_dir, "saves")
  result_path = model_dir + ".json"
  subprocess.run(["rm", "-rf", model_dir, result_path], check=True)
  command = [sys.executable, "-m", "lab.bench_eval", "--child=saves",
             f"--child_model_dir={model_dir}",
             f"--child_result={result_path}",
             f"--child_setup={json.dumps(setup)}"]
  with open(model_dir + ".log", "w") as log:
    code = subprocess.run(command, timeout=FLAGS.timeout_s, stdout=log,
                          stderr=subprocess.STDOUT).returncode
  if code:
    with open(model_dir + ".log") as log:
      raise RuntimeError(f"the save timing failed (exit code {code}):\n"
                         + "".join(log.readlines()[-20:]))
  with open(result_path) as f:
    return json.load(f)


def spread(values: list[float]) -> dict:
  return {"median": statistics.median(values), "min": min(values),
          "max": max(values)}


def summarise(samples: list[dict]) -> dict:
  """Per variant: each measurement's median and range over all samples."""
  pooled = {key: [v for s in samples for v in s[key]] for key in
            ("train_images_per_sec", "save_seconds")}
  # Evaluations after the first (which traces the evaluation step).
  for key in ("eval_seconds", "eval_images_per_sec"):
    pooled[key] = [v for s in samples for v in s[key][1:]]
  for key in ("last_step_to_return_s", "last_eval_to_return_s", "exit_s"):
    pooled[key] = [s[key] for s in samples]
  summary = {key: spread(values) for key, values in pooled.items()}
  summary["timed_out"] = sum(s["timed_out"] for s in samples)
  return summary


def headlines(summary: dict) -> dict:
  """Today's headlines; with the variant of before, the comparisons."""
  new = summary["long_lived"]
  rep = new["eval_seconds"]
  heads = {
      "eval_vs_train_images_per_sec":
          new["eval_images_per_sec"]["median"]
          / new["train_images_per_sec"]["median"],
      "eval_seconds_max_over_median": rep["max"] / rep["median"],
      "last_step_to_return_s": new["last_step_to_return_s"]["median"],
      "save_blocks_s": new["save_seconds"]["median"],
      "resnet50_save_blocks_s":
          summary["resnet50_saves"]["sync_blocks_s"]["median"],
  }
  if "per_evaluation" in summary:
    old = summary["per_evaluation"]
    heads["eval_seconds_old_over_new"] = (old["eval_seconds"]["median"]
                                          / rep["median"])
    heads["last_step_to_return_s_old"] = (
        old["last_step_to_return_s"]["median"])
  return heads


def _cell(value: dict, digits: int) -> str:
  return (f"{value['median']:.{digits}f} ({value['min']:.{digits}f}-"
          f"{value['max']:.{digits}f})")


def headline_ranges(summary: dict, saves: dict) -> dict:
  """Each headline's range over the runs (ratios: each side's range over
  the other's median)."""
  new = summary["long_lived"]
  train = new["train_images_per_sec"]["median"]
  evals = new["eval_seconds"]
  ranges = {
      "eval_vs_train_images_per_sec": [
          new["eval_images_per_sec"]["min"] / train,
          new["eval_images_per_sec"]["max"] / train],
      "eval_seconds_max_over_median": [evals["max"] / evals["median"]] * 2,
      "last_step_to_return_s": [new["last_step_to_return_s"]["min"],
                                new["last_step_to_return_s"]["max"]],
      "save_blocks_s": [new["save_seconds"]["min"],
                        new["save_seconds"]["max"]],
      "resnet50_save_blocks_s": [min(saves["sync_blocks_s"]),
                                 max(saves["sync_blocks_s"])],
  }
  if "per_evaluation" in summary:
    old = summary["per_evaluation"]
    ranges["eval_seconds_old_over_new"] = [
        old["eval_seconds"]["min"] / evals["median"],
        old["eval_seconds"]["max"] / evals["median"]]
    ranges["last_step_to_return_s_old"] = [
        old["last_step_to_return_s"]["min"],
        old["last_step_to_return_s"]["max"]]
  return ranges


COLUMNS = {"long_lived": "one iterator per run (today)",
           "per_evaluation": "one per evaluation (before)"}


def markdown(summary: dict, setup: dict, heads: dict,
             variants: list[str]) -> str:
  rows = (("eval_seconds", "evaluation after the first, s", 2),
          ("eval_images_per_sec", "evaluation after the first, images/s",
           0),
          ("train_images_per_sec", "training, images/s", 0),
          ("save_seconds", "checkpoint save blocks, s", 3),
          ("last_step_to_return_s", "last step to run() returned, s", 1),
          ("last_eval_to_return_s", "last evaluation to run() returned, s",
           1),
          ("exit_s", "run() returned to process end, s", 1))
  lines = [
      "### Evaluation and the end of a run on 8 virtual CPU replicas",
      "",
      f"{setup['repetitions']} {'alternating ' if len(variants) > 1 else ''}"
      f"runs per variant, each its own "
      f"process: narrow ResNet, {setup['num_train']} Fashion-MNIST training "
      f"images, batch {setup['batch']}, {setup['steps']} steps, the "
      f"{setup['num_test']} test images evaluated every "
      f"{setup['eval_every']} steps. Median (min-max) over every "
      "evaluation, save or run.",
      "",
      "| measurement | " + " | ".join(COLUMNS[v] for v in variants) + " |",
      "|---|" + "---:|" * len(variants),
  ]
  for key, name, digits in rows:
    cells = [f"{summary[v][key]['median']:.{digits}f} "
             f"({summary[v][key]['min']:.{digits}f}-"
             f"{summary[v][key]['max']:.{digits}f})" for v in variants]
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  lines += ["", "Runs killed at the timeout: " + ", ".join(
      f"{v} {summary[v]['timed_out']}" for v in variants) + ".",
            "", "Today: evaluation images/s / training images/s "
            f"{heads['eval_vs_train_images_per_sec']:.1f}x; the slowest "
            "repeated evaluation / their median "
            f"{heads['eval_seconds_max_over_median']:.2f}x."]
  saves = summary["resnet50_saves"]
  lines += ["", f"ResNet-{setup['save_depth']} at {setup['save_image_size']} "
            f"px ({saves['megabytes']:.0f} MB a checkpoint, 1 replica), "
            f"{setup['save_repetitions']} saves: the trainer's save blocks "
            + _cell(saves["sync_blocks_s"], 2) + " s."]
  if "async_error" in saves:
    lines += ["tf.train.CheckpointOptions(enable_async=True) fails on this "
              "TensorFlow and Keras (" + saves["async_error"] + "), so "
              "saves stay synchronous."]
  else:
    lines += ["tf.train.CheckpointOptions(enable_async=True), alternating "
              "with it, blocks " + _cell(saves["async_blocks_s"], 2)
              + " s and has written its files after "
              + _cell(saves["async_done_s"], 2) + " s."]
  return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
  del argv
  setup = dict(num_train=FLAGS.num_train, num_test=FLAGS.num_test,
               batch=FLAGS.batch, eval_batch=FLAGS.eval_batch,
               steps=FLAGS.steps, eval_every=FLAGS.eval_every,
               repetitions=FLAGS.repetitions, save_depth=50,
               save_image_size=224, save_repetitions=5)
  if FLAGS.child == "saves":
    child_setup = json.loads(FLAGS.child_setup)
    save_child(FLAGS.child_result, child_setup["save_repetitions"],
               child_setup["save_depth"], child_setup["save_image_size"],
               FLAGS.child_model_dir)
    return
  if FLAGS.child:
    child(FLAGS.child, FLAGS.child_data_dir, FLAGS.child_model_dir,
          FLAGS.child_result, json.loads(FLAGS.child_setup))
    # Ends as main.py ends a run on one host.
    from resnet_tpu.runtime import process_setup
    process_setup.exit_skipping_teardown(0)
  if FLAGS.tiny:
    setup.update(num_train=64, num_test=64, batch=16, eval_batch=16,
                 steps=4, eval_every=2, repetitions=1, save_depth=18,
                 save_image_size=32, save_repetitions=1)
  variants = FLAGS.variants.split(",")
  if variants not in (["long_lived"], list(VARIANTS)):
    raise app.UsageError(f"--variants must be long_lived or "
                         f"{','.join(VARIANTS)}, got {FLAGS.variants!r}.")
  # make bench: today's alone (eval.*); the comparison: eval_stall.*.
  stem = "eval" if len(variants) == 1 else "eval_stall"
  from lab import study_data
  from tools import bench_common
  os.makedirs(FLAGS.scratch_dir, exist_ok=True)
  parts = FLAGS.parts.split(",")
  if "runs" in parts:
    data = study_data.study_data(FLAGS.cache_dir, "", setup["num_train"],
                                 setup["num_test"], FLAGS.fashion_mnist_dir)
    samples = {v: [] for v in variants}
    for repetition in range(setup["repetitions"]):
      for variant in variants:
        sample = run_child(variant, data.data_dir,
                           f"{variant}_{repetition}", setup)
        logging.info("%s %d: %s", variant, repetition, sample)
        samples[variant].append(sample)
  else:  # the runs of the last eval.json, saves measured again
    with open(os.path.join(FLAGS.output_dir, f"{stem}.json")) as f:
      earlier = json.load(f)
    samples, setup = earlier["samples"], dict(earlier["setup"], **{
        k: v for k, v in setup.items() if k.startswith("save_")})
  summary = {v: summarise(s) for v, s in samples.items()}
  saves = run_save_child(setup)
  summary["resnet50_saves"] = {key: spread(values) for key, values in
                               saves.items() if isinstance(values, list)
                               and values}
  summary["resnet50_saves"].update(
      {key: saves[key] for key in ("megabytes", "async_error")
       if key in saves})
  heads = headlines(summary)
  report = markdown(summary, setup, heads, list(samples))
  ranges = headline_ranges(summary, saves)
  if stem == "eval_stall":  # today's headlines are make bench's (eval.json)
    heads = {k: heads[k] for k in STALL_HEADLINES}
    ranges = {k: ranges[k] for k in STALL_HEADLINES}
  bench_common.write_json(FLAGS.output_dir, f"{stem}.json", {
      "setup": setup, "machine": bench_common.machine(), "summary": summary,
      "samples": samples, "resnet50_saves": saves, **heads,
      "headline_ranges": ranges})
  with open(f"{FLAGS.output_dir}/{stem}.md", "w") as f:
    f.write(report)
  bench_common.merge_summary(FLAGS.output_dir, heads)
  print(report)


if __name__ == "__main__":
  flags.DEFINE_string("output_dir", "bench_results", "Where results go.")
  flags.DEFINE_string("scratch_dir", "/tmp/resnet_tpu_bench_eval",
                      "Scratch model_dirs.")
  flags.DEFINE_string("cache_dir", "/tmp/resnet_tpu_study_data",
                      "Where the Fashion-MNIST subset is written once.")
  flags.DEFINE_integer("num_train", 2560, "Training images.")
  flags.DEFINE_integer("num_test", 10000, "Test images, all evaluated.")
  flags.DEFINE_integer("batch", 256, "Global training batch.")
  flags.DEFINE_integer("eval_batch", 1000, "Global evaluation batch.")
  flags.DEFINE_integer("steps", 120, "Training steps per run.")
  flags.DEFINE_integer("eval_every", 40, "Steps between evaluations.")
  flags.DEFINE_integer("repetitions", 3, "Runs per variant, alternating.")
  flags.DEFINE_integer("timeout_s", 900, "A run's limit in seconds.")
  flags.DEFINE_bool("tiny", False, "Smoke-test sizes.")
  flags.DEFINE_string("variants", "long_lived", "long_lived (today's "
                      "trainer: make bench, eval.json) or long_lived,"
                      "per_evaluation (before and after issue 38's fix: "
                      "make bench-eval-stall, eval_stall.json).")
  flags.DEFINE_string("parts", "runs,saves", "runs: the training runs; "
                      "saves: the ResNet-50 save timing (alone: it reuses "
                      "the runs of the last eval.json).")
  flags.DEFINE_string("fashion_mnist_dir", "/usr/share/datasets/fashion-mnist",
                      "Fashion-MNIST's idx files (Debian's "
                      "dataset-fashion-mnist).")
  flags.DEFINE_string("child", "", "Internal: run one sample of a variant.")
  flags.DEFINE_string("child_data_dir", "", "Internal.")
  flags.DEFINE_string("child_model_dir", "", "Internal.")
  flags.DEFINE_string("child_result", "", "Internal.")
  flags.DEFINE_string("child_setup", "{}", "Internal.")
  app.run(main)
