"""Does fine-tuning learn? --init_checkpoint on real photos, on 2 CPU cores.

  python -m lab.study_fine_tune [--output_dir=bench_results] [--seeds=0,1]

Fashion-MNIST (Debian's dataset-fashion-mnist, lab/study_data.py) split in
two tasks: classes 0-4 (T-shirt, trouser, pullover, dress, coat) and 5-9
(sandal, shirt, sneaker, bag, ankle boot). Per seed, the study's narrow
ResNet-10 trains on the first task from scratch (the source run); then the
second task trains at the same steps and settings twice: from scratch, and
from the source run's checkpoint (--init_checkpoint: backbone and BN
statistics kept, a fresh 5-class classifier). Both evaluate every test
image of the second task.

Declared before the runs (lab/study_verdict.py): fine-tuning beats
training from scratch on the second task's test top-1 by more than twice
the pooled seed spread (held), trails it by that much (not held), else not
decided. Writes fine_tune.json and fine_tune.md to --output_dir.
"""
import datetime
import json
import os
import shutil
import time

from absl import app
from absl import flags
from absl import logging
import tensorflow as tf

from lab import study_data
from lab import study_model
from lab import study_verdict
from resnet_tpu.config import TrainConfig
from resnet_tpu.parallel.tensorflow.strategy import configure_cpu_replicas
from resnet_tpu.run import run
from resnet_tpu.runtime import compat
from resnet_tpu.train.metrics_log import read_metrics

FLAGS = flags.FLAGS
TASKS = {"source": study_data.FASHION_MNIST_CLASSES[:5],
         "target": study_data.FASHION_MNIST_CLASSES[5:]}
CRITERION = study_verdict.Criterion(
    "fine-tuning beats training from scratch on the new classes",
    (("start", "scratch"),), (("start", "fine-tuned"),))


def task_data(cache_dir: str, num_train: int, num_test: int,
              source_dir: str) -> dict[str, study_data.StudyData]:
  """TFRecords of each task's classes, from the first num_train/num_test
  Fashion-MNIST photos."""
  images = study_data.fashion_mnist_folders(cache_dir, num_train, num_test,
                                            source_dir)
  data = {}
  for task, classes in TASKS.items():
    folder = os.path.join(cache_dir, f"task_{task}_{num_train}_{num_test}")
    if not os.path.exists(os.path.join(folder, ".complete")):
      shutil.rmtree(folder, ignore_errors=True)
      for split in ("train", "validation"):
        for name in classes:
          shutil.copytree(os.path.join(images, split, name),
                          os.path.join(folder, split, name))
      open(os.path.join(folder, ".complete"), "w").close()
    data[task] = study_data.tfrecords(
        folder, folder + "_tfrecords", f"Fashion-MNIST {task} classes")
  return data


def config(data: study_data.StudyData, model_dir: str, seed: int,
           steps: int, batch: int, init_checkpoint: str = "") -> TrainConfig:
  """The study's settings (lab/study_runner.py's base) for one task."""
  return TrainConfig.from_flat(
      model_dir=model_dir, data_dir=data.data_dir, strategy="cpu",
      num_cpu_replicas=1, resnet_depth=18, num_classes=data.num_classes,
      image_size=32, global_batch_size=batch,
      eval_batch_size=min(500, data.num_test),
      num_eval_images=data.num_test, num_train_images=data.num_train,
      train_steps=steps, steps_per_loop=50, keep_checkpoints=1,
      shuffle_buffer_size=data.num_train, train_crop_min_area=0.35,
      label_smoothing=0.1, base_learning_rate=0.2, lr_schedule="cosine",
      warmup_epochs=0.05 * steps * batch / data.num_train,  # 5 % of it
      seed=seed, init_checkpoint=init_checkpoint)


def train(cfg: TrainConfig) -> dict:
  compat.shift_collective_keys(tf.distribute.MirroredStrategy, 100000)
  shutil.rmtree(cfg.model_dir, ignore_errors=True)
  start = time.time()
  result = run(cfg, model_fn=study_model.narrow_resnet)
  evals = [r for r in read_metrics(cfg.model_dir) if r["split"] == "eval"]
  return {"top1": result["top1"], "test_examples": result["examples"],
          "seconds": time.time() - start, "steps": evals[-1]["step"]}


