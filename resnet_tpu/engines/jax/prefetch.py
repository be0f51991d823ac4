"""The next batches on the devices while the step runs (issue 60).

A background thread reads the host's batches (tf.data: host_batches.py, or
synthetic.py) and puts each on the devices (JaxTrainStep.shard_batch), at
most AHEAD of them ahead of the step, as big_vision's prefetch_iterator
and flax's `jax_utils.prefetch_to_device(it, 2)` keep two; Keras's JAX
trainer keeps one. The step never waits on tf.data's next batch nor on its
transfer unless the input is slower than the step.

The thread ends at the end of the input, at close(), or on an exception,
which the caller's next() raises (a lost peer's JaxRuntimeError included,
so the engine still names it). The batches it read ahead are dropped at
close(): the engine counts only the batches the steps took, so a resumed
run reads those again, their lost records counted then.
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

from absl import logging
import jax
import jax.numpy as jnp

# flax's prefetch_to_device(it, 2), big_vision's default.
AHEAD = 2
# How long close() waits for the thread to finish a batch it is reading; a
# daemon thread, it does not keep the process from exiting after that.
JOIN_TIMEOUT_S = 10.0


class _End:
  """The input's end, or the exception that ended it."""

  def __init__(self, error: BaseException | None = None):
    self.error = error


class DevicePrefetch:
  """`put(batch)` of every batch of `batches`, in order, at most `ahead`
  read ahead of the caller; an iterator, and a context manager that
  closes it."""

  def __init__(self, batches: Iterator[Any], put: Callable[[Any], Any],
               ahead: int = AHEAD):
    self._ready: queue.Queue = queue.Queue()
    self._room = threading.Semaphore(ahead)
    self._ahead = ahead
    self._stop = threading.Event()
    self._end: _End | None = None
    self._thread = threading.Thread(target=self._fill, args=(batches, put),
                                    name="device-prefetch", daemon=True)
    self._thread.start()

  def _fill(self, batches: Iterator[Any], put: Callable[[Any], Any]):
    try:
      while True:
        self._room.acquire()  # one taken, or close()
        if self._stop.is_set():
          return
        batch = next(batches, _END)
        if batch is _END:
          self._ready.put(_End())
          return
        self._ready.put(put(batch))
    except BaseException as e:  # pylint: disable=broad-except  (re-raised)
      self._ready.put(_End(e))

  def __iter__(self) -> DevicePrefetch:
    return self

  def __next__(self) -> Any:
    if self._end is None:
      item = self._ready.get()
      if not isinstance(item, _End):
        self._room.release()
        return item
      self._end = item
    if self._end.error is not None:
      raise self._end.error
    raise StopIteration

  def close(self) -> None:
    """Stops the thread (after the batch it is reading, if any) and drops
    the batches read ahead."""
    self._stop.set()
    for _ in range(self._ahead):
      self._room.release()
    self._thread.join(JOIN_TIMEOUT_S)
    if self._thread.is_alive():
      logging.warning("The input thread still reads a batch after %g s; "
                      "it ends with the process.", JOIN_TIMEOUT_S)
    while not self._ready.empty():
      self._ready.get_nowait()
    self._end = self._end or _End()

  @property
  def running(self) -> bool:
    return self._thread.is_alive()

  def __enter__(self) -> DevicePrefetch:
    return self

  def __exit__(self, *exc_info) -> None:
    self.close()


_END = object()


def stacker(sharding: jax.sharding.Sharding) -> Callable:
  """k batches of device arrays -> each array stacked [k, b, ...] in
  `sharding` (JaxTrainStep.stacked_sharding), on the devices: batch-size
  control's micro-batches, prefetched one by one."""
  return jax.jit(lambda parts: tuple(jnp.stack(arrays)
                                     for arrays in zip(*parts)),
                 out_shardings=sharding)
