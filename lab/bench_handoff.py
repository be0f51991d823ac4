"""The JAX input hand-off's cost on this CPU (issue 60): the training
loop's images/s against its step alone, on the same shapes.

  .venv/bin/python -m lab.bench_handoff --data_dir=demo_data/tfrecords \\
      [--before=/path/to/a/checkout/of/another/commit]

The demo's shapes (flags/cpu_demo.cfg: ResNet-18, 32 px, batch 64 on 4
virtual CPU devices, BN groups of 2) on its TFRecords (make demo).
Each sample is --steps steps after a warm-up loop: `loop` is a host loop
of JaxEngine (tf.data, the fault counts, the hand-off, the step), `step`
the jitted step alone on one batch already on the devices; they alternate
in one process (a prefetching loop starts with the batches it put on the
devices during the step's sample, as after a checkpoint or an eval). With
--before, the same measurement runs on that checkout's code in its own
process, alternating with this one's over --rounds. Prints per code and
kind the median images/s, min-max, and loop/step.
"""
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_string("data_dir", "demo_data/tfrecords", "The demo's TFRecords.")
flags.DEFINE_string("before", "", "A checkout of the code to compare.")
flags.DEFINE_integer("rounds", 2, "Processes per code, alternating.")
flags.DEFINE_integer("samples", 2, "Loop and step samples per process.")
flags.DEFINE_integer("steps", 10, "Steps per sample.")
flags.DEFINE_bool("child", False, "Measure in this process (internal).")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A measuring process: this module, with argv[1]'s resnet_tpu first on the
# path (lab/__init__.py imports it).
CHILD = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); "
         "runpy.run_module('lab.bench_handoff', run_name='__main__', "
         "alter_sys=True)")
REPLICAS = 4
DEMO = dict(strategy="cpu", num_cpu_replicas=REPLICAS, bn_group_size=2,
            resnet_depth=18, num_classes=10, image_size=32,
            global_batch_size=64, eval_batch_size=64, train_steps=10_000,
            steps_per_loop=10, optimizer="momentum", base_learning_rate=0.4,
            label_smoothing=0.1, weight_decay=5e-5, shuffle_buffer_size=2000,
            seed=1, num_train_images=2000, backend="jax")


def measure() -> dict:
  """{'loop': [img/s...], 'step': [img/s...]} in this process."""
  os.environ["KERAS_BACKEND"] = "jax"
  os.environ["XLA_FLAGS"] = (
      f"--xla_force_host_platform_device_count={REPLICAS}")
  # pylint: disable=g-import-not-at-top  (after the environment)
  import jax
  from resnet_tpu import data_checks
  from resnet_tpu.config import TrainConfig
  from resnet_tpu.engines.jax import startup
  # pylint: enable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as model_dir:
    cfg = TrainConfig.from_flat(model_dir=model_dir,
                                data_dir=FLAGS.data_dir,
                                jax_compilation_cache_dir="", **DEMO)
    cfg, devices = startup.start(cfg)
    engine = startup.build(cfg, devices)
    found = data_checks.find_data_files(FLAGS.data_dir)
    train_input, _ = startup.record_input(cfg, found, 64,
                                          2 * len(found.train))
    engine.start_input(train_input)
    engine.host_loop(2)  # compiles
    images, labels = (next(train_input(0))[i] for i in (0, 1))
    batch = engine.step_fn.shard_batch(images, labels)
    state = engine.state
    images_per_sample = FLAGS.steps * cfg.run.global_batch_size
    samples = {"loop": [], "step": []}
    for _ in range(FLAGS.samples):
      t0 = time.perf_counter()
      engine.host_loop(FLAGS.steps)
      samples["loop"].append(images_per_sample / (time.perf_counter() - t0))
      state = engine.state
      t0 = time.perf_counter()
      for _ in range(FLAGS.steps):
        state, metrics = engine.step_fn.step(state, *batch)
      jax.block_until_ready(metrics)
      samples["step"].append(images_per_sample / (time.perf_counter() - t0))
      engine.state = state
    engine.close_inputs()
  return samples


def summary(values: list[float]) -> dict:
  return {"median": round(statistics.median(values), 1),
          "min": round(min(values), 1), "max": round(max(values), 1),
          "n": len(values)}


def main(argv):
  del argv
  if FLAGS.child:
    import resnet_tpu  # pylint: disable=g-import-not-at-top
    print("CODE " + os.path.dirname(os.path.dirname(resnet_tpu.__file__)))
    print("RESULT " + json.dumps(measure()), flush=True)
    return
  codes = {"after": ROOT}
  if FLAGS.before:
    codes = {"before": os.path.abspath(FLAGS.before), **codes}
  got = {name: {"loop": [], "step": []} for name in codes}
  for _ in range(FLAGS.rounds):
    for name, tree in codes.items():
      done = subprocess.run(
          [sys.executable, "-c", CHILD, tree, "--child",
           f"--data_dir={os.path.abspath(FLAGS.data_dir)}",
           f"--samples={FLAGS.samples}", f"--steps={FLAGS.steps}"],
          cwd=ROOT, capture_output=True, text=True, check=True)
      said = dict(line.split(" ", 1) for line in done.stdout.splitlines()
                  if line.startswith(("CODE ", "RESULT ")))
      assert said["CODE"] == tree, (said["CODE"], tree)
      for kind, values in json.loads(said["RESULT"]).items():
        got[name][kind] += values
  for name, kinds in got.items():
    loop, step = (summary(kinds[k]) for k in ("loop", "step"))
    print(f"{name}: loop {loop}, step {step}, loop/step "
          f"{loop['median'] / step['median']:.2f}")


if __name__ == "__main__":
  app.run(main)
