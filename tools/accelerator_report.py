"""Runs the rows of tools/accelerator_check.py on a strategy and reports.

A row passes, fails or is skipped: a check that cannot compare anything on
this machine (grouped BN or N-vs-one replicas on a one-chip slice) says
"skipped: one replica", never "pass". The JSON report describes the run
on its own: versions, TPU runtime and generation, chips, devices, and on
GPUs the compute capability and whether TensorFlow ships native code for
it.
"""
import dataclasses
import os
import time

from absl import logging
import numpy as np
import tensorflow as tf

from resnet_tpu.runtime import device_check
from tools import accelerator_rows as checks
from tools import bench_common

FULL = checks.Sizes(depth=50, image_size=224, batch=128, steps=20,
                    repetitions=3)
TINY = checks.Sizes(depth=18, image_size=32, batch=2, steps=2,
                    repetitions=2, small_equivalence_model=True,
                    run_xla=False)
DEVICE_TYPES = {"tpu": "TPU", "gpu": "GPU", "cpu": "CPU"}


def one_device_strategy(strategy: tf.distribute.Strategy,
                        kind: str) -> tf.distribute.Strategy:
  """One replica on the first device of `strategy` (for xla_compile)."""
  device = strategy.extended.worker_devices[0]
  if kind == "tpu":
    return tf.distribute.OneDeviceStrategy(device)
  return tf.distribute.MirroredStrategy([device])


def topology_summary(topology: tf.tpu.experimental.Topology | None) -> dict:
  """Hosts, cores and chips of the slice, from the Topology that
  initialize_tpu_system returned (None: not a TPU run)."""
  if topology is None:
    return {}
  cores = np.asarray(topology.device_coordinates).reshape(-1, 4)
  return {"num_hosts": int(topology.num_tasks),
          "cores_per_host": int(topology.num_tpus_per_task),
          "num_cores": len(cores),
          "num_chips": len({tuple(core[:3]) for core in cores}),
          "mesh_shape": [int(m) for m in topology.mesh_shape]}


def chips(kind: str, strategy: tf.distribute.Strategy,
          topology: dict) -> int | None:
  """Physical chips under the replicas: one per GPU, the host for CPU
  replicas, a TPU slice's from its Topology; None if unknown."""
  if kind == "gpu":
    return strategy.num_replicas_in_sync
  if kind == "cpu":
    return 1
  return topology.get("num_chips")


def gpu_native_code(capability: tuple[int, int],
                    build_arches: list[str]) -> str | None:
  """A warning when TensorFlow has no native code (sm_XY) for a GPU of
  `capability`; None when it has."""
  number = capability[0] * 10 + capability[1]
  if f"sm_{number}" in build_arches:
    return None
  if capability[0] >= 10:
    return (f"sm_{number} (Blackwell) is not supported by TensorFlow "
            f"{tf.__version__}'s wheels (tensorflow/tensorflow#89272)")
  ptx = [int(a.split("_")[1]) for a in build_arches
         if a.startswith("compute_") and a.split("_")[1].isdigit()]
  usable = [p for p in ptx if p <= number]
  return (f"TensorFlow {tf.__version__} has no native code for sm_{number} "
          f"(built for {', '.join(build_arches)}): "
          + (f"its kernels are JIT-compiled from compute_{max(usable)} PTX "
             "at first start (minutes; keep the cache: "
             "CUDA_CACHE_MAXSIZE=4294967296)" if usable
             else "this GPU is not supported by this build"))


def gpu_summary() -> dict:
  """Each GPU's name and compute capability, and what TensorFlow's build
  says of it (a warning is logged where it has no native code)."""
  arches = tf.sysconfig.get_build_info().get("cuda_compute_capabilities", [])
  found = []
  for gpu in tf.config.list_physical_devices("GPU"):
    details = tf.config.experimental.get_device_details(gpu)
    capability = tuple(details.get("compute_capability", (0, 0)))
    warning = gpu_native_code(capability, list(arches))
    if warning:
      logging.warning("%s: %s", details.get("device_name", gpu.name), warning)
    found.append({"name": details.get("device_name"),
                  "compute_capability": list(capability),
                  "native_code": warning is None, "warning": warning})
  return {"build_arches": list(arches), "gpus": found}


