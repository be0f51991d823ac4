"""Shared benchmark plumbing: alternating repetitions, medians, summary.json.

Every benchmark runs its variants A B A B ... so machine noise hits all of
them alike, reports the median and the min-max spread, and merges its
headline ratios into bench_results/summary.json.
"""
import json
import os
import platform
import statistics
import time
from typing import Callable

import keras
import tensorflow as tf

from resnet_tpu.runtime import cpu_kernels
from resnet_tpu.runtime import process_setup
from resnet_tpu.config import TrainConfig
from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization
from resnet_tpu.model.resnet import dtype_policy
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine


def alternate(variants: dict[str, Callable[[], float]], repetitions: int,
              fewer: dict[str, int] | None = None) -> dict[str, list[float]]:
  """Calls each variant once per repetition, in turn; collects the results.

  `fewer` gives some (slow) variants fewer repetitions: they take part in
  the first ones only, still alternating with the others.
  """
  fewer = fewer or {}
  results = {name: [] for name in variants}
  for repetition in range(repetitions):
    for name, measure in variants.items():
      if repetition < fewer.get(name, repetitions):
        results[name].append(measure())
  return results


def summarise(runs: dict[str, list[float]]) -> dict[str, dict]:
  """Median, min, max and the raw runs of each variant."""
  return {name: {"median": statistics.median(values), "min": min(values),
                 "max": max(values), "runs": values}
          for name, values in runs.items()}


def paired_range(numerators: list[float],
                 denominators: list[float]) -> list[float]:
  """[min, max] of a ratio over the repetitions of `alternate`.

  Each ratio is taken between the two variants' samples of one repetition,
  which ran back to back: how far one repetition strays on this machine. A
  variant with fewer repetitions pairs with the first ones.
  """
  pairs = [a / b for a, b in zip(numerators, denominators)]
  return [min(pairs), max(pairs)]


def keras_resnet50(cfg: TrainConfig) -> keras.Model:
  """The reference: keras.applications.ResNet50 (weights=None) returning
  logits."""
  with dtype_policy(cfg.model.precision):
    return keras.applications.ResNet50(
        weights=None,
        input_shape=(cfg.model.image_size, cfg.model.image_size, 3),
        classes=cfg.model.num_classes, classifier_activation=None)


def small_convnet(cfg: TrainConfig) -> keras.Model:
  """conv -> distributed BN -> pool -> dense, for
  TensorFlowEngine(model_fn=...).

  A step of milliseconds: the host-loop benchmark sees the per-call
  dispatch, and --tiny smoke tests take seconds.
  """
  inputs = keras.Input((cfg.model.image_size, cfg.model.image_size, 3))
  x = keras.layers.Conv2D(8, 3, strides=2, use_bias=False)(inputs)
  x = DistributedBatchNormalization(group_size=cfg.model.bn_group_size)(x)
  x = keras.layers.GlobalAveragePooling2D()(keras.layers.ReLU()(x))
  return keras.Model(inputs, keras.layers.Dense(cfg.model.num_classes)(x))


def train_steps(trainer: TensorFlowEngine, iterator,
                num_steps: tf.Tensor) -> None:
  """Runs `num_steps` training steps in one host-loop call; returns when
  they are done."""
  float(trainer.loops.train(iterator, num_steps).nonfinite_steps)


def seconds_per_call(fn: Callable[[], object], calls: int) -> float:
  """Wall seconds per call of `fn` (which must block until done)."""
  start = time.perf_counter()
  for _ in range(calls):
    fn()
  return (time.perf_counter() - start) / calls


# CPU features that decide the speed of float32/bfloat16 kernels on x86.
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")


def machine() -> dict:
  """Cores, CPU model, vector/bf16 features and TF version, for the report."""
  model = platform.processor() or platform.machine()
  flags = cpu_kernels.cpu_flags()
  try:
    with open("/proc/cpuinfo") as f:
      model = next(line.split(":", 1)[1].strip() for line in f
                   if line.startswith("model name"))
  except (OSError, StopIteration):
    pass
  return {"cores": os.cpu_count(), "cpu": model,
          "cpu_features": {name: name in flags for name in CPU_FEATURES},
          "tensorflow": tf.__version__,
          "onednn_kernels": cpu_kernels.onednn_enabled(),
          "date": time.strftime("%Y-%m-%d")}


def write_json(output_dir: str, name: str, payload: dict) -> str:
  os.makedirs(output_dir, exist_ok=True)
  path = os.path.join(output_dir, name)
  with open(path, "w") as f:
    json.dump(payload, f, indent=2, sort_keys=True)
  return path


def merge_summary(output_dir: str, ratios: dict[str, float]) -> None:
  """Adds `ratios` to summary.json, keeping the other benchmarks' keys."""
  path = os.path.join(output_dir, "summary.json")
  merged = {}
  if os.path.exists(path):
    with open(path) as f:
      merged = json.load(f)
  merged.update(ratios)
  os.makedirs(output_dir, exist_ok=True)
  with open(path + ".tmp", "w") as f:
    json.dump(merged, f, indent=2, sort_keys=True)
  os.replace(path + ".tmp", path)


_KEPT_UNTIL_EXIT: list = []


def keep_until_exit(obj: object) -> None:
  """Holds `obj` (e.g. timers closing over trainers) until the process ends,
  so that no traced trainer is freed mid-run (see exit_without_teardown)."""
  _KEPT_UNTIL_EXIT.append(obj)


def exit_without_teardown() -> None:
  """Ends a benchmark process once its results are written and printed,
  skipping the teardown that frees the input iterators of its traced
  trainers (process_setup.exit_skipping_teardown); benchmarks with several
  parts keep their trainers (keep_until_exit)."""
  process_setup.exit_skipping_teardown(0)
