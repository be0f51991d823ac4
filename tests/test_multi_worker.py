"""4 worker processes on 127.0.0.1 train exactly like 4 in-process replicas.

MultiWorkerMirroredStrategy gives each CPU worker one replica; per-host input
sharding gives it its own slice of each batch; BN groups of 2 span worker
pairs (Ying et al. §3.1) and gradients are summed by the 2-D all-reduce over
a 2x2 grid (Mikami et al.). After 3 steps every worker's weights must equal
those of a single-process 4-replica MirroredStrategy run with Keras's own
gradient summation on the same data, the BN moving statistics included
(each worker updates its own; every host loop ends with their mean over all
replicas). Each worker's traced host loop communicates only through its
collectives.
"""
import json
import os
import socket
import subprocess
import sys
import time

import keras
import numpy as np

from conftest import cpu_strategy
import multi_worker_train as worker
from resnet_tpu.engines.tensorflow.engine import TensorFlowEngine
from resnet_tpu.model.resnet import build_model

WORKERS = 4
# Whole test, workers included; on 2 idle cores it takes about 60 s.
DEADLINE_S = 110.0
COLLECTIVE_TIMEOUT_S = 60.0
BN_LAYERS = 20  # ResNet-18
# Every communicating op of a worker's traced host loop. Per step: the 2-D
# gradient all-reduce over the 2x2 grid (a row reduce-scatter, one
# CollectiveAllToAllV2; a column sum; a row gather, one CollectiveGatherV2),
# 2 group sums per BN layer, the sum of the step's metrics, and the
# distributed iterator's check that every worker still has data (int64).
# After the steps: one all-reduce of the moving statistics.
EXPECTED_CENSUS = {
    "host_loop": {"CollectiveReduceV2": 2 * BN_LAYERS + 4,
                  "CollectiveAllToAllV2": 1, "CollectiveGatherV2": 1},
    "after_the_steps": ["CollectiveReduceV2"]}
WORKER_SCRIPT = os.path.join(os.path.dirname(__file__),
                             "multi_worker_train.py")


def _free_loopback_ports(n: int) -> list[int]:
  sockets = [socket.socket() for _ in range(n)]
  for s in sockets:
    s.bind(("127.0.0.1", 0))
  ports = [s.getsockname()[1] for s in sockets]
  for s in sockets:
    s.close()
  return ports


def _start_workers(tmp_path, init_path) -> list[subprocess.Popen]:
  cluster = {"worker": [f"127.0.0.1:{p}"
                        for p in _free_loopback_ports(WORKERS)]}
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  processes = []
  for task in range(WORKERS):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=root,
               TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
                   {"cluster": cluster,
                    "task": {"type": "worker", "index": task}}))
    log = open(tmp_path / f"worker_{task}.log", "w")
    processes.append(subprocess.Popen(
        [sys.executable, WORKER_SCRIPT, str(tmp_path / "model"),
         str(init_path), str(tmp_path / f"weights_{task}.npz"), "2d", "2x2",
         str(COLLECTIVE_TIMEOUT_S)],
        env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root))
  return processes


def _wait(processes, tmp_path, deadline: float) -> None:
  try:
    for task, process in enumerate(processes):
      code = process.wait(timeout=max(1.0, deadline - time.time()))
      assert code == 0, (f"worker {task} exited with {code}:\n" +
                         (tmp_path / f"worker_{task}.log").read_text()[-3000:])
  finally:
    for process in processes:
      if process.poll() is None:
        process.kill()
        process.wait()


def test_4_loopback_workers_match_a_4_replica_mirrored_run(tmp_path):
  deadline = time.time() + DEADLINE_S
  keras.utils.set_random_seed(0)
  cfg = worker.config(str(tmp_path))
  model = build_model(cfg.model, cfg.distribution)
  initial = model.get_weights()
  init_path = tmp_path / "init.npz"
  np.savez(init_path, *initial)
  processes = _start_workers(tmp_path, init_path)
  try:
    reference = TensorFlowEngine(
        worker.config(str(tmp_path / "reference"),
                      collective_timeout_s=COLLECTIVE_TIMEOUT_S),
        cpu_strategy(WORKERS))
    reference.model.set_weights(initial)
    reference.fit(worker.replica_slices_dataset_fn)
    expected = reference.model.get_weights()
  finally:
    _wait(processes, tmp_path, deadline)

  moved = max(np.abs(e - i).max() for e, i in zip(expected, initial))
  assert moved > 1e-2  # 3 steps changed the weights: the check has teeth
  for task in range(WORKERS):
    with np.load(tmp_path / f"weights_{task}.npz") as got:
      for k, want in enumerate(expected):
        # Float32 sums in another order (4 processes vs one), amplified by
        # the LR of 8 over 3 steps: a few weights differ by ~1e-5.
        np.testing.assert_allclose(got[f"arr_{k}"], want, rtol=1e-4,
                                   atol=5e-5, err_msg=f"worker {task}")
    with open(tmp_path / f"weights_{task}.json") as f:
      census = json.load(f)
    assert census == EXPECTED_CENSUS, f"worker {task}"
