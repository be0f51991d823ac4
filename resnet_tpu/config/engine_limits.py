"""Each engine's limits, checked with the rest of the config (checks.py):
what the JAX engine refuses, as a table; what a JAX run without TensorFlow
cannot do; and the flags of JAX's processes."""
from resnet_tpu import files
from resnet_tpu.config.parts import DistributionConfig
from resnet_tpu.config.parts import require
from resnet_tpu.config.parts import TrainConfig


def check(cfg: TrainConfig) -> None:
  """Raises ConfigError naming the first flag the engine cannot run."""
  _check_processes(cfg.distribution)
  if cfg.distribution.backend == "jax":
    _check_jax_flags(cfg)
    if not files.tensorflow_installed():
      _check_without_tensorflow(cfg)


# What the JAX engine does not have yet (issue 49): flag, whether a value
# is refused, and why; the first refused is named. docs/jax.md
# lists the same.
JAX_UNSUPPORTED = (
    ("gradient_all_reduce", lambda v: v != "auto", "JAX sums gradients "
     "with one psum (XLA's all-reduce); use auto"),
    ("bn_all_reduce", lambda v: v != "auto", "JAX sums BN statistics with "
     "a psum over the group's mesh axis; use auto"),
    ("all_reduce_grid", bool, "it shapes TensorFlow's 2-D all-reduces"),
    ("tpu", lambda v: v not in ("", "local"), "JAX uses this host's own "
     "chips: --tpu=local or none"),
)


def _check_processes(dist: DistributionConfig) -> None:
  """--coordinator_address, --num_processes and --process_id: a JAX
  multi_worker run's, all three or none."""
  given = [f"--{name}" for name, unset in (
      ("coordinator_address", ""), ("num_processes", 0), ("process_id", -1))
           if getattr(dist, name) != unset]
  if not given:
    return
  require(dist.backend == "jax" and dist.strategy == "multi_worker",
         f"{', '.join(given)}: for --backend=jax --strategy=multi_worker "
         "(jax.distributed); TensorFlow's workers come from TF_CONFIG.")
  require(len(given) == 3,
         f"{', '.join(given)} given alone: set all three of "
         "--coordinator_address=HOST:PORT, --num_processes and --process_id, "
         "or none (JAX then detects its cluster: Cloud TPU, SLURM, Open "
         "MPI, Kubernetes).")
  require(dist.num_processes >= 1 and 0 <= dist.process_id
         < dist.num_processes,
         f"--process_id={dist.process_id} must be in [0, --num_processes="
         f"{dist.num_processes}).")
  require(dist.coordinator_address.rpartition(":")[2].isdigit(),
         "--coordinator_address must be HOST:PORT (process 0's address), "
         f"got {dist.coordinator_address!r}.")


def _check_jax_flags(cfg: TrainConfig) -> None:
  """Names the first flag the JAX engine does not support."""
  values = cfg.flat()
  for name, refused, why in JAX_UNSUPPORTED:
    require(not refused(values[name]), f"--{name}={values[name]} is not "
           f"supported with --backend=jax: {why}. Use --backend=tensorflow "
           "for it.")


def _check_without_tensorflow(cfg: TrainConfig) -> None:
  """A JAX run where TensorFlow is not installed trains on the synthetic
  input and writes a local model_dir (files.py); the TFRecords, the
  SavedModel and a fine-tuning source are TensorFlow's formats."""
  install = ("TensorFlow, which is not installed here: pip install "
             "tensorflow-cpu==2.21.0 beside JAX (requirements/gpu-jax.txt "
             "and tpu-vm-jax.txt have it)")
  require(cfg.input.use_synthetic_data,
         f"--data_dir={cfg.input.data_dir!r}: reading TFRecords needs "
         f"{install}, or train on --use_synthetic_data.")
  require(not cfg.run.export_dir,
         f"--export_dir={cfg.run.export_dir!r}: the SavedModel is written "
         f"by {install}, or leave --export_dir unset and export the "
         "checkpoints later where TensorFlow is (tools/export_savedmodel.py).")
  require(not cfg.run.init_checkpoint,
         f"--init_checkpoint={cfg.run.init_checkpoint!r}: it is read by "
         f"{install}.")
  require(not files.is_remote(cfg.model_dir),
         f"--model_dir={cfg.model_dir!r}: without TensorFlow's file "
         "systems a JAX run writes local paths only; use a local folder, or "
         "install TensorFlow beside JAX (pip install tensorflow-cpu==2.21.0).")
