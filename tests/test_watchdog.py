"""engines/jax/watchdog.py: the bound of --collective_timeout_s on a multi-host
JAX run ends the process only after that long without progress, counted
from the first progress (tests_jax/test_multi_host_failure.py runs it in
main.py with a stopped peer)."""
import threading
import time

from resnet_tpu.train import preemption
from resnet_tpu.engines.jax.watchdog import Watchdog

TIMEOUT_S = 1.0
# Long enough for the watchdog's thread on a loaded 2-core machine.
WAIT_S = 10.0


def _expiry():
  fired, waited = threading.Event(), []

  def expire(seconds: float) -> None:
    waited.append(seconds)
    fired.set()

  return fired, waited, expire


def test_expires_once_after_the_timeout_without_progress():
  fired, waited, expire = _expiry()
  with Watchdog(TIMEOUT_S, expire) as watchdog:
    watchdog.alive()
    start = time.monotonic()
    assert fired.wait(WAIT_S)
    assert time.monotonic() - start >= TIMEOUT_S
  assert len(waited) == 1 and waited[0] > TIMEOUT_S


def test_progress_keeps_it_quiet_and_it_is_unarmed_before_the_first():
  fired, _, expire = _expiry()
  with Watchdog(TIMEOUT_S, expire) as watchdog:
    assert not fired.wait(3 * TIMEOUT_S)  # unarmed: the first loop compiles
    end = time.monotonic() + 3 * TIMEOUT_S
    while time.monotonic() < end:
      watchdog.alive()
      time.sleep(TIMEOUT_S / 10)
  assert not fired.is_set()


def test_zero_timeout_never_expires():
  fired, _, expire = _expiry()
  with Watchdog(0, expire) as watchdog:
    watchdog.alive()
    assert not fired.wait(2 * TIMEOUT_S)


def test_lost_worker_message_names_the_checkpoint_or_the_start():
  stop = preemption.WorkerLost.after(7, "why", "/run/ckpt-5")
  assert stop.exit_code == preemption.WORKER_LOST_EXIT_CODE == 43
  assert str(stop) == ("Lost contact with another worker after step 7 "
                       "(why). Restart every worker with the same flags to "
                       "resume from /run/ckpt-5.")
  assert str(preemption.WorkerLost.after(0, "why", None)).endswith(
      "resume from the start (no checkpoint yet).")
