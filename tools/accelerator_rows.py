"""The checks of tools/accelerator_check.py, one function per table row.

Each takes the run's strategy and `Sizes` and returns a `Check`: passed or
not, the measured numbers, and one line saying what they mean. The
equivalences are those the test suite proves on CPU replicas (Ying et al.
§3.1 grouped BN, §3 synchronous data parallelism), here on the replicas of
the machine at hand.
"""
import contextlib
import dataclasses
import math
import os

import numpy as np
import tensorflow as tf

from resnet_tpu.inputs import input_pipeline
from tools import xla_compile
from resnet_tpu.config import TrainConfig
from resnet_tpu.model.distributed_batch_norm import DistributedBatchNormalization
from resnet_tpu.train.loop_result import LoopResult
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine
from tools import bench_common

CHECK_CLASSES = 10
# Equivalence tolerances: far below what a wrong loss scale, a missing
# gradient sum or a wrong BN group gives (errors of order 1e-1 and more),
# far above float32 rounding on any device.
BN_TOLERANCE = 1e-4
UPDATE_TOLERANCE = 1e-2


@dataclasses.dataclass(frozen=True)
class Sizes:
  """depth, image_size, batch: the throughput and bfloat16 networks (batch
  per replica); check_*: the ResNet of the equivalence and XLA checks;
  small_equivalence_model: the equivalence on bench_common.small_convnet
  (conv, distributed BN, dense), whose trace takes a fraction of the time;
  run_xla: run the XLA-compiled step once, not only lower it to HLO."""
  depth: int
  image_size: int
  batch: int
  steps: int
  repetitions: int
  check_depth: int = 18
  check_image_size: int = 32
  check_batch: int = 4
  small_equivalence_model: bool = False
  run_xla: bool = True


@dataclasses.dataclass
class Check:
  """One row: `detail` is the line the table prints, `measured` the JSON;
  a skipped row compared nothing (it neither passes nor fails)."""
  name: str
  passed: bool
  detail: str
  measured: dict = dataclasses.field(default_factory=dict)
  skipped: bool = False

  @property
  def result(self) -> str:
    return "SKIP" if self.skipped else ("PASS" if self.passed else "FAIL")


def skipped_on_one_replica(name: str) -> Check:
  """The row of an equivalence that needs two replicas or more."""
  return Check(name, False, "skipped: one replica, nothing to compare",
               skipped=True)


@contextlib.contextmanager
def full_float32():
  """float32 matmuls and convs at full precision (no TensorFloat-32 on
  GPUs; XLA's HIGHEST precision on TPUs), so that the replicas compare with
  the host CPU's float32."""
  previous = tf.config.experimental.tensor_float_32_execution_enabled()
  tf.config.experimental.enable_tensor_float_32_execution(False)
  try:
    yield
  finally:
    tf.config.experimental.enable_tensor_float_32_execution(previous)


def config(model_dir: str, sizes: Sizes, **overrides) -> TrainConfig:
  """A synthetic one-step run of the check network (label smoothing, L2)."""
  return TrainConfig.tiny(model_dir, **{
      "use_synthetic_data": True, "resnet_depth": sizes.check_depth,
      "num_classes": CHECK_CLASSES, "image_size": sizes.check_image_size,
      "train_steps": 1, "steps_per_loop": 1, "num_train_images": 10_000,
      "base_learning_rate": 0.5, "label_smoothing": 0.1,
      "weight_decay": 1e-3, **overrides})


def _examples(n: int, image_size: int, seed: int = 0):
  rng = np.random.RandomState(seed)
  images = rng.uniform(0, 255, (n, image_size, image_size, 3))
  labels = rng.randint(0, CHECK_CLASSES, n)
  return images.astype(np.float32), labels.astype(np.int32)


def _train_one_step(trainer: TensorFlowEngine, images, labels) -> LoopResult:
  """One step on `images`; replica i reads the i-th slice of the batch."""
  def dataset_fn(ctx):
    batch = ctx.get_per_replica_batch_size(len(images))
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(
        batch, drop_remainder=True).repeat()
  iterator = iter(trainer.strategy.distribute_datasets_from_function(
      dataset_fn))
  return LoopResult.of(trainer.loops.train(iterator, tf.constant(1)))


def _per_replica(strategy, array: np.ndarray):
  """Replica r gets rows [r*b, (r+1)*b) of `array`."""
  rows = len(array) // strategy.num_replicas_in_sync
  return strategy.experimental_distribute_values_from_function(
      lambda ctx: tf.constant(array[ctx.replica_id_in_sync_group * rows:][
          :rows]))


