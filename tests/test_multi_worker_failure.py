"""A dead worker stops a multi-worker run within a bounded time; restarting
every worker resumes from the last checkpoint; SIGTERM to one worker stops
all of them at the same step with one checkpoint; a worker that hangs while
alive (SIGSTOP) stops the others within --collective_timeout_s.

Two processes train under MultiWorkerMirroredStrategy on 127.0.0.1
(tests/reliability_worker.py: main.py with a tiny network). Once a
checkpoint exists, worker 1 is killed with SIGKILL (no chance to clean up,
as when a VM vanishes). The coordination service that MultiWorkerMirrored-
Strategy starts in TF 2.21 misses worker 1's heartbeats (10 s by default)
and aborts worker 0's pending collective; the trainer turns that into
preemption.WorkerLost, which main.py exits with code 43. Both workers are
then restarted with the same flags; they resume, and a SIGTERM to worker 1
alone (agreed on by an all-reduce after each host loop) makes both save and
exit with code 42.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time

import tensorflow as tf

from resnet_tpu.train import preemption
from test_multi_worker import _free_loopback_ports

WORKERS = 2
STARTUP_TIMEOUT_S = 240
# Heartbeat timeout (10 s) + abort + process teardown, with slack for a
# loaded CI machine.
FAILURE_DETECTION_BOUND_S = 90
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER_SCRIPT = os.path.join(ROOT, "tests", "reliability_worker.py")


def start_workers(log_dir, flags: list[list[str]],
                  script: str = WORKER_SCRIPT) -> list[subprocess.Popen]:
  """`script` (reliability_worker.py) as worker `task` of a loopback
  cluster with flags[task], its output in log_dir/worker_<task>.log."""
  cluster = {"worker": [f"127.0.0.1:{p}"
                        for p in _free_loopback_ports(len(flags))]}
  log_dir.mkdir(exist_ok=True)
  processes = []
  for task, task_flags in enumerate(flags):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=ROOT,
               TF_CPP_MIN_LOG_LEVEL="2", TF_CONFIG=json.dumps(
                   {"cluster": cluster,
                    "task": {"type": "worker", "index": task}}))
    with open(log_dir / f"worker_{task}.log", "w") as log:
      processes.append(subprocess.Popen(
          [sys.executable, script, *task_flags], env=env,
          stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
  return processes


def _start_workers(model_dir, log_dir, train_steps: int,
                   *extra_flags: str) -> list[subprocess.Popen]:
  flags = [f"--model_dir={model_dir}", "--strategy=multi_worker",
           "--use_synthetic_data", "--num_classes=10", "--image_size=32",
           "--global_batch_size=4", "--eval_batch_size=4",
           f"--train_steps={train_steps}", "--steps_per_loop=5",
           "--checkpoint_every_steps=10", "--lr_schedule=constant",
           "--warmup_epochs=0", *extra_flags]
  return start_workers(log_dir, [flags] * WORKERS)


def _kill_all(processes) -> None:
  for process in processes:
    if process.poll() is None:
      process.send_signal(signal.SIGCONT)  # a stopped process dies too
      process.kill()
      process.wait()


def _wait_for_checkpoint(model_dir, processes, log_path) -> None:
  deadline = time.time() + STARTUP_TIMEOUT_S
  while not _checkpoint_step(model_dir):
    assert time.time() < deadline and all(
        p.poll() is None for p in processes), log_path.read_text()[-3000:]
    time.sleep(0.5)


def _wait_for_step_above(log_path, step: int, processes,
                         deadline: float) -> None:
  while time.time() < deadline:
    logged = [int(s) for s in re.findall(r"step (\d+)/", log_path.read_text())]
    if logged and max(logged) > step:
      return
    assert all(p.poll() is None for p in processes), (
        log_path.read_text()[-3000:])
    time.sleep(0.5)
  raise AssertionError(f"no step above {step} in {log_path}")


def _preempted_step(log_path) -> int:
  return int(re.search(r"Preempted \(SIGTERM\) at step (\d+)/",
                       log_path.read_text())[1])


def _checkpoint_step(model_dir) -> int:
  latest = tf.train.latest_checkpoint(model_dir)
  return int(latest.rsplit("-", 1)[1]) if latest else 0


def test_worker_killed_stops_peer_restart_resumes_sigterm_stops_all(
    tmp_path):
  steps = 1_000_000
  model_dir = tmp_path / "model"
  first = tmp_path / "first"
  processes = _start_workers(model_dir, first, steps)
  try:
    _wait_for_checkpoint(model_dir, processes, first / "worker_0.log")
    processes[1].send_signal(signal.SIGKILL)
    killed_at = time.time()
    code = processes[0].wait(timeout=FAILURE_DETECTION_BOUND_S)
    detected_s = time.time() - killed_at
  finally:
    _kill_all(processes)
  log = (first / "worker_0.log").read_text()
  assert code == preemption.WORKER_LOST_EXIT_CODE, log[-3000:]
  assert "Lost contact with another worker" in log
  print(f"worker 0 exited {detected_s:.1f} s after worker 1 was killed")

  resumed_from = _checkpoint_step(model_dir)
  second = tmp_path / "second"
  processes = _start_workers(model_dir, second, steps)
  try:
    _wait_for_step_above(second / "worker_0.log", resumed_from, processes,
                         time.time() + STARTUP_TIMEOUT_S)
    processes[1].send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=FAILURE_DETECTION_BOUND_S) for p in processes]
  finally:
    _kill_all(processes)
  logs = [(second / f"worker_{task}.log").read_text()
          for task in range(WORKERS)]
  assert codes == [preemption.PREEMPTED_EXIT_CODE] * WORKERS, logs[0][-3000:]
  assert f"ckpt-{resumed_from} at step {resumed_from}" in logs[0]  # Restored
  stopped = [_preempted_step(second / f"worker_{task}.log")
             for task in range(WORKERS)]
  assert stopped[0] == stopped[1] > resumed_from
  assert _checkpoint_step(model_dir) == stopped[0]


# Above one host loop of the tiny network on a loaded 2-core machine,
# start-up skew between the workers included.
COLLECTIVE_TIMEOUT_S = 45


def test_worker_that_hangs_while_alive_stops_peer_and_restart_resumes(
    tmp_path):
  """SIGSTOP: the process lives on but never answers (a wedged host)."""
  model_dir = tmp_path / "model"
  first = tmp_path / "first"
  timeout_flag = f"--collective_timeout_s={COLLECTIVE_TIMEOUT_S}"
  processes = _start_workers(model_dir, first, 1_000_000, timeout_flag)
  try:
    _wait_for_checkpoint(model_dir, processes, first / "worker_0.log")
    processes[1].send_signal(signal.SIGSTOP)
    stopped_at = time.time()
    code = processes[0].wait(
        timeout=COLLECTIVE_TIMEOUT_S + FAILURE_DETECTION_BOUND_S)
    detected_s = time.time() - stopped_at
    assert processes[1].poll() is None  # still alive, only stuck
  finally:
    _kill_all(processes)
  log = (first / "worker_0.log").read_text()
  assert code == preemption.WORKER_LOST_EXIT_CODE, log[-3000:]
  assert "Lost contact with another worker" in log
  print(f"worker 0 exited {detected_s:.1f} s after worker 1 was stopped")

  resumed_from = _checkpoint_step(model_dir)
  second = tmp_path / "second"
  # A deliberate change of length (config.json records it).
  processes = _start_workers(model_dir, second, resumed_from + 10,
                             timeout_flag, "--allow_config_change=train_steps")
  try:
    codes = [p.wait(timeout=STARTUP_TIMEOUT_S) for p in processes]
  finally:
    _kill_all(processes)
  log = (second / "worker_0.log").read_text()
  assert codes == [0] * WORKERS, log[-3000:]
  assert f"ckpt-{resumed_from} at step {resumed_from}" in log  # Restored
  assert _checkpoint_step(model_dir) == resumed_from + 10
