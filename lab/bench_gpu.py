"""ResNet-50 training steps on one GPU, side by side (issue 48): the project's
network and JAX step against stock Keras and torchvision; then main.py's
own training loop around that step (issue 60).

In one run, each workload in a process of its own (so that each has the
device's memory, and its peak, to itself), in this order (the least
comparable last, where a spent budget would cut it):
  ours          the project's ResNet-50 v1.5 and JAX step
                (engines/jax/step.py; one device, BN over the whole batch);
  loop          main.py --backend=jax --use_synthetic_data, same network,
                batch and loss, on JAX's default devices (the lent H200's
                one GPU): --loop_host_loops host loops of
                --loop_steps_per_loop steps, then one checkpoint
                (lab/bench_gpu_loop.py); second, where the budget leaves it
                the most time;
  ours_bn32     the project's loss over --batch_size / --bn_images virtual
                replicas (jax.vmap over the mesh's axes), so that BN
                normalises over --bn_images images, as on that many GPUs;
                differentiated outside the vmap, so that its convolutions
                are the ordinary ones of a real step (issue 60);
  stock_layers  the same v1.5 network built from stock keras.layers
                (Conv2D, BatchNormalization) and a plain jitted step;
  torch_eager, torch_compile
                torchvision's resnet50 (v1.5; resnet18 etc. at other
                --depth), channels-last, bf16 autocast,
                cudnn.benchmark on, the model torch.compile'd in the second
                (--torch_device=cpu rehearses them);
  keras_app     keras.applications.ResNet50 (v1) and the same plain step.
The Keras steps share the loss (label smoothing 0.1, L2 1e-4 on kernels)
and momentum SGD; torch's is the same, weight decay in the optimizer. Input
is synthetic and already on the device (`loop`'s: main.py's synthetic host
batch, handed to the device each step as real input is). bf16 compute,
float32 weights.

Reported per workload: images/s and step ms (median over --repeats windows
of --steps steps, with min and max), compile seconds, the model's FLOPs per
step (lab/model_flops.py: 3 x the forward pass's conv and dense FLOPs; torch
takes stock_layers', the same v1.5 network), MFU from them against
--peak_tflops (989.4: NVIDIA's H100/H200 SXM dense bf16 figure), XLA's own
FLOP count of the compiled step (for reference only: on a GPU it leaves out
the cuDNN and cuBLAS calls, jax-ml/jax#16008), and peak device memory
(JAX's includes what compiling took; XLA's memory analysis of the step
beside it). BN groups on one GPU show only their arithmetic: with one
device there is no all-reduce to pay.
For `loop`: the host loops' images/s after the first (median, min, max)
and against `ours` (ratios.loop_vs_ours: what the input hand-off and the
loop cost), the first loop's seconds (start-up compiles), the compiles
JAX_LOG_COMPILES logs through the first host loop and after it (0 in a
steady run; their names if not), and the checkpoint's name (.npz where
TensorFlow is absent) and seconds; main.py's log in gpu_bench_loop.log.
The workers' stderr, each workload's last lines, in gpu_bench_workers.log.
gpu_bench.json is rewritten after every workload ("finished": false until
the last), so a call cut short still brings back what ran.

On the lent H200 (no TensorFlow or Keras there, no network): here, `make
bench-gpu-wheels` (Keras, namex and optree as Python 3.12 wheels, into
.whl/); there, with .whl/ carried, `make bench-gpu BENCH_OUT=$OUT`, which
installs them into .bench-site/ first (without make: `BENCH_OUT=$OUT sh
lab/bench_gpu.sh`, the script the target runs). Elsewhere: `make bench-gpu
BENCH_PYTHON=P BENCH_OUT=DIR` (P: a Python with JAX, and Keras or those
wheels), or `python -m lab.bench_gpu --output_dir=DIR` with
KERAS_BACKEND=jax.
The whole run takes at most --budget_s (410 s; the lent call's 420 s less
the wheels' install). The workloads run in order of importance, each with
what is left of the budget, at most WORKLOAD_TIMEOUT_S (so that one hang
costs less than half of it); one left less than MIN_SLOT_S is skipped and
named. No time is held back for later workloads: a ResNet-50 compile does
not fit a small slot, so a slot too small for it is only time lost.
Versions are read from the installed distributions (no import: the parent
holds no device) and the device from the workers.
"""
import contextlib
import importlib.metadata
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Callable, TextIO

from absl import app
from absl import flags