def devices(kind: str, strategy: tf.distribute.Strategy) -> checks.Check:
  """One replica per device of the kind asked for."""
  names = strategy.extended.worker_devices
  wanted = DEVICE_TYPES[kind]
  on_kind = [n for n in names if f"{wanted}:" in n.upper()]
  passed = len(names) == strategy.num_replicas_in_sync == len(on_kind)
  return checks.Check(
      "devices", passed,
      f"{strategy.num_replicas_in_sync} replicas ({kind}) on "
      f"{', '.join(n.split('/')[-1] for n in names)}"
      + ("" if passed else f"; {len(on_kind)} of them on a {wanted}"),
      {"replicas": strategy.num_replicas_in_sync, "worker_devices": names})


def run_checks(kind: str, strategy: tf.distribute.Strategy,
               sizes: checks.Sizes, tmp: str, topology: dict,
               min_ratio: float) -> list[checks.Check]:
  """Every check, in order; one that raises is a failed row.

  `min_ratio`: the throughput row's floor, ours/Keras images/s.
  """
  precision = "float32" if kind == "cpu" else "bfloat16"
  rows = [devices(kind, strategy)]
  steps = {
      "group_bn": lambda: checks.group_bn(strategy, sizes),
      "replicas_equal_one_device": lambda: checks.replicas_equal_one_device(
          strategy, sizes, tmp),
      "bfloat16_step": lambda: checks.bfloat16_step(strategy, sizes, tmp),
      "xla_compile": lambda: checks.xla_step(
          one_device_strategy(strategy, kind), sizes, tmp, precision),
      "throughput": lambda: checks.throughput(
          strategy, sizes, tmp, precision, chips(kind, strategy, topology),
          min_ratio),
  }
  for name, check in steps.items():
    logging.info("Check %s ...", name)
    start = time.perf_counter()
    try:
      rows.append(check())
    except Exception as e:  # pylint: disable=broad-except
      logging.error("Check %s raised", name, exc_info=True)
      rows.append(checks.Check(name, False,
                               f"{type(e).__name__}: {_first_line(e)}"))
    row = rows[-1]
    row.measured["seconds"] = time.perf_counter() - start
    logging.info("Check %s %s in %.1f s: %s", name, row.result,
                 row.measured["seconds"], row.detail)
  return rows


def _first_line(e: Exception) -> str:
  text = str(e).strip()
  return text.splitlines()[0] if text else ""


def table(rows: list[checks.Check]) -> str:
  width = max(len(r.name) for r in rows)
  lines = [f"{'check':<{width}}  result  measured"]
  lines += [f"{r.name:<{width}}  {r.result:<6}  {r.detail}" for r in rows]
  return "\n".join(lines)


def report(kind: str, strategy: tf.distribute.Strategy, sizes: checks.Sizes,
           topology: dict, rows: list[checks.Check],
           runtime: dict | None = None, gpus: dict | None = None) -> dict:
  """The JSON of a run: passed unless a row failed (skipped rows do not
  fail it). `runtime`: the TPU runtime chosen; `gpus`: gpu_summary()."""
  return {"passed": not any(r.result == "FAIL" for r in rows),
          "strategy": kind, "replicas": strategy.num_replicas_in_sync,
          "chips": chips(kind, strategy, topology),
          "tpu_runtime": runtime, "versions": device_check.versions(),
          "devices": list(strategy.extended.worker_devices),
          "topology": topology or None,
          "gpu": gpus,
          "sizes": dataclasses.asdict(sizes),
          "machine": bench_common.machine(),
          "environment": {k: os.environ[k] for k in (
              "PJRT_DEVICE", "TPU_ACCELERATOR_TYPE", "TPU_LOAD_LIBRARY")
                          if k in os.environ},
          "checks": {r.name: {"result": r.result, "detail": r.detail,
                              **r.measured} for r in rows}}