def main(argv: list[str]) -> None:
  del argv
  seeds = [int(s) for s in FLAGS.seeds.split(",")]
  configure_cpu_replicas(1)  # before the data's reads start TensorFlow
  data = task_data(FLAGS.cache_dir, FLAGS.num_train, FLAGS.num_test,
                   FLAGS.fashion_mnist_dir)
  records = []
  started = time.time()
  for seed in seeds:
    source_dir = os.path.join(FLAGS.work_dir, f"source_{seed}")
    source = train(config(data["source"], source_dir, seed, FLAGS.steps,
                          FLAGS.batch))
    logging.info("seed %d source task: top-1 %.4f", seed, source["top1"])
    for start, init in (("scratch", ""), ("fine-tuned", source_dir)):
      record = train(config(data["target"],
                            os.path.join(FLAGS.work_dir, f"{start}_{seed}"),
                            seed, FLAGS.steps, FLAGS.batch, init))
      record.update(point=(("start", start),), seed=seed,
                    source_top1=source["top1"])
      logging.info("seed %d %s: top-1 %.4f", seed, start, record["top1"])
      records.append(record)

  def top1(start):
    return [r["top1"] for r in sorted(records, key=lambda r: r["seed"])
            if r["point"] == (("start", start),)]

  decided = [study_verdict.verdict(CRITERION, top1("scratch"),
                                   top1("fine-tuned"))]
  payload = {
      "claim": CRITERION.describe(), "verdicts": decided,
      "records": records, "seeds": seeds, "steps": FLAGS.steps,
      "batch": FLAGS.batch, "num_train": FLAGS.num_train,
      "num_test": FLAGS.num_test, "minutes": (time.time() - started) / 60,
      "date": datetime.date.today().isoformat(),
      "command": "python -m lab.study_fine_tune " + " ".join(
          f"--{k}={getattr(FLAGS, k)}" for k in ("seeds", "steps", "batch",
                                                 "num_train", "num_test"))}
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  with open(os.path.join(FLAGS.output_dir, "fine_tune.json"), "w") as f:
    json.dump(payload, f, indent=1)
  lines = ["### Fine-tuning on Fashion-MNIST's other 5 classes", "",
           f"{payload['command']} ({payload['date']}, "
           f"{payload['minutes']:.0f} min on 2 CPU cores). Each task: "
           f"{FLAGS.num_train} training and {FLAGS.num_test} test photos "
           f"of 10 classes filtered to its 5; {FLAGS.steps} steps of batch "
           f"{FLAGS.batch}, momentum x2, cosine, on both starts.", "",
           "| start | test top-1 % per seed | source task top-1 % |",
           "|---|---|---|"]
  for start in ("scratch", "fine-tuned"):
    mine = [r for r in records if r["point"] == (("start", start),)]
    lines.append(f"| {start} | " + ", ".join(
        f"{100 * r['top1']:.1f}" for r in mine) + " | " + ", ".join(
        f"{100 * r['source_top1']:.1f}" for r in mine) + " |")
  for v in decided:
    lines += ["", f"Criterion (declared): {CRITERION.describe()} Verdict: "
              f"**{v['verdict']}** (gap {v['gap_points']:+.1f} points, "
              f"pooled seed spread {v['pooled_spread_points']:.1f})."]
  with open(os.path.join(FLAGS.output_dir, "fine_tune.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  flags.DEFINE_string("output_dir", "bench_results", "Where results go.")
  flags.DEFINE_string("work_dir", "/tmp/resnet_tpu_fine_tune",
                      "Scratch model_dirs.")
  flags.DEFINE_string("cache_dir", "/tmp/resnet_tpu_study_data",
                      "Where the Fashion-MNIST subsets are written once.")
  flags.DEFINE_string("fashion_mnist_dir", study_data.FASHION_MNIST_DIR,
                      "Fashion-MNIST's idx files.")
  flags.DEFINE_string("seeds", "0,1", "Paired seeds.")
  flags.DEFINE_integer("steps", 400, "Training steps of every run.")
  flags.DEFINE_integer("batch", 64, "Global batch.")
  flags.DEFINE_integer("num_train", 5120, "Photos of all 10 classes read "
                       "for training (each task keeps its 5 classes').")
  flags.DEFINE_integer("num_test", 4000, "Test photos read likewise.")
  app.run(main)
