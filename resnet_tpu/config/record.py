"""The record of a run: config.json (every flag's value, written when a
run starts), what a resumed run may change, and reading it back for the
export, evaluation and fine-tuning."""
import json
import os

from resnet_tpu import files
from resnet_tpu.config.parts import ConfigError
from resnet_tpu.config.parts import TrainConfig


CONFIG_FILE = "config.json"
# The config.json keys that rebuild the network and its inputs. Flags newer
# than a record (--resnet_layout, --conv_init, ...) had their defaults when
# it was written, so they are not required of it.
MODEL_KEYS = ("resnet_depth", "num_classes", "image_size", "bn_group_size",
              "bn_momentum", "bn_epsilon", "precision", "label_offset")


# config.json's list of the changes deliberate resumes made.
CHANGES_KEY = "config_changes"
# Flags a resumed run may change without --allow_config_change: where the
# files are and how the run is executed, never what it computes
# (preflight.check_resume compares every other flag with config.json).
FREE_ON_RESUME = frozenset({
    "model_dir", "data_dir", "cache_dataset", "private_threadpool_size",
    "parallel_interleave", "parallel_map", "fused_decode_crop", "prefetch",
    "deterministic_input", "input_dtype", "on_corrupt_shard",
    "bfloat16_conv_kernels", "strategy", "tpu", "num_cpu_replicas",
    "bn_all_reduce", "gradient_all_reduce", "all_reduce_grid",
    "tpu_device_assignment", "tpu_runtime", "log_topology",
    "keep_host_memory", "collective_timeout_s", "cpu_onednn",
    "coordinator_address", "num_processes", "process_id", "eval_batch_size",
    "num_eval_images", "steps_per_loop", "eval_every_steps",
    "checkpoint_every_steps", "checkpoint_every_minutes", "max_loop_seconds",
    "keep_checkpoints", "export_dir", "skip_nonfinite_steps",
    "allow_config_change", "profile_steps", "init_checkpoint",
    "jax_compilation_cache_dir"})


def allowed_changes(cfg: TrainConfig) -> list[str]:
  """The flag names of --allow_config_change."""
  return [n.strip().lstrip("-") for n in
          cfg.run.allow_config_change.split(",") if n.strip()]



def write_config(cfg: TrainConfig, labels_file: str = "",
                 changes: dict | None = None) -> str:
  """Writes `<model_dir>/config.json`: every flag's value + labels_file.

  The export and evaluation tools rebuild the network from it. A resumed
  run that changed flags deliberately (--allow_config_change) passes
  `changes`, flag -> [value before, value now]: they are appended to the
  record's `config_changes`, which keeps every earlier change.
  """
  path = os.path.join(cfg.model_dir, CONFIG_FILE)
  history = []
  if files.exists(path):
    with files.open_file(path) as f:
      history = json.load(f).get(CHANGES_KEY, [])
  if changes:
    history.append({"changed": changes})
  record = dict(cfg.flat(), labels_file=labels_file)
  if history:
    record[CHANGES_KEY] = history
  files.makedirs(cfg.model_dir)
  with files.open_file(path, "w") as f:
    f.write(json.dumps(record, indent=2, sort_keys=True) + "\n")
  return path


def read_config(model_dir: str) -> dict:
  """The config.json of a run; ConfigError if it is missing or incomplete."""
  path = os.path.join(model_dir, CONFIG_FILE)
  if not files.exists(path):
    raise ConfigError(f"--model_dir={model_dir!r} has no {CONFIG_FILE}; it "
                      "is written when a training run (main.py) starts.")
  with files.open_file(path) as f:
    record = json.load(f)
  missing = [k for k in MODEL_KEYS if k not in record]
  if missing:
    raise ConfigError(f"{path} lacks the keys {missing}.")
  return record