from lab import bench_gpu_loop
from lab import model_flops

FLAGS = flags.FLAGS
flags.DEFINE_string("output_dir", "bench_results", "Where gpu_bench.json goes.")
flags.DEFINE_list("workloads", ["ours", "loop", "ours_bn32", "stock_layers",
                                "torch_eager", "torch_compile", "keras_app"],
                  "Workloads to run, in this order.")
flags.DEFINE_string("worker", "", "Internal: run one workload, print JSON.")
flags.DEFINE_integer("depth", 50, "ResNet depth of the v1.5 workloads.")
flags.DEFINE_integer("batch_size", 256, "Images per step.")
flags.DEFINE_integer("image_size", 224, "Image side in pixels.")
flags.DEFINE_integer("num_classes", 1000, "Classes.")
flags.DEFINE_integer("bn_images", 32, "Images per BN replica in ours_bn32.")
flags.DEFINE_integer("warmup_steps", 5, "Untimed steps after compiling.")
flags.DEFINE_integer("steps", 20, "Steps per timed window.")
flags.DEFINE_integer("repeats", 5, "Timed windows per workload.")
flags.DEFINE_float("peak_tflops", 989.4,
                   "Dense bf16 peak of the device, TFLOP/s (MFU's divisor).")
flags.DEFINE_integer("loop_steps_per_loop", 20,
                     "The loop workload's --steps_per_loop.")
flags.DEFINE_integer("loop_host_loops", 6,
                     "The loop workload's host loops (the first compiles).")
flags.DEFINE_float("budget_s", 410.0, "Wall-clock budget of the whole run.")
flags.DEFINE_enum("torch_device", "cuda", ["cuda", "cpu"],
                  "Where the torch workloads run: cpu only to rehearse them "
                  "(a GPU run stops at once where torch sees no GPU).")

# The most one workload may take: a hang costs less than half the budget.
WORKLOAD_TIMEOUT_S = 180
# Less than this left, a workload is skipped: a guess (no GPU has run this
# yet) at the least in which a ResNet-50 compiles and takes its 105 steps.
MIN_SLOT_S = 45
# Each workload's last stderr lines kept in gpu_bench_workers.log.
LOG_LINES = 200
LABEL_SMOOTHING = 0.1
WEIGHT_DECAY = 1e-4
LEARNING_RATE = 0.1
MOMENTUM = 0.9


def _versions(results: dict) -> dict:
  """Python's and the distributions' versions, without importing them
  (Keras would need its backend, JAX would take the device); the device
  that the first worker to run saw."""
  out = {"python": platform.python_version()}
  for name in ("jax", "jaxlib", "keras", "torch", "torchvision"):
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  out["device"] = next((r["device"] for r in results.values()
                        if "device" in r), None)
  return out


# ----------------------------------------------------------------- Keras/JAX


@contextlib.contextmanager
def stock_keras_layers():
  """The project's builder with stock keras.layers.Conv2D and
  BatchNormalization in place of its own: the same v1.5 network."""
  import keras  # pylint: disable=g-import-not-at-top
  from resnet_tpu.model import resnet  # pylint: disable=g-import-not-at-top

  def conv(*args, float32_kernels=False, **kwargs):
    del float32_kernels
    return keras.layers.Conv2D(*args, **kwargs)

  def bn(x, group_size, name, zero_gamma=False, frozen=False, momentum=0.9,
         epsilon=1e-5, **unused):
    del group_size, frozen, unused
    return keras.layers.BatchNormalization(
        momentum=momentum, epsilon=epsilon, name=name,
        gamma_initializer="zeros" if zero_gamma else "ones")(x)

  saved = resnet.Conv2D, resnet._bn
  resnet.Conv2D, resnet._bn = conv, bn
  try:
    yield
  finally:
    resnet.Conv2D, resnet._bn = saved


def keras_model(workload: str, depth: int, image_size: int,
                num_classes: int):
  """The Keras network of `workload`, in bfloat16: the project's v1.5, the
  same from stock layers (stock_layers) or keras.applications' ResNet50
  (keras_app, v1, whatever `depth`)."""
  import keras  # pylint: disable=g-import-not-at-top
  from resnet_tpu.config import ModelConfig  # pylint: disable=g-import-not-at-top
  from resnet_tpu.model import resnet  # pylint: disable=g-import-not-at-top
  cfg = ModelConfig(resnet_depth=depth, image_size=image_size,
                    num_classes=num_classes, precision="bfloat16",
                    bfloat16_conv_kernels="native")
  if workload == "keras_app":
    with resnet.dtype_policy("bfloat16"):
      return keras.applications.ResNet50(
          weights=None, input_shape=(image_size,) * 2 + (3,),
          classes=num_classes, classifier_activation=None)
  if workload == "stock_layers":
    with stock_keras_layers():
      return resnet.build_model(cfg)
  return resnet.build_model(cfg)


