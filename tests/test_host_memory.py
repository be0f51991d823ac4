"""host_memory.keep_freed_memory: freed buffers are reused without faults."""
import platform
import subprocess
import sys

import pytest

# Sets M_TRIM_THRESHOLD to 128 KB as tf.data does (which also freezes glibc's
# mmap threshold at 128 KB), then allocates, frees and re-allocates a 16 MB
# buffer five times and prints the minor page faults of the last four rounds.
_PROBE = """
import ctypes, resource, sys
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD
if sys.argv[1] == "keep":
  from resnet_tpu import host_memory
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
