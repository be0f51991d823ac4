"""Following the config through one run: the stops it makes, module by module.

  python -m lab.dev.cfg_walk --data_dir=demo_data/tfrecords  # make demo's

Traces one tiny run of resnet_tpu.run.run (TrainConfig.tiny: 2 CPU
replicas, 2 steps; synthetic data without --data_dir) and lists, in call
order, the package's functions that receive the TrainConfig, or one of its
parts, as an argument. Calls
in a row within one module are one stop; a stop in a module already left
is a return. The config's own methods and properties (resnet_tpu.config
with `self` the config) are reading it, not a stop. Two walks: the whole
config, and the config or any of its parts (the stages take their part).
"""
import dataclasses
import sys
import tempfile
from typing import Callable

from absl import app
from absl import flags

_DATA_DIR = flags.DEFINE_string("data_dir", "", "TFRecords of a tiny run "
                                "(10 classes); '' = synthetic data.")

PACKAGE = "resnet_tpu"


def _receives(frame, kinds: tuple[type, ...]) -> bool:
  """Whether the called function has an argument of one of `kinds`."""
  code = frame.f_code
  names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
  if (frame.f_globals.get("__name__") == f"{PACKAGE}.config" and names
      and names[0] == "self"):
    return False
  return any(isinstance(frame.f_locals.get(n), kinds) for n in names)


def walk(fn: Callable[[], object], kinds: tuple[type, ...]) -> list[str]:
  """The modules of the stops of `kinds` while `fn` runs, in order."""
  stops: list[str] = []

  def tracer(frame, event, arg):
    del arg
    if event == "call":
      module = frame.f_globals.get("__name__", "")
      if module.startswith(PACKAGE + ".") and _receives(frame, kinds):
        if not stops or stops[-1] != module:
          stops.append(module)

  sys.settrace(tracer)
  try:
    fn()
  finally:
    sys.settrace(None)
  return stops


def summary(stops: list[str]) -> dict:
  """Stops, distinct modules, and returns to a module already left."""
  return {"stops": len(stops), "modules": len(set(stops)),
          "returns": len(stops) - len(set(stops))}


def part_types(config_type: type) -> tuple[type, ...]:
  """The config's fields that are dataclasses themselves (its parts)."""
  return tuple(f.type for f in dataclasses.fields(config_type)
               if isinstance(f.type, type) and dataclasses.is_dataclass(f.type))


def main(argv: list[str]) -> None:
  del argv
  # TensorFlow loads after absl has parsed the flags.
  from resnet_tpu import run as run_lib  # pylint: disable=g-import-not-at-top
  from resnet_tpu import config as config_lib  # pylint: disable=g-import-not-at-top,line-too-long
  TrainConfig = config_lib.TrainConfig  # pylint: disable=invalid-name
  for name, kinds in (("the whole config", (TrainConfig,)),
                      ("the config or a part",
                       (TrainConfig,) + part_types(TrainConfig))):
    with tempfile.TemporaryDirectory() as model_dir:
      cfg = TrainConfig.tiny(model_dir, data_dir=_DATA_DIR.value,
                             use_synthetic_data=not _DATA_DIR.value,
                             num_eval_images=8)
      stops = walk(lambda c=cfg: run_lib.run(c), kinds)
    print(f"{name}: {summary(stops)}")
    print("  " + " -> ".join(m[len(PACKAGE) + 1:] for m in stops))


if __name__ == "__main__":
  app.run(main)