def _loss_config():
  from resnet_tpu.engines.jax.state import LossConfig  # pylint: disable=g-import-not-at-top
  return LossConfig(FLAGS.num_classes, FLAGS.batch_size, LABEL_SMOOTHING,
                    WEIGHT_DECAY)


def plain_step(model, optimizer):
  """A jitted stateless step with JaxTrainStep's loss, on one device: the
  way a Keras-on-JAX user would write it."""
  import jax  # pylint: disable=g-import-not-at-top
  from keras import ops  # pylint: disable=g-import-not-at-top
  from resnet_tpu.engines.jax.state import decayed_indices  # pylint: disable=g-import-not-at-top
  from resnet_tpu.train.loss import losses_and_hits  # pylint: disable=g-import-not-at-top
  decayed = decayed_indices(model)
  optimizer.build(model.trainable_variables)

  def loss_fn(trainable, non_trainable, images, labels):
    logits, non_trainable = model.stateless_call(trainable, non_trainable,
                                                 images, training=True)
    per_example, _, _, _ = losses_and_hits(logits, labels, FLAGS.num_classes,
                                           LABEL_SMOOTHING)
    l2 = sum(ops.sum(ops.square(trainable[i])) / 2 for i in decayed)
    return (ops.sum(per_example) / FLAGS.batch_size + WEIGHT_DECAY * l2,
            non_trainable)

  def step(state, images, labels):
    trainable, non_trainable, opt = state
    grads, non_trainable = jax.grad(loss_fn, has_aux=True)(
        trainable, non_trainable, images, labels)
    trainable, opt = optimizer.stateless_apply(opt, grads, trainable)
    return (trainable, non_trainable, opt), ops.sum(grads[-1])

  state = ([v.value for v in model.trainable_variables],
           [v.value for v in model.non_trainable_variables],
           [v.value for v in optimizer.variables])
  return jax.jit(step, donate_argnums=0), state


def virtual_replicas_step(train_step, replicas: int, group_size: int = 1):
  """The project's step over `replicas` virtual replicas on one device, in
  BN groups of `group_size`: jax.vmap binds the mesh's two axis names, so
  the BN group sums (psums) run over the vmapped replicas
  (tests_jax/test_bench_gpu.py checks it against the step on as many
  devices).

  The replicas' losses (JaxTrainStep._replica_loss) are summed and
  differentiated once, outside the vmap: the kernel gradients are then
  ordinary convolutions over the whole batch, as each GPU of a real step
  runs them. A gradient taken per replica inside the vmap would make them
  feature-grouped convolutions, slow on cuDNN (jax-ml/jax#13800; issue 60).
  Without loss scaling (float16) only."""
  import jax  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from resnet_tpu.parallel.jax.bn_all_reduce import GROUPS_AXIS
  # pylint: disable-next=g-import-not-at-top
  from resnet_tpu.parallel.jax.bn_all_reduce import IN_GROUP_AXIS
  from resnet_tpu.engines.jax.state import TrainState  # pylint: disable=g-import-not-at-top
  if train_step.loss_scale:
    raise ValueError("virtual replicas take no loss scale (float16)")

  def loss(trainable, non_trainable, images, labels):
    per_replica = jax.vmap(
        lambda x, y: train_step._replica_loss(trainable, non_trainable, x, y),
        axis_name=IN_GROUP_AXIS)
    losses, aux = jax.vmap(per_replica, axis_name=GROUPS_AXIS)(images,
                                                                labels)
    return losses.sum(), aux

  def step(state, images, labels):
    shape = (replicas // group_size, group_size, -1)
    grads, (non_trainable, sums) = jax.grad(loss, has_aux=True)(
        state.trainable, state.non_trainable,
        images.reshape(shape + images.shape[1:]), labels.reshape(shape))
    # The moving statistics averaged over the replicas, as the step's
    # all-reduce averages them; the rest, the same on every replica, as
    # the first has them.
    non_trainable = [
        v.mean((0, 1)) if i in train_step.replica_local else v[0, 0]
        for i, v in enumerate(non_trainable)]
    trainable, opt = train_step.optimizer.stateless_apply(
        state.optimizer, grads, state.trainable)
    return (TrainState(list(trainable), non_trainable, list(opt)),
            sums.sum((0, 1)))

  return jax.jit(step, donate_argnums=0)


def _xla_flops(compiled) -> float | None:
  """XLA's FLOP count of a compiled program: on a GPU without the library
  calls (cuDNN, cuBLAS), so only a reference beside the model's."""
  analysis = compiled.cost_analysis()
  if isinstance(analysis, (list, tuple)):
    analysis = analysis[0] if analysis else None
  return float(analysis["flops"]) if analysis and "flops" in analysis else None


def _xla_memory(compiled) -> int | None:
  """The step's bytes by XLA's memory analysis: arguments, outputs and
  scratch, less what the outputs reuse of the (donated) arguments."""
  try:
    m = compiled.memory_analysis()
  except NotImplementedError:
    return None
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes +
             m.temp_size_in_bytes - m.alias_size_in_bytes)


