"""One process of a multi-host JAX run of engine_cases' float32 step: three
training steps at each BN group size, each process feeding its share of
every global batch (test_multi_host.py starts two, and one alone on as
many devices, and compares them). Then, at the last group size, the other
paths of the step, on tests/tiny_model.py's network (they are the step's,
not the network's; it compiles in seconds): three steps of two
micro-batches each (batch-size control) with float16's loss scaling (S =
2^10, doubled after 2 finite steps), then BN statistics recomputed from
two batches (--bn_stats=recompute).

usage: multi_host_step.py OUT_DIR NUM_PROCESSES PROCESS_ID PORT PRECISION
                          GROUP...
PRECISION (float32 or float64) is the groups' steps'; the other paths run
in float32.
Process 0 also writes the initial weights. Run with JAX_PLATFORMS=cpu and
XLA's host device count set. One process (NUM_PROCESSES 1) is the reference:
it sums over the same collectives library (gloo) as several do, so that the
runs differ only in how the replicas are spread over processes. (Against a
run without jax.distributed, whose all-reduces are XLA's own, float32
rounding differs, and in three steps flips enough ReLUs near 0 to move
some tensors by 1 %, as between the engines: engine_cases.STEP_CASES.)
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

STEPS = 3
# The loss scale's (initial S, growth steps) in the last case.
LOSS_SCALE = (2.0 ** 10, 2)


def host_rows(num_processes: int, process_id: int, rows: int) -> slice:
  """This process's share of a global batch of `rows`."""
  share = rows // num_processes
  return slice(process_id * share, (process_id + 1) * share)


def main(out_dir: str, num_processes: int, process_id: int, port: int,
         precision: str, groups: list[int]) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  jax.config.update("jax_enable_x64", precision == "float64")
  jax.distributed.initialize(f"127.0.0.1:{port}", num_processes, process_id,
                             cluster_detection_method="deactivate",
                             initialization_timeout=120)
  # pylint: disable=g-import-not-at-top
  import keras
  import engine_cases as cases
  from resnet_tpu.optim.optimizers import build_optimizer
  from resnet_tpu.parallel.jax.bn_all_reduce import build_mesh
  from resnet_tpu.engines.jax import step as jax_step
  from tiny_model import tiny_resnet
  # pylint: enable=g-import-not-at-top
  for group in groups:
    keras.utils.set_random_seed(0)
    cfg = cases.step_config(precision, group)
    model = cases.build_network(precision, cfg)
    step = jax_step.JaxTrainStep(
        model, build_optimizer("momentum", cases.LEARNING_RATE),
        build_mesh(group, jax.devices()),
        jax_step.LossConfig(cfg.model.num_classes, cfg.run.global_batch_size,
                            cfg.optim.label_smoothing, cfg.optim.weight_decay))
    state = step.state()
    if process_id == 0:
      np.savez(os.path.join(out_dir, f"init_g{group}.npz"),
               *jax.device_get(jax.tree.leaves(state)))
    rows = host_rows(num_processes, process_id, cases.GLOBAL_BATCH)
    for seed in range(STEPS):
      images, labels = cases.batch(precision, seed)
      state, _ = step.step(state, *step.shard_batch(images[rows],
                                                    labels[rows]))
    np.savez(os.path.join(out_dir, f"after_g{group}_p{process_id}.npz"),
             *jax.device_get(jax.tree.leaves(state)))
  keras.utils.set_random_seed(0)
  cfg = cases.step_config("float32", groups[-1])
  step = jax_step.JaxTrainStep(
      tiny_resnet(cfg), build_optimizer("momentum", cases.LEARNING_RATE),
      build_mesh(groups[-1], jax.devices()),
      jax_step.LossConfig(cfg.model.num_classes, cfg.run.global_batch_size,
                          cfg.optim.label_smoothing, cfg.optim.weight_decay),
      loss_scale=LOSS_SCALE)
  state = step.state()
  micro = [cases.batch("float32", seed) for seed in (STEPS, STEPS + 1)]
  for _ in range(STEPS):
    state, _ = step.accumulated_step(state, *step.shard_micro_batches(
        *(np.stack([b[i][rows] for b in micro]) for i in (0, 1))))
  state = step.recompute_statistics(state,
                                    (images[rows] for images, _ in micro))
  np.savez(os.path.join(out_dir, f"paths_p{process_id}.npz"),
           *jax.device_get(jax.tree.leaves(state)))


if __name__ == "__main__":
  main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]),
       sys.argv[5], [int(g) for g in sys.argv[6:]])