@full_float32()
def group_bn(strategy, sizes: Sizes) -> Check:
  """Grouped BN on the replicas equals one-device BN of each group's batch
  (outputs and input gradients, Ying et al. §3.1)."""
  n = strategy.num_replicas_in_sync
  if n == 1:
    return skipped_on_one_replica("group_bn")
  group = 2 if n % 2 == 0 else n
  rng = np.random.RandomState(1)
  shape = (n * sizes.check_batch, 4, 4, 8)
  x = (3 + 2 * rng.standard_normal(shape)).astype(np.float32)
  upstream = rng.standard_normal(shape).astype(np.float32)
  gamma, beta = rng.uniform(0.5, 2, 8), rng.standard_normal(8)

  def layer(group_size):
    bn = DistributedBatchNormalization(group_size=group_size)
    bn.build(shape)
    bn.gamma.assign(gamma.astype(np.float32))
    bn.beta.assign(beta.astype(np.float32))
    return bn

  def forward_backward(bn, x, upstream):
    with tf.GradientTape() as tape:
      tape.watch(x)
      y = bn(x, training=True)
      loss = tf.reduce_sum(y * upstream)
    return y, tape.gradient(loss, x)

  with strategy.scope():
    grouped = layer(group)
  step = tf.function(lambda x, u: strategy.run(
      lambda *a: forward_backward(grouped, *a), args=(x, u)))
  y, dx = (np.concatenate([t.numpy() for t in
                           strategy.experimental_local_results(part)])
           for part in step(_per_replica(strategy, x),
                            _per_replica(strategy, upstream)))
  rows = group * sizes.check_batch
  with tf.device("/cpu:0"):
    reference = layer(1)
    ref = [forward_backward(reference, tf.constant(x[i:i + rows]),
                            tf.constant(upstream[i:i + rows]))
           for i in range(0, len(x), rows)]
  y_error = float(np.abs(y - np.concatenate([r[0] for r in ref])).max())
  dx_error = float(np.abs(dx - np.concatenate([r[1] for r in ref])).max())
  passed = max(y_error, dx_error) < BN_TOLERANCE
  return Check("group_bn", passed,
               f"group size {group} of {n}: max |y - y_ref| {y_error:.1e}, "
               f"max |dx - dx_ref| {dx_error:.1e} (tolerance "
               f"{BN_TOLERANCE:g})",
               {"group_size": group, "y_error": y_error,
                "dx_error": dx_error})


def host_strategy() -> tf.distribute.Strategy:
  """One replica on the host CPU: the reference of the equivalences."""
  return tf.distribute.MirroredStrategy(["/cpu:0"])


@full_float32()
def replicas_equal_one_device(strategy, sizes: Sizes, tmp: str) -> Check:
  """One training step on the N replicas (BN over all of them) equals one
  step of the same weights on one device with the global batch."""
  n = strategy.num_replicas_in_sync
  if n == 1:
    return skipped_on_one_replica("replicas_equal_one_device")
  images, labels = _examples(n * sizes.check_batch, sizes.check_image_size)
  cfg = config(os.path.join(tmp, "replicas"), sizes,
               global_batch_size=len(images), bn_group_size=n)
  model_fn = (bench_common.small_convnet if sizes.small_equivalence_model
              else None)
  many = TensorFlowEngine(cfg, strategy, model_fn)
  one = TensorFlowEngine(cfg.replace(bn_group_size=1,
                            model_dir=os.path.join(tmp, "one")),
                         host_strategy(), model_fn)
  for source, target in zip(one.model.variables, many.model.variables):
    target.assign(source.numpy())
  before = [v.numpy() for v in one.model.variables]
  many_loss = _train_one_step(many, images, labels).loss
  one_loss = _train_one_step(one, images, labels).loss
  errors = []
  for b, m, o in zip(before, many.model.variables, one.model.variables):
    update = np.abs(o.numpy() - b).max()
    if update > 0:
      errors.append(np.abs((m.numpy() - b) - (o.numpy() - b)).max() / update)
  error = float(max(errors, default=math.inf))
  passed = error < UPDATE_TOLERANCE and len(errors) >= 4
  network = ("small conv net" if model_fn else
             f"ResNet-{sizes.check_depth}")
  return Check("replicas_equal_one_device", passed,
               f"{network}, {n} replicas vs one device, global batch "
               f"{len(images)}: "
               f"update error {error:.1e} of the largest update (tolerance "
               f"{UPDATE_TOLERANCE:g}); loss {many_loss:.4f} vs "
               f"{one_loss:.4f}",
               {"update_error": error, "loss": many_loss,
                "one_device_loss": one_loss,
                "variables_changed": len(errors)})


def _synthetic_iterator(trainer: TensorFlowEngine):
  cfg = trainer.cfg
  return iter(trainer.strategy.distribute_datasets_from_function(
      input_pipeline.synthetic_dataset_fn(
          cfg.model.image_size, cfg.model.num_classes,
          cfg.run.global_batch_size, cfg.transfer_dtype)))


