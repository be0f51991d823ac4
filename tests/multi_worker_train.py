"""One worker of tests/test_multi_worker.py: a few steps of a tiny ResNet-18.

Run by the test with TF_CONFIG naming 4 workers on 127.0.0.1. Each worker
has one CPU replica (MultiWorkerMirroredStrategy on CPU), reads only its own
replica's slice of every global batch, trains with BN groups of 2 replicas
(worker pairs) and, optionally, the 2-D gradient all-reduce, then writes its
weights. `config` and `replica_slices_dataset_fn` are shared with the
single-process reference run in the test.

It also writes OUT.json: every communicating op of its traced host loop
(collective_helpers.communication_ops), and those after its step loop.

Usage (repository root on PYTHONPATH, TF_CONFIG set):
  python tests/multi_worker_train.py MODEL_DIR INIT.npz OUT.npz \
      GRADIENT_ALL_REDUCE GRID TIMEOUT_S
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

from collective_helpers import communication_ops
from collective_helpers import COMMUNICATION_OP
from collective_helpers import graph_nodes
from resnet_tpu.config import TrainConfig
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine

STEPS = 3
GLOBAL_BATCH = 8
IMAGE_SIZE = 32
NUM_CLASSES = 10


def config(model_dir: str, **overrides) -> TrainConfig:
  """ResNet-18 at 32 px, 4 replicas of 2 images, BN groups of 2."""
  return TrainConfig.tiny(model_dir, **{
      "use_synthetic_data": True, "num_classes": NUM_CLASSES,
      "image_size": IMAGE_SIZE, "bn_group_size": 2,
      "global_batch_size": GLOBAL_BATCH, "train_steps": STEPS,
      "steps_per_loop": STEPS, "num_train_images": GLOBAL_BATCH * STEPS,
      "base_learning_rate": 8.0, "keep_checkpoints": 1, **overrides})


def replica_slices_dataset_fn(ctx: tf.distribute.InputContext
                              ) -> tf.data.Dataset:
  """Per-replica batches; replica r always gets slice r of each step.

  One fixed random global batch per step; each input pipeline yields, step
  by step, the slices of the replicas it feeds (all of them in a single
  process, its own one per worker).
  """
  per_replica = ctx.get_per_replica_batch_size(GLOBAL_BATCH)
  replicas = ctx.num_replicas_in_sync
  rng = np.random.default_rng(0)
  images = rng.uniform(0, 255, (STEPS, replicas, per_replica, IMAGE_SIZE,
                                IMAGE_SIZE, 3)).astype(np.float32)
  labels = rng.integers(0, NUM_CLASSES, (STEPS, replicas, per_replica))
  per_pipeline = replicas // ctx.num_input_pipelines
  mine = slice(ctx.input_pipeline_id * per_pipeline,
               (ctx.input_pipeline_id + 1) * per_pipeline)
  return tf.data.Dataset.from_tensor_slices((
      images[:, mine].reshape(-1, per_replica, IMAGE_SIZE, IMAGE_SIZE, 3),
      labels[:, mine].reshape(-1, per_replica).astype(np.int32)))


def main(model_dir: str, init_path: str, out_path: str,
         gradient_all_reduce: str, grid: str, timeout_s: float) -> None:
  strategy = tf.distribute.MultiWorkerMirroredStrategy(
      communication_options=tf.distribute.experimental.CommunicationOptions(
          timeout_seconds=timeout_s))
  trainer = TensorFlowEngine(
      config(model_dir, gradient_all_reduce=gradient_all_reduce,
             all_reduce_grid=grid, collective_timeout_s=timeout_s), strategy)
  with np.load(init_path) as init:
    trainer.model.set_weights([init[f"arr_{k}"]
                               for k in range(len(init.files))])
  trainer.fit(replica_slices_dataset_fn)
  np.savez(out_path, *trainer.model.get_weights())
  # The loop fit traced (same input signature: found, not traced again).
  loop = trainer.loops.train.get_concrete_function(
      iter(strategy.distribute_datasets_from_function(
          replica_slices_dataset_fn)), tf.constant(STEPS))
  graph = loop.graph.as_graph_def()
  outside = [n.op for fn, n in graph_nodes(graph)
             if not fn and COMMUNICATION_OP.search(n.op)]
  with open(os.path.splitext(out_path)[0] + ".json", "w") as f:
    json.dump({"host_loop": communication_ops(graph),
               "after_the_steps": outside}, f)


if __name__ == "__main__":
  main(*sys.argv[1:6], float(sys.argv[6]))
