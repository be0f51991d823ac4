"""The TensorFlow side of the engine equivalence tests (test_engines.py).

Runs in the TensorFlow environment (.venv), started by the JAX tests:
  python tests_jax/tf_reference.py OUTPUT_DIR
For each (precision, BN group size) of engine_cases.STEP_CASES: the
project's TF step (ReplicaStep under MirroredStrategy over 8
virtual CPUs, then the host loop's moving-statistics average) from TF's
initial weights, written to step_<precision>_g<size>.npz as init/<path>,
grad/<path> (summed over replicas), after/<path> and loss. For each optimizer
case of engine_cases.OPTIMIZERS: three updates from given gradients, to
<case>.npz.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import engine_cases as cases  # noqa: E402
from resnet_tpu.optim.optimizers import build_optimizer  # noqa: E402
from resnet_tpu.runtime import compat  # noqa: E402
from resnet_tpu.engines.tensorflow.step import ReplicaStep  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0],
    [tf.config.LogicalDeviceConfiguration()] * cases.REPLICAS)


def _values(variables, prefix: str) -> dict[str, np.ndarray]:
  return {f"{prefix}/{v.path}": np.asarray(v.value) for v in variables}


def step(precision: str, group_size: int) -> dict[str, np.ndarray]:
  """One training step of the project's TF path."""
  cfg = cases.step_config(precision, group_size)
  keras.utils.set_random_seed(group_size)
  # Each strategy numbers its collectives from the same base key: shift it
  # so that this process's strategies never collide (as tests/conftest.py).
  compat.shift_collective_keys(tf.distribute.MirroredStrategy, 100000)
  strategy = tf.distribute.MirroredStrategy(
      [f"/cpu:{i}" for i in range(cases.REPLICAS)])
  with strategy.scope():
    model = cases.build_network(precision, cfg)
    optimizer = build_optimizer("momentum", cases.LEARNING_RATE)
    optimizer.build(model.trainable_variables)
  replica_step = ReplicaStep(cfg, model, optimizer, cases.REPLICAS)
  out = _values(model.variables, "init")
  images, labels = cases.batch(precision)
  dataset = strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensor_slices((images, labels)).batch(
          cases.GLOBAL_BATCH))

  @tf.function
  def run(batch):
    def replica_fn(x, y):
      grads, sums = replica_step.gradients(x, y)
      replica_step.apply(grads)
      replica_step.average_moving_statistics()
      return grads, sums.loss, sums.examples
    grads, loss, examples = strategy.run(replica_fn, args=batch)
    total = lambda t: strategy.reduce(tf.distribute.ReduceOp.SUM, t, None)
    return [total(g) for g in grads], total(loss) / total(examples)

  grads, loss = run(next(iter(dataset)))
  out.update({f"grad/{v.path}": np.asarray(g)
              for v, g in zip(model.trainable_variables, grads)})
  out.update(_values(model.variables, "after"))
  out["loss"] = np.asarray(loss)
  return out


def optimizer_updates(case: str) -> dict[str, np.ndarray]:
  """Three updates of `case` from engine_cases.optimizer_data."""
  variables, optimizer, grads = cases.optimizer_case(case)
  out = {}
  for k, step_grads in enumerate(grads):
    optimizer.apply([tf.constant(step_grads[name])
                     for name, _ in cases.OPTIMIZER_VARIABLES], variables)
    out.update({f"step{k}/{name}": np.asarray(v.value)
                for v, (name, _) in zip(variables,
                                        cases.OPTIMIZER_VARIABLES)})
  return out


def main(output_dir: str) -> None:
  os.makedirs(output_dir, exist_ok=True)
  for case in cases.OPTIMIZERS:
    np.savez(os.path.join(output_dir, f"{case}.npz"),
             **optimizer_updates(case))
  for precision, group_size in cases.STEP_CASES:
    np.savez(os.path.join(output_dir,
                          cases.case_name(precision, group_size) + ".npz"),
             **step(precision, group_size))


if __name__ == "__main__":
  main(sys.argv[1])
