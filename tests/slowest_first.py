"""Both suites' slowest test files, run first, so that both pytest-xdist
workers stay busy to the end (longest processing time first).

`--dist loadfile` hands each worker whole files; by default the files with
the most tests go first, and the slowest files hold few tests (a run of
several processes, the demo on both engines), so they went last and one
worker ran on alone: 897 s against 717 s for the JAX suite, replaying each
test's measured seconds through xdist's scheduler. The Makefile passes
--no-loadscope-reorder, so xdist keeps this order. Each file's seconds: its
tests' total in pytest --durations=0 on 2 cores (2026-12-06, 810d942).
"""
import pytest

TENSORFLOW_SUITE = (
    "tests/test_demo_on_both_engines.py",  # 380 s
    "tests/test_accelerator_check.py",  # 122 s
    "tests/test_flagfiles.py",  # 87 s
    "tests/test_float16.py",  # 79 s
    "tests/test_multi_worker_failure.py",  # 78 s
    "tests/test_main.py",  # 71 s
    "tests/test_multi_worker.py",  # 55 s
    "tests/test_keras_weights.py",  # 51 s
    "tests/test_input_pipeline.py",  # 51 s
    "tests/test_doc_shell_blocks.py",  # 51 s
)
JAX_SUITE = (
    "tests_jax/test_engines.py",  # 333 s: the TensorFlow reference, 225 s
    "tests_jax/test_multi_host.py",  # 307 s
    "tests_jax/test_jax_engine.py",  # 173 s
    "tests_jax/test_bench_gpu.py",  # 136 s
    "tests_jax/test_without_tensorflow.py",  # 125 s
    "tests_jax/test_multi_host_failure.py",  # 111 s
    "tests_jax/test_training.py",  # 97 s
)


def order(items: list[pytest.Item], slowest: tuple[str, ...]) -> None:
  """Sorts `items` in place: the files of `slowest` (paths from the
  repository's root) first, in that order, then the rest as collected."""
  rank = {path: i for i, path in enumerate(slowest)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0],
                                       len(rank)))
