"""A bound on how long a multi-host run may wait without making progress.

TensorFlow bounds each multi-worker collective itself (--collective_timeout_s
becomes the collectives' timeout: parallel/tensorflow/strategy.py), and a
collective that waits longer fails; the trainer turns that into exit 43. A JAX
step's collectives (gloo on CPU, NCCL on GPU, the TPU's interconnect) take no
timeout: behind a peer that hangs while alive, the host waits in C++, where
Python cannot raise. This watchdog, a thread, ends the process instead when
the trainer reports no progress (a host loop, an agreement, a checkpoint or an
eval finished) for `timeout_s`.
"""
import threading
import time
from typing import Callable

# How often the thread looks, at most (a tenth of the timeout, below it).
_MAX_POLL_S = 5.0


class Watchdog:
  """Calls `expire(seconds_waited)` from its own thread when `alive()` has
  not been called for `timeout_s` (0: never); armed by the first alive(),
  so that the first host loop's compilation is not counted. Use as a
  context manager; `expire` is expected to end the process."""

  def __init__(self, timeout_s: float, expire: Callable[[float], None]):
    self.timeout_s = float(timeout_s)
    self._expire = expire
    self._last = None  # time.monotonic() of the last alive(); None: unarmed
    self._done = threading.Event()
    self._thread = None

  def __enter__(self) -> "Watchdog":
    if self.timeout_s > 0:
      self._thread = threading.Thread(target=self._watch, daemon=True,
                                      name="progress-watchdog")
      self._thread.start()
    return self

  def __exit__(self, *exc_info) -> None:
    self._done.set()
    if self._thread is not None:
      self._thread.join()

  def alive(self) -> None:
    """The trainer made progress: the timeout starts again."""
    self._last = time.monotonic()

  def _watch(self) -> None:
    poll_s = min(self.timeout_s / 10, _MAX_POLL_S)
    while not self._done.wait(poll_s):
      last = self._last
      if last is None:
        continue
      waited = time.monotonic() - last
      if waited > self.timeout_s:
        self._expire(waited)
        return