def _peak_memory() -> int | None:
  import jax  # pylint: disable=g-import-not-at-top
  stats = jax.devices()[0].memory_stats()
  return int(stats["peak_bytes_in_use"]) if stats else None


def run_keras(workload: str) -> dict:
  """Compile and time one Keras workload on JAX's first device."""
  os.environ["KERAS_BACKEND"] = "jax"
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from resnet_tpu.optim.optimizers import build_optimizer  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from resnet_tpu.parallel.jax.bn_all_reduce import build_mesh
  from resnet_tpu.engines.jax.step import JaxTrainStep  # pylint: disable=g-import-not-at-top
  model = keras_model(workload, FLAGS.depth, FLAGS.image_size,
                      FLAGS.num_classes)
  optimizer = build_optimizer("momentum", LEARNING_RATE, momentum=MOMENTUM)
  device = jax.devices()[0]
  rng = np.random.RandomState(0)
  images = jax.device_put(rng.uniform(
      0, 255, (FLAGS.batch_size, FLAGS.image_size, FLAGS.image_size, 3)
  ).astype(np.float32), device)
  labels = jax.device_put(
      rng.randint(0, FLAGS.num_classes, FLAGS.batch_size).astype(np.int32),
      device)
  if workload in ("ours", "ours_bn32"):
    train_step = JaxTrainStep(model, optimizer, build_mesh(1, [device]),
                              _loss_config())
    state = train_step.state()
    step = train_step.step
    if workload == "ours_bn32":
      if FLAGS.batch_size % FLAGS.bn_images:
        raise ValueError(f"--bn_images={FLAGS.bn_images} must divide "
                         f"--batch_size={FLAGS.batch_size}")
      step = virtual_replicas_step(train_step,
                                   FLAGS.batch_size // FLAGS.bn_images)
  else:
    step, state = plain_step(model, optimizer)
    state = jax.device_put(state, device)
  start = time.perf_counter()
  compiled = step.lower(state, images, labels).compile()
  compile_s = time.perf_counter() - start
  for _ in range(FLAGS.warmup_steps):
    state, out = compiled(state, images, labels)
  jax.block_until_ready((state, out))
  windows = []
  for _ in range(FLAGS.repeats):
    start = time.perf_counter()
    for _ in range(FLAGS.steps):
      state, out = compiled(state, images, labels)
    jax.block_until_ready((state, out))
    windows.append(time.perf_counter() - start)
  return {"compile_s": compile_s,
          "model_flops_per_step": model_flops.training_flops(
              model, FLAGS.batch_size),
          "xla_flops_per_step": _xla_flops(compiled),
          "window_s": windows, "peak_memory_bytes": _peak_memory(),
          "xla_memory_bytes": _xla_memory(compiled),
          "device": device.device_kind, "platform": device.platform}


# --------------------------------------------------------------------- torch


def run_torch(workload: str) -> dict:
  """torchvision's ResNet of --depth (resnet50 by default), eager or
  torch.compile'd, bf16 autocast, on --torch_device."""
  import torch  # pylint: disable=g-import-not-at-top
  import torchvision  # pylint: disable=g-import-not-at-top
  on_gpu = FLAGS.torch_device == "cuda"
  if on_gpu and not torch.cuda.is_available():
    raise RuntimeError("torch sees no GPU")
  # cuDNN's fastest algorithm per shape, as torch's own ResNet recipes.
  torch.backends.cudnn.benchmark = True
  device = torch.device(FLAGS.torch_device)
  # torchvision's ResNets are v1.5 at every depth (the stride on the 3x3).
  model = getattr(torchvision.models, f"resnet{FLAGS.depth}")(
      num_classes=FLAGS.num_classes).to(device,
                                        memory_format=torch.channels_last)
  if workload == "torch_compile":
    # The model compiled (its forward and, by AOTAutograd, its backward), the
    # optimizer eager: torch.compile's usual form, compiled once in the
    # first step (a compiled optimizer step would compile again at the
    # second, once SGD's momentum buffers exist).
    model = torch.compile(model)
  optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE,
                              momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
  loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)
  images = (torch.rand(FLAGS.batch_size, 3, FLAGS.image_size,
                       FLAGS.image_size, device=device) * 255).to(
                           memory_format=torch.channels_last)
  labels = torch.randint(0, FLAGS.num_classes, (FLAGS.batch_size,),
                         device=device)

  def train(x, y):
    with torch.autocast(device.type, dtype=torch.bfloat16):
      loss = loss_fn(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss

  def synchronize():
    if on_gpu:
      torch.cuda.synchronize()

  start = time.perf_counter()
  train(images, labels)
  synchronize()
  compile_s = time.perf_counter() - start
  for _ in range(FLAGS.warmup_steps):
    train(images, labels)
  synchronize()
  if on_gpu:
    torch.cuda.reset_peak_memory_stats()
  windows = []
  for _ in range(FLAGS.repeats):
    start = time.perf_counter()
    for _ in range(FLAGS.steps):
      train(images, labels)
    synchronize()
    windows.append(time.perf_counter() - start)
  return {"compile_s": compile_s, "window_s": windows,
          "peak_memory_bytes": (int(torch.cuda.max_memory_allocated())
                                if on_gpu else None),
          "device": torch.cuda.get_device_name() if on_gpu else "cpu",
          "platform": "gpu" if on_gpu else "cpu"}


# -------------------------------------------------------------------- driver


def summarise(result: dict, flops: float | None) -> dict:
  """images/s, step ms and MFU (of the model's `flops` per step) from a
  worker's timed windows."""
  per_step = [w / FLAGS.steps for w in result["window_s"]]
  rates = [FLAGS.batch_size / s for s in per_step]
  out = dict(result)
  out.update({
      "images_per_s": statistics.median(rates),
      "images_per_s_range": [min(rates), max(rates)],
      "step_ms": 1000 * statistics.median(per_step)})
  if flops:
    out["model_flops_per_step"] = flops
    out["mfu"] = flops / statistics.median(per_step) / (
        FLAGS.peak_tflops * 1e12)
  return out


def ratios(results: dict) -> dict:
  """The issue's ratios of images/s, where both sides ran."""
  pairs = {"ours_vs_stock_layers": ("ours", "stock_layers"),
           "ours_vs_keras_app": ("ours", "keras_app"),
           "ours_bn32_vs_ours": ("ours_bn32", "ours"),
           "loop_vs_ours": ("loop", "ours"),
           "ours_vs_torch_compile": ("ours", "torch_compile"),
           "ours_vs_torch_eager": ("ours", "torch_eager")}
  out = {}
  for name, (a, b) in pairs.items():
    if "images_per_s" in results.get(a, {}) and "images_per_s" in results.get(
        b, {}):
      out[name] = results[a]["images_per_s"] / results[b]["images_per_s"]
  return out


def log_tail(log: TextIO, workload: str, stderr: str) -> None:
  """The last LOG_LINES lines of a workload's stderr, under its name."""
  lines = stderr.splitlines()[-LOG_LINES:]
  log.write(f"==== {workload}: the last {len(lines)} lines of its stderr\n")
  log.write("".join(line + "\n" for line in lines))
  log.flush()


def run_worker(workload: str, timeout_s: float, log: TextIO) -> dict:
  """One workload in its own process; its JSON, or why there is none. Its
  stderr's last lines go to `log`, also where it runs out of time."""
  command = [sys.executable, "-m", "lab.bench_gpu", f"--worker={workload}"]
  command += [f"--{name}={getattr(FLAGS, name)}" for name in (
      "depth", "batch_size", "image_size", "num_classes", "bn_images",
      "warmup_steps", "steps", "repeats", "torch_device")]
  env = dict(os.environ, KERAS_BACKEND="jax")
  try:
    done = subprocess.run(command, capture_output=True, text=True,
                          timeout=timeout_s, env=env)
  except subprocess.TimeoutExpired as e:
    log_tail(log, workload, bench_gpu_loop.output_text(e.stderr))
    return {"skipped": f"over its {timeout_s:.0f} s"}
  log_tail(log, workload, done.stderr)
  lines = [l for l in done.stdout.splitlines() if l.startswith("{")]
  if done.returncode or not lines:
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {"skipped": f"exit {done.returncode}: " + " | ".join(tail)}
  return json.loads(lines[-1])


def drive(workloads: list[str], budget_s: float,
          run_one: Callable[[str, float], dict],
          on_result: Callable[[dict], None],
          clock: Callable[[], float] = time.perf_counter) -> dict:
  """`run_one(workload, timeout_s)` for each of `workloads` in order, within
  `budget_s`: each may take what is left, at most WORKLOAD_TIMEOUT_S; one
  left less than MIN_SLOT_S is skipped and says so. `on_result(results)`
  after each. Returns {workload: result}."""
  start = clock()
  results = {}
  for workload in workloads:
    left_s = budget_s - (clock() - start)
    if left_s < MIN_SLOT_S:
      results[workload] = {
          "skipped": f"time budget spent: {max(left_s, 0):.0f} s of "
                     f"{budget_s:.0f} left, under {MIN_SLOT_S} s"}
    else:
      results[workload] = run_one(workload, min(left_s, WORKLOAD_TIMEOUT_S))
    print(workload, json.dumps(results[workload])[:300], flush=True)
    on_result(results)
  return results


def summarised(results: dict) -> dict:
  """The workers' results with images/s, step ms and MFU; torch's MFU from
  the model FLOPs of the same v1.5 network in Keras."""
  flops_v15 = (results.get("stock_layers", {}).get("model_flops_per_step") or
               results.get("ours", {}).get("model_flops_per_step"))
  out = {}
  for workload, result in results.items():
    out[workload] = result
    if "window_s" in result:
      flops = result.get("model_flops_per_step") or (
          flops_v15 if workload.startswith("torch") else None)
      out[workload] = summarise(result, flops)
  return out


def report(results: dict, wall_s: float, finished: bool) -> dict:
  """gpu_bench.json's content."""
  results = summarised(results)
  return {
      "what": "ResNet training steps on one device, side by side "
              "(lab/bench_gpu.py; issue 48)",
      "finished": finished,
      "config": {name: getattr(FLAGS, name) for name in (
          "depth", "batch_size", "image_size", "num_classes", "bn_images",
          "warmup_steps", "steps", "repeats", "peak_tflops",
          "loop_steps_per_loop", "loop_host_loops", "torch_device",
          "budget_s")},
      "versions": _versions(results),
      "workloads": results,
      "ratios": ratios(results),
      "wall_s": wall_s,
      "rerun": "make bench-gpu BENCH_OUT=DIR (lab/bench_gpu.py's "
               "docstring: the lent H200)",
  }


def main(argv):
  del argv
  if FLAGS.worker:
    run = run_torch if FLAGS.worker.startswith("torch") else run_keras
    print(json.dumps(run(FLAGS.worker)), flush=True)
    return
  os.makedirs(FLAGS.output_dir, exist_ok=True)
  path = os.path.join(FLAGS.output_dir, "gpu_bench.json")
  start = time.perf_counter()

  def write(results: dict, finished: bool = False) -> dict:
    content = report(results, time.perf_counter() - start, finished)
    with open(path + ".tmp", "w") as f:
      json.dump(content, f, indent=1)
    os.replace(path + ".tmp", path)
    return content

  def run_one(workload: str, timeout_s: float) -> dict:
    if workload == "loop":
      return bench_gpu_loop.run(
          timeout_s, os.path.join(FLAGS.output_dir, "gpu_bench_loop.log"),
          depth=FLAGS.depth, batch_size=FLAGS.batch_size,
          image_size=FLAGS.image_size, num_classes=FLAGS.num_classes,
          steps_per_loop=FLAGS.loop_steps_per_loop,
          host_loops=FLAGS.loop_host_loops)
    return run_worker(workload, timeout_s, log)

  with open(os.path.join(FLAGS.output_dir, "gpu_bench_workers.log"),
            "w") as log:
    results = drive(FLAGS.workloads, FLAGS.budget_s, run_one, write)
  content = write(results, finished=True)
  print(json.dumps(content["ratios"], indent=1))
  print("wrote", path)


if __name__ == "__main__":
  app.run(main)
