"""A lost process stops a multi-host JAX run with exit 43, as a lost worker
stops TensorFlow's (tests/test_multi_worker_failure.py), and restarting
every process resumes from the last checkpoint.

Two jax.distributed processes on 127.0.0.1 train a small network on
synthetic data. Once a checkpoint exists:
- process 1 is stopped (SIGSTOP: alive, but it never answers). Process 0
  waits in its all-reduce, in C++, until the watchdog of
  --collective_timeout_s (engines/jax/watchdog.py) exits 43, before
  jax.distributed's heartbeat timeout would abort it (exit 134). Both
  restarted, they resume from that checkpoint;
- once they have saved again, process 1 is killed (SIGKILL: a VM that
  vanishes). Process 0's step fails in its all-reduce (gloo: connection
  reset); the trainer names the checkpoint and exits 43
  (processes.lost_peer), without waiting for jax.distributed's
  shutdown, which would wait for the dead process and then abort.
"""
import os
import re
import signal
import time

import pytest

from main_runs import free_port
from main_runs import hosts
from main_runs import wait_all
from resnet_tpu.config import ConfigError
from resnet_tpu.config import DistributionConfig
from resnet_tpu.engines.jax import processes

# Start-up (two processes compiling on two cores) to the first checkpoint.
STARTUP_TIMEOUT_S = 300
# From the kill to process 0's exit: measured 1 s.
DEAD_PEER_BOUND_S = 60
# Above one host loop of this network on a loaded 2-core machine.
COLLECTIVE_TIMEOUT_S = 20
# From the stop to process 0's exit: the timeout, the watchdog's poll
# (2 s here) and the exit. Measured: 31 s with a timeout of 30 s.
HUNG_PEER_BOUND_S = COLLECTIVE_TIMEOUT_S + 30
LOST = 43


def _processes(model_dir: str, logs: str, train_steps: int, *extra: str,
               first: int = 0):
  port = free_port()
  return hosts(
      [["main.py", "--backend=jax", "--strategy=multi_worker",
        f"--coordinator_address=127.0.0.1:{port}", "--num_processes=2",
        f"--process_id={i}", "--use_synthetic_data", "--resnet_depth=18",
        "--image_size=32", "--num_classes=10", "--global_batch_size=4",
        "--eval_batch_size=4", f"--train_steps={train_steps}",
        "--steps_per_loop=5", "--checkpoint_every_steps=10",
        "--checkpoint_every_minutes=0", "--lr_schedule=constant",
        "--warmup_epochs=0", f"--model_dir={model_dir}", *extra]
       for i in range(2)], 1, logs, first)


def _checkpoint_step(model_dir: str) -> int:
  steps = [int(m[1]) for m in map(re.compile(r"ckpt-(\d+)\.index$").search,
                                  os.listdir(model_dir)) if m]
  return max(steps, default=0)


def _wait_for_checkpoint(model_dir: str, processes, logs: str,
                         first: int = 0, above: int = 0) -> int:
  """Waits for a checkpoint of a step above `above`; returns its step."""
  deadline = time.time() + STARTUP_TIMEOUT_S
  while not (os.path.isdir(model_dir) and
             _checkpoint_step(model_dir) > above):
    if time.time() > deadline or any(p.poll() is not None
                                     for p in processes):
      for p in processes:
        p.kill()
      raise AssertionError(wait_all(processes, logs, first)[0][-3000:])
    time.sleep(0.5)
  return _checkpoint_step(model_dir)


def _exit_after(process, bound_s: float) -> tuple[int, float]:
  start = time.time()
  code = process.wait(timeout=bound_s)
  return code, time.time() - start


def _end(processes) -> None:
  for process in processes:
    if process.poll() is None:
      process.send_signal(signal.SIGCONT)  # a stopped process dies too
      process.kill()
      process.wait()


