"""host_memory.keep_freed_memory: freed buffers are reused without faults."""
import platform
import subprocess
import sys

import pytest

# Sets M_TRIM_THRESHOLD to 128 KB, which fixes glibc's mmap threshold at its
# 128 KB default as tf.data leaves it, then allocates, frees and re-allocates
# a 16 MB buffer five times and prints the minor page faults of the last four
# rounds.
_PROBE = """
import ctypes, resource, sys
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
if sys.argv[1] == "keep":
  from resnet_tpu.runtime import host_memory
  assert host_memory.keep_freed_memory()
faults = []
for _ in range(5):
  before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
  buffer = libc.malloc(16 << 20)
  ctypes.memset(buffer, 1, 16 << 20)  # touch every page
  libc.free(buffer)
  faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sum(faults[1:]))
"""


def _faults(mode: str) -> int:
  result = subprocess.run([sys.executable, "-c", _PROBE, mode],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stderr
  return int(result.stdout.split()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_buffers_are_reused_without_page_faults():
  pages = 4 * (16 << 20) // 4096  # four re-allocations of 16 MB
  assert _faults("default") > pages // 2  # fresh mmap, faulted page by page
  assert _faults("keep") < pages // 10


# Sets our threshold (or only glibc's mmap threshold, as `keep_freed_memory`
# did before it spent tf.data's patch), then builds a tf.data generator
# dataset, whose kernel sets M_MMAP_THRESHOLD to 128 KB once per process, as
# MirroredStrategy's multi-device input does. Prints how many of 100 blocks of
# 1 MB malloc'ed in a new thread glibc served with their own mmap.
_AFTER_TF_DATA_PROBE = """
import ctypes, sys, threading
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
if sys.argv[1] == "keep":
  from resnet_tpu.runtime import host_memory
  assert host_memory.keep_freed_memory()
else:
  assert libc.mallopt(-3, 32 << 20) == 1  # M_MMAP_THRESHOLD only
import tensorflow as tf
for _ in tf.data.Dataset.from_generator(
    lambda: iter([1]), output_signature=tf.TensorSpec([], tf.int32)):
  pass
mmapped = []
def allocate():
  blocks = [libc.malloc(1 << 20) for _ in range(100)]
  # glibc marks a chunk served by its own mmap with bit 1 of its size field.
  mmapped.append(sum(ctypes.c_size_t.from_address(b - 8).value & 2 == 2
                     for b in blocks))
  for b in blocks:
    libc.free(b)
thread = threading.Thread(target=allocate)
thread.start()
thread.join()
print(mmapped[0])
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_setting_survives_tf_data_generator_datasets():
  def mmapped(mode: str) -> int:
    result = subprocess.run([sys.executable, "-c", _AFTER_TF_DATA_PROBE, mode],
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr
    return int(result.stdout.split()[-1])
  assert mmapped("mallopt_only") > 50  # tf.data reset the threshold
  assert mmapped("keep") == 0