def bfloat16_step(strategy, sizes: Sizes, tmp: str) -> Check:
  """One bfloat16 step of the throughput network: loss and gradients
  finite."""
  n = strategy.num_replicas_in_sync
  cfg = config(os.path.join(tmp, "bfloat16"), sizes, precision="bfloat16",
               resnet_depth=sizes.depth, image_size=sizes.image_size,
               num_classes=1000, global_batch_size=n * sizes.batch,
               base_learning_rate=0.1)
  trainer = TensorFlowEngine(cfg, strategy)
  result = LoopResult.of(trainer.loops.train(_synthetic_iterator(trainer),
                                             tf.constant(1)))
  passed = result.nonfinite_steps == 0 and math.isfinite(result.loss)
  return Check("bfloat16_step", passed,
               f"ResNet-{sizes.depth} at {sizes.image_size} px, batch "
               f"{n * sizes.batch}: loss {result.loss:.4f}, "
               f"{result.nonfinite_steps} non-finite step(s)",
               {"loss": result.loss,
                "nonfinite_steps": result.nonfinite_steps})


def xla_step(one_device: tf.distribute.Strategy, sizes: Sizes, tmp: str,
             precision: str) -> Check:
  """The training step compiled by XLA for the run's first device, named
  explicitly: passes when the HLO holds the network's convolutions and,
  when run, the step's loss and gradients are finite."""
  cfg = config(os.path.join(tmp, "xla"), sizes, precision=precision,
               global_batch_size=sizes.check_batch)
  trainer = TensorFlowEngine(cfg, one_device)
  images, labels = _examples(sizes.check_batch, sizes.check_image_size)
  compiled = xla_compile.compile_replica_step(
      one_device, trainer.replica_step.train,
      (tf.constant(images), tf.constant(labels)), run=sizes.run_xla)
  run = sizes.run_xla
  convolutions = compiled.op_count("convolution")
  nonfinite = float(compiled.outputs.nonfinite) if run else 0.0
  passed = convolutions > 0 and nonfinite == 0
  ran = (f", compiled and ran once in {compiled.run_seconds:.1f} s "
         f"({'finite' if not nonfinite else 'NON-FINITE'})" if run
         else "; lowered only, not run (--tiny)")
  return Check("xla_compile", passed,
               f"ResNet-{sizes.check_depth} {precision} step compiled for "
               f"{compiled.target}: lowered to HLO in "
               f"{compiled.lower_seconds:.1f} s, {convolutions} "
               f"convolutions{ran}",
               {"lower_seconds": compiled.lower_seconds,
                "run_seconds": compiled.run_seconds, "ran": run,
                "compiled_for": compiled.target, "nonfinite": nonfinite,
                "convolutions": convolutions})


def _images_per_second(trainer: TensorFlowEngine, steps: int):
  """A callable timing one host loop of `steps` steps; traced, compiled and
  warmed up once here."""
  iterator, n = _synthetic_iterator(trainer), tf.constant(steps)
  loop = lambda: LoopResult.of(trainer.loops.train(iterator, n))
  loop()
  images = steps * trainer.cfg.run.global_batch_size
  return lambda: images / bench_common.seconds_per_call(loop, 1)


def throughput(strategy, sizes: Sizes, tmp: str, precision: str,
               chips: int | None, min_ratio: float) -> Check:
  """Synthetic training images/s, ours vs keras.applications.ResNet50 on
  the same replicas, loop and optimizer, alternating A B A B; fails below
  `min_ratio` of Keras's images/s."""
  n = strategy.num_replicas_in_sync
  batch = n * sizes.batch
  timers = {}
  for name, model_fn in (("ours", None),
                         ("keras", bench_common.keras_resnet50)):
    cfg = config(os.path.join(tmp, name), sizes, precision=precision,
                 resnet_depth=sizes.depth, image_size=sizes.image_size,
                 num_classes=1000, global_batch_size=batch,
                 base_learning_rate=0.1)
    timers[name] = _images_per_second(TensorFlowEngine(cfg, strategy, model_fn),
                                      sizes.steps)
  summary = bench_common.summarise(
      bench_common.alternate(timers, sizes.repetitions))
  per_replica = {k: v["median"] / n for k, v in summary.items()}
  per_chip = ({k: v["median"] / chips for k, v in summary.items()}
              if chips else None)
  ratio = summary["ours"]["median"] / summary["keras"]["median"]
  unit, shown = ("chip", per_chip) if per_chip else ("replica", per_replica)
  return Check("throughput", ratio >= min_ratio,
               f"ResNet-{sizes.depth} vs Keras ResNet50, {sizes.image_size} "
               f"px, {precision}, batch {sizes.batch}/replica, "
               f"{sizes.steps} steps x {sizes.repetitions}: "
               f"{shown['ours']:.1f} vs {shown['keras']:.1f} images/s per "
               f"{unit}, ours/Keras {ratio:.2f}x (at least {min_ratio:g}x "
               "to pass)",
               {"images_per_sec_per_replica": per_replica,
                "min_ratio": min_ratio,
                "images_per_sec_per_chip": per_chip, "chips": chips,
                "ours_vs_keras": ratio, "summary": summary})