def _lost(log: str, cause: str, model_dir: str) -> bool:
  """Whether `log` ends the run with WorkerLost's message, for `cause` (a
  regular expression), naming the newest checkpoint of `model_dir`."""
  return bool(re.search(
      rf"Lost contact with another worker after step \d+ \({cause}\)\. "
      "Restart every worker with the same flags to resume from "
      rf"{model_dir}/ckpt-{_checkpoint_step(model_dir)}\.", log))


def test_a_hung_then_a_killed_process_stop_the_other_with_43(tmp_path):
  """SIGSTOP, exit 43, both restarted resume; then SIGKILL, exit 43."""
  model_dir, logs = str(tmp_path / "run"), str(tmp_path)
  timeout = f"--collective_timeout_s={COLLECTIVE_TIMEOUT_S}"
  processes = _processes(model_dir, logs, 1_000_000, timeout)
  try:
    _wait_for_checkpoint(model_dir, processes, logs)
    processes[1].send_signal(signal.SIGSTOP)
    code, seconds = _exit_after(processes[0], HUNG_PEER_BOUND_S)
    assert processes[1].poll() is None  # alive, only stuck
  finally:
    _end(processes)
  log = wait_all(processes, logs)[0]
  assert code == LOST, log[-3000:]
  assert _lost(log, r"no host loop, agreement, checkpoint or eval finished "
               rf"in \d+ s, above --collective_timeout_s="
               rf"{COLLECTIVE_TIMEOUT_S}", model_dir), log[-3000:]
  # Counted from the last progress, a host loop before the stop at most.
  assert seconds >= COLLECTIVE_TIMEOUT_S - 5
  print(f"process 0 exited {seconds:.1f} s after process 1 was stopped")

  saved = _checkpoint_step(model_dir)
  processes = _processes(model_dir, logs, 1_000_000, timeout, first=2)
  try:
    _wait_for_checkpoint(model_dir, processes, logs, first=2, above=saved)
    processes[1].kill()
    code, seconds = _exit_after(processes[0], DEAD_PEER_BOUND_S)
  finally:
    _end(processes)
  log = wait_all(processes, logs, first=2)[0]
  assert f"Restored {model_dir}/ckpt-{saved} at step {saved}" in log, (
      log[-3000:])
  assert code == LOST, log[-3000:]
  assert _lost(log, ".*Gloo.*", model_dir), log[-3000:]
  print(f"process 0 exited {seconds:.1f} s after process 1 was killed")


def test_the_heartbeat_timeout_stays_above_the_watchdogs():
  """JAX's default (100 s) up to --collective_timeout_s=40; above, 60 s
  more, which a JAX without heartbeat_timeout_seconds (0.6.2) cannot set:
  one line naming the flag."""
  with_it = {"heartbeat_timeout_seconds": None}
  for timeout in (0, 20, 40):
    assert processes.heartbeat_argument(
        processes.heartbeat_timeout_s(timeout), timeout, {}) == {}
  assert processes.heartbeat_argument(
      processes.heartbeat_timeout_s(90), 90, with_it) == {
          "heartbeat_timeout_seconds": 150}
  with pytest.raises(ConfigError, match=r"--collective_timeout_s=90 .*"
                     r"raised to 150 s.*--collective_timeout_s=40 or less"):
    processes.heartbeat_argument(processes.heartbeat_timeout_s(90), 90, {})


def test_a_jax_without_the_heartbeat_setting_stops_before_starting(
    monkeypatch):
  """The flag's line itself, before jax.distributed starts, not a failed
  start's."""
  called = []
  monkeypatch.setattr(
      processes.jax.distributed, "initialize",
      lambda coordinator_address, num_processes, process_id, **kw:
      called.append(kw))
  dist = DistributionConfig(coordinator_address="127.0.0.1:1",
                            num_processes=2, process_id=0,
                            collective_timeout_s=90)
  with pytest.raises(ConfigError, match=r"^--collective_timeout_s=90 "):
    processes.start(dist)
  assert not called
