"""Keep freed host memory mapped, so CPU training steps do not page-fault.

A training step allocates and frees the same activation and gradient buffers
every step. glibc serves blocks above its mmap threshold with fresh mmaps
and trims the heap top above M_TRIM_THRESHOLD; tf.data fixes the mmap
threshold at 128 KB (below), which also stops both thresholds from growing,
so every step faults its buffers in again, page by page, and the kernel
zeroes each page: `perf` on a float32 ResNet-50 step
(`python -m lab.dev.profile_step`) puts a large share of the cycles in the
kernel's page-fault path (exc_page_fault, clear_page_erms).
bench_results/REPORT.md ("Host memory") gives the step with and without this
module.

`keep_freed_memory` sets, with mallopt, a fixed 32 MB mmap threshold (larger
blocks still get their own mapping) and a 512 MB top pad (the heap keeps that
much above its top when trimming), so freed buffers are reused without
faults. The cost is resident memory that is not given back to the OS. Only
glibc has mallopt; elsewhere this does nothing and says so. It matters for
CPU training; accelerator memory is not affected.

tf.data's GeneratorDataset kernel, the first time one is built in a process,
sets M_MMAP_THRESHOLD back to 128 KB (TensorFlow's Python 3.11 memory patch).
MirroredStrategy builds one for every multi-device input iterator, after any
setting made at start-up: on 8 virtual CPU replicas the page faults come
back, since the replicas' threads allocate from glibc's per-thread arenas,
which fall back to mmap for every block above the threshold.
`keep_freed_memory` therefore builds one generator dataset first, so
TensorFlow's setting is spent and ours comes last.
"""
import ctypes
import ctypes.util
import functools
import platform

from absl import logging

# glibc's mallopt parameter numbers (malloc.h).
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest dynamic threshold
TOP_PAD_BYTES = 512 << 20
# glibc's settings once tf.data has set M_MMAP_THRESHOLD to 128 KB (the top
# pad default is 128 KB).
GLIBC_AFTER_TF_DATA = (128 << 10, 128 << 10)


def keep_freed_memory(mmap_threshold_bytes: int = MMAP_THRESHOLD_BYTES,
                      top_pad_bytes: int = TOP_PAD_BYTES) -> bool:
  """Applies the mallopt settings above; True if glibc accepted them.

  Starts TensorFlow's runtime (see `_spend_tf_data_malloc_patch`): call it
  once devices are configured, e.g. after the strategy is created.
  """
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    logging.info("host memory: not glibc, allocator left as it is")
    return False
  _spend_tf_data_malloc_patch()
  libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  accepted = (libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold_bytes) == 1 and
              libc.mallopt(M_TOP_PAD, top_pad_bytes) == 1)
  logging.info("host memory: mmap threshold %d KB, top pad %d KB (%s)",
               mmap_threshold_bytes >> 10, top_pad_bytes >> 10,
               "set" if accepted else "REJECTED by mallopt")
  return accepted


@functools.cache  # TensorFlow's patch runs once per process; so does this
def _spend_tf_data_malloc_patch() -> None:
  """Builds one tf.data generator dataset, so that TensorFlow's once-per-
  process mallopt (in the GeneratorDataset kernel) runs now, not later."""
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  dataset = tf.data.Dataset.from_generator(
      lambda: iter(()), output_signature=tf.TensorSpec([], tf.int8))
  for _ in dataset:
    pass
