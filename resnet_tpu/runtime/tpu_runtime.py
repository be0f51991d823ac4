"""Which TPU runtime TensorFlow starts, chosen before TensorFlow loads.

tensorflow-tpu reaches a TPU through one of two runtimes. v2, v3 and v4
chips run under the StreamExecutor runtime: TensorFlow loads libtpu itself
when it starts. v5e, v5p and v6e (Trillium) chips run under PJRT, which
TensorFlow takes only when three variables are set before it loads:
PJRT_DEVICE=TPU, NEXT_PLUGGABLE_DEVICE_USE_C_API=true and
TF_PLUGGABLE_DEVICE_LIBRARY_PATH=<libtpu.so> (Google's TPU runtime docs;
keras-team/keras-io examples/keras_rs/distributed_embedding_tf.py does this
with tensorflow-tpu 2.19.1 on v5p and v6e). TPU7x (Ironwood) has no
TensorFlow at all.

`choose` reads the generation from TPU_ACCELERATOR_TYPE where it is set
(e.g. "v5litepod-8"), else from the chips' device files: /dev/vfio/N on
v5e, v5p and v6e, /dev/accel* on v2 to v4. `apply` sets the variables for
a TPU run; a variable the user set always wins. This module imports no
TensorFlow.
"""
from collections.abc import Mapping, MutableMapping
import dataclasses
import glob
import importlib.util
import os
import re

from resnet_tpu.config import ConfigError

ACCELERATOR_TYPE_ENV = "TPU_ACCELERATOR_TYPE"
PJRT = "pjrt"
STREAM_EXECUTOR = "stream_executor"
# The TensorFlow runtime of each generation, by TPU_ACCELERATOR_TYPE prefix.
GENERATIONS = (
    ("v2", "v2", STREAM_EXECUTOR),
    ("v3", "v3", STREAM_EXECUTOR),
    ("v4", "v4", STREAM_EXECUTOR),
    ("v5litepod", "v5e", PJRT),
    ("v5e", "v5e", PJRT),
    ("v5p", "v5p", PJRT),
    ("v6e", "v6e", PJRT),
    ("tpu7x", "tpu7x", None),
    ("v7", "tpu7x", None),
)
NO_TENSORFLOW = ("TPU7x (Ironwood) has no TensorFlow: tensorflow-tpu 2.19.1 "
                 "is the last TensorFlow built for TPUs. Use JAX there.")


@dataclasses.dataclass(frozen=True)
class Choice:
  """The runtime TensorFlow should start, the generation it was chosen
  for (None: unknown) and what the choice rests on."""
  runtime: str
  generation: str | None
  reason: str


def generation_of(accelerator_type: str) -> tuple[str, str | None] | None:
  """('v5e', 'pjrt') for 'v5litepod-8'; None for a type not listed."""
  name = accelerator_type.strip().lower()
  for prefix, generation, runtime in GENERATIONS:
    if re.match(rf"{prefix}(-|$)", name):
      return generation, runtime
  return None


def chip_files(dev_root: str = "/dev") -> dict[str, list[str]]:
  """The TPU chips' device files: {'vfio': [...], 'accel': [...]}."""
  return {"vfio": sorted(glob.glob(os.path.join(dev_root, "vfio", "[0-9]*"))),
          "accel": sorted(glob.glob(os.path.join(dev_root, "accel*")))}


def choose(flag: str = "auto", environ: Mapping[str, str] = os.environ,
           dev_root: str = "/dev") -> Choice:
  """The runtime of --tpu_runtime=`flag` on this host.

  Raises ConfigError on a TPU7x host, which TensorFlow cannot drive.
  """
  accelerator_type = environ.get(ACCELERATOR_TYPE_ENV, "")
  known = generation_of(accelerator_type) if accelerator_type else None
  generation = known[0] if known else None
  if generation == "tpu7x":
    raise ConfigError(f"{ACCELERATOR_TYPE_ENV}={accelerator_type}: "
                      f"{NO_TENSORFLOW}")
  if flag != "auto":
    return Choice(flag, generation, f"--tpu_runtime={flag}")
  if known:
    return Choice(known[1], generation,
                  f"{ACCELERATOR_TYPE_ENV}={accelerator_type}")
  files = chip_files(dev_root)
  if files["vfio"]:
    return Choice(PJRT, "v5e/v5p/v6e",
                  f"{len(files['vfio'])} chip(s) under {dev_root}/vfio")
  if files["accel"]:
    return Choice(STREAM_EXECUTOR, "v2-v4",
                  f"{len(files['accel'])} chip(s) at {dev_root}/accel*")
  return Choice(STREAM_EXECUTOR, None,
                f"no {ACCELERATOR_TYPE_ENV}, and no chip under "
                f"{dev_root}/vfio or at {dev_root}/accel*")


def libtpu_path() -> str | None:
  """libtpu.so of the installed libtpu package, found without importing
  it; None when libtpu is not installed."""
  spec = importlib.util.find_spec("libtpu")
  if spec is None or not spec.submodule_search_locations:
    return None
  return os.path.join(list(spec.submodule_search_locations)[0], "libtpu.so")


def pjrt_variables(library: str) -> dict[str, str]:
  """The variables that make TensorFlow start TPUs under PJRT."""
  return {"PJRT_DEVICE": "TPU", "NEXT_PLUGGABLE_DEVICE_USE_C_API": "true",
          "TF_PLUGGABLE_DEVICE_LIBRARY_PATH": library}


def apply(flag: str, kind: str,
          environ: MutableMapping[str, str] = os.environ,
          dev_root: str = "/dev", library: str | None = None) -> str:
  """Chooses the runtime of a `kind` run and sets its variables; returns
  one line saying what it chose and why ('' when `kind` is not tpu).

  `library`: libtpu.so (None: the installed libtpu package's).
  """
  if kind != "tpu":
    return ""
  choice = choose(flag, environ, dev_root)
  said = (f"TPU runtime {choice.runtime} for "
          f"{choice.generation or 'an unknown generation'} ({choice.reason})")
  if choice.runtime != PJRT:
    return said
  library = (environ.get("TF_PLUGGABLE_DEVICE_LIBRARY_PATH") or library
             or libtpu_path())
  if library is None:
    raise ConfigError(f"{said} needs libtpu, which is not installed: "
                      "pip install -r requirements/tpu-vm-tensorflow.txt")
  values = pjrt_variables(library)
  kept = [k for k in values if k in environ and environ[k] != values[k]]
  for name, value in values.items():
    environ.setdefault(name, value)
  return said + ": " + ", ".join(f"{k}={environ[k]}" for k in values) + (
      f" ({', '.join(kept)} set by the user)" if kept else "")
