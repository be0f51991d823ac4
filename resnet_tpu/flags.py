"""absl flag definitions: one flag per TrainConfig field, same flat name.

Defaults come from the config's parts (config.FLAG_FIELDS), so the two
cannot drift apart. Only main.py parses flags; `config_from_flags` turns the
parsed values into a TrainConfig.
"""
from absl import flags

from resnet_tpu.config import CHOICES
from resnet_tpu.config import FLAG_FIELDS
from resnet_tpu.config import OPTIMIZERS
from resnet_tpu.config import SCHEDULES
from resnet_tpu.config import TrainConfig

HELP = {
    "model_dir": "Where checkpoints, TensorBoard logs and metrics.jsonl go.",
    "data_dir": "Folder (or gs:// path) of train-*/validation-* TFRecords in "
                "the imagenet_to_gcs format.",
    "use_synthetic_data": "Feed a constant random batch: measures the model "
                          "without any input pipeline.",
    "resnet_depth": "ResNet depth: 18, 34, 50, 101, 152 or 200.",
    "resnet_layout": "v1.5 (Goyal et al.: stride on the 3x3 conv, stem pool "
                     "padded SAME as tensorflow/tpu) or keras_v1 (keras."
                     "applications.ResNet50's network, for its converted "
                     "weights: tools/convert_keras_weights.py).",
    "conv_init": "Conv kernel init: fan_in (variance 1/fan_in, tensorflow/"
                 "tpu's) or he_normal (2/fan_in, Keras's usual choice).",
    "zero_init_gamma": "Start each residual block's last BN with gamma 0 "
                       "(Goyal et al. §5.1), so each block starts as the "
                       "identity.",
    "input_normalization": "Inside the network: imagenet (ImageNet mean/std "
                           "per channel), unit (pixels / 255, as a stock "
                           "Keras model) or caffe (keras.applications' "
                           "ResNet: Caffe means subtracted, unscaled).",
    "num_classes": "Number of classes (1000 for ImageNet).",
    "image_size": "Training and eval image side in pixels.",
    "precision": "float32, bfloat16 (convs/activations in bfloat16; BN "
                 "statistics and logits in float32) or float16 (the same "
                 "in float16 with dynamic loss scaling, for GPUs without "
                 "fast bfloat16 such as V100 and T4).",
    "bfloat16_conv_kernels": "Kernels of the bfloat16 convs: native "
                             "(TensorFlow's bfloat16 kernels), float32 "
                             "(bfloat16 operands widened, float32 sums, "
                             "bfloat16 output) or auto (float32 on CPUs "
                             "without AVX512-BF16/AMX, else native).",
    "bn_group_size": "Replicas whose batch statistics are pooled by "
                     "distributed BN (Ying et al. §3.1); 1 = local BN.",
    "bn_momentum": "Moving-average momentum of the BN statistics.",
    "bn_epsilon": "BN variance epsilon.",
    "bn_stats": "moving_average, or recompute: before each eval and "
                "checkpoint, set BN statistics to the exact mean/variance of "
                "--bn_recompute_batches training batches (Akiba et al.).",
    "bn_recompute_batches": "Training batches for --bn_stats=recompute.",
    "freeze_bn": "Fine-tuning: every BN layer keeps the --init_checkpoint "
                 "network's statistics, scale and offset (inference mode, "
                 "as Keras's transfer-learning guide).",
    "bn_all_reduce": "How distributed BN sums statistics: auto (TPU "
                     "CrossReplicaSum / subgroup collectives), collective, "
                     "or masked (full all-reduce of a one-hot buffer).",
    "backend": "Keras's engine: tensorflow, jax, or auto ($KERAS_BACKEND, "
               "else tensorflow). docs/jax.md lists what "
               "the jax engine runs and how it differs.",
    "strategy": "auto, tpu, gpu, cpu (virtual CPU replicas) or multi_worker "
                "(TensorFlow: MultiWorkerMirroredStrategy from TF_CONFIG; "
                "JAX: one process per host, jax.distributed).",
    "tpu": "TPU name or 'local' on a TPU VM; implies --strategy=tpu.",
    "num_cpu_replicas": "Virtual CPU replicas for --strategy=cpu.",
    "gradient_all_reduce": "auto (Keras/XLA summation), ring (one "
                           "collective over the flattened gradients), 2d "
                           "(Mikami et al.'s 2D-Torus over "
                           "--all_reduce_grid: reduce-scatter rows, "
                           "all-reduce columns, all-gather rows) or 2d_ying "
                           "(Ying et al. §3.3: two halves, one rows first "
                           "and one columns first, at once); GPU/CPU only.",
    "all_reduce_grid": "XxY grid for --gradient_all_reduce=2d or 2d_ying: X "
                       "replicas per row, Y rows; '' = squarest.",
    "tpu_device_assignment": "TPU replica placement: default "
                             "(TensorFlow's own device assignment) or ring "
                             "(a snake through the torus, BN groups on "
                             "compact tiles; resnet_tpu/parallel/topology.py). "
                             "Either way BN groups are compact tiles of the "
                             "placement in use.",
    "tpu_runtime": "TPU runtime: auto (PJRT on v5e, v5p and v6e, "
                   "StreamExecutor on v2-v4, from TPU_ACCELERATOR_TYPE or the "
                   "chips' device files), pjrt or stream_executor "
                   "(resnet_tpu/runtime/tpu_runtime.py).",
    "log_topology": "Log the TPU replica order and BN tiles at start-up.",
    "global_batch_size": "Images per training step over all replicas (the "
                         "micro-batch when --batch_size_schedule is set).",
    "eval_batch_size": "Images per eval step over all replicas.",
    "train_steps": "Training steps; overrides --train_epochs when > 0.",
    "train_epochs": "Training epochs of --num_train_images images.",
    "num_train_images": "Images in one training epoch; 0 = from the data: "
                        "manifest.json, else 1281167 for ImageNet's 1024 "
                        "train files, else a count of the records.",
    "num_eval_images": "Validation images; 0 = count the records.",
    "steps_per_loop": "Training steps per host call (TPU host loop).",
    "eval_every_steps": "Evaluate every N steps; 0 = only at the end.",
    "checkpoint_every_steps": "Checkpoint every N steps; 0 = at each eval.",
    "max_loop_seconds": "Cap each host loop at about this many seconds "
                        "(from the last loop's pace; the first runs one "
                        "step), so SIGTERM is answered within that and a "
                        "save: for spot machines with a grace period. "
                        "0 = --steps_per_loop alone. One host only.",
    "checkpoint_every_minutes": "Also checkpoint once this many minutes "
                                "have passed since the last save, after the "
                                "host loop in flight; 0 = off.",
    "keep_checkpoints": "Checkpoints kept in --model_dir.",
    "batch_size_schedule": "Batch-size control (Mikami et al.): "
                           "'start_epoch:global_batch,...', each batch a "
                           "multiple of --global_batch_size (accumulated).",
    "optimizer": f"One of {OPTIMIZERS}.",
    "base_learning_rate": "LR per 256 images (linear scaling rule), or the "
                          "absolute LR with --learning_rate_scaling=none.",
    "lr_schedule": f"Decay after warm-up, in epochs: one of {SCHEDULES}.",
    "warmup_epochs": "Linear LR warm-up from 0, in epochs.",
    "lr_decay_power": "Power of the polynomial decay.",
    "end_learning_rate": "Absolute LR that --lr_schedule=polynomial decays "
                         "to (tensorflow/tpu and MLPerf: 1e-4).",
    "learning_rate_scaling": "linear: the LR is --base_learning_rate x "
                             "global batch / 256 at every step (Goyal et "
                             "al.), so it changes with --batch_size_schedule;"
                             " none: --base_learning_rate is the absolute "
                             "peak LR at every batch size.",
    "momentum": "Momentum of SGD, LARS and RMSprop warm-up.",
    "nesterov": "Nesterov momentum (momentum and lars).",
    "momentum_correction": "--optimizer=momentum with the LR outside the "
                           "velocity (u <- m u + g; w <- w - lr u): Goyal "
                           "et al.'s momentum correction, tensorflow/tpu's "
                           "tf.train.MomentumOptimizer. Default: Keras's "
                           "SGD, the LR inside the velocity.",
    "lars_eta": "LARS trust coefficient.",
    "lars_epsilon": "Added to the LARS trust-ratio denominator.",
    "rmsprop_learning_rate": "LR of the RMSprop part of rmsprop_warmup.",
    "rmsprop_warmup_center_epochs": "Epoch where RMSprop warm-up is about half "
                                    "SGD.",
    "rmsprop_warmup_period_epochs": "Pure momentum SGD from center + "
                                    "period/2 epochs on.",
    "label_smoothing": "Label smoothing of the cross-entropy.",
    "weight_decay": "L2 weight decay of conv/dense kernels (inside the "
                    "update for LARS).",
    "seed": "Random seed of initialisation and input order.",
    "skip_nonfinite_steps": "Skip (do not apply, do not count) a step whose "
                            "loss or gradients are NaN/Inf on any replica, "
                            "instead of stopping with an error.",
    "label_offset": "Subtracted from stored labels (imagenet_to_gcs: 1).",
    "cache_dataset": "Cache the raw training records in memory.",
    "shuffle_buffer_size": "Training shuffle buffer, in records.",
    "private_threadpool_size": "tf.data private thread pool; 0 = default.",
    "parallel_interleave": "Read TFRecord files in parallel.",
    "parallel_map": "Parse and decode records in parallel.",
    "fused_decode_crop": "Decode only the crop window of each JPEG.",
    "prefetch": "Prefetch batches to overlap input and training.",
    "deterministic_input": "Deterministic input order (slower).",
    "input_dtype": "Image batches handed to the replicas: uint8 (a quarter "
                   "of float32's bytes to batch on the host and to move to "
                   "the device; the model casts on the device) or compute "
                   "(cast to the --precision compute dtype on the host).",
    "on_corrupt_shard": "A truncated or corrupt training file: skip (log "
                        "it, count its lost records, train on) or fail "
                        "(stop naming it).",
    "eval_crop_fraction": "Side of the eval centre crop over the image's "
                          "shorter side (0.875: ImageNet's 224 of 256).",
    "train_crop_min_area": "Smallest Inception crop, as a fraction of the "
                           "image area (ImageNet: 0.08).",
    "train_crop_max_aspect": "Inception crop aspect ratios lie in [1/x, x] "
                             "(ImageNet: 4/3).",
    "random_flip": "Flip training images left-right at random; off for "
                   "digits, text or any image whose mirror is another "
                   "class.",
    "train_resize_method": "Resize kernel of the training crop: bilinear "
                           "or bicubic (tensorflow/tpu, MLPerf); eval "
                           "resizes bilinear.",
    "keep_host_memory": "Keep freed host memory mapped (glibc mallopt: 32 MB "
                        "mmap threshold, 512 MB top pad) so CPU training "
                        "steps do not page-fault their buffers in every "
                        "step (resnet_tpu/runtime/host_memory.py); CPU "
                        "runs only.",
    "collective_timeout_s": "Fail a collective (gradient or BN all-reduce, "
                            "multi-worker) that waits longer than this, so "
                            "a worker that hangs while alive stops the "
                            "others (exit 43); 0 = wait forever. Set it "
                            "well above one host loop's time. On JAX: the "
                            "longest wait without a host loop, agreement, "
                            "checkpoint or eval (engines/jax/watchdog.py); 0 = "
                            "JAX's heartbeat timeout, 100 s, which aborts "
                            "the others; at most 40 on jax 0.6.2 (Python "
                            "3.10), which cannot raise that timeout.",
    "cpu_onednn": "TensorFlow's oneDNN CPU kernels: auto (on when the model "
                  "runs on CPU devices: --strategy=cpu, or auto with no "
                  "--tpu, TF_CONFIG or visible NVIDIA GPU; else "
                  "TensorFlow's default), on or off. A "
                  "TF_ENABLE_ONEDNN_OPTS you set wins "
                  "(resnet_tpu/runtime/process_setup.py).",
    "coordinator_address": "--backend=jax --strategy=multi_worker: "
                           "HOST:PORT of process 0, which every process "
                           "reaches (jax.distributed). With "
                           "--num_processes and --process_id; all three "
                           "unset: JAX detects its cluster (Cloud TPU, "
                           "SLURM, Open MPI, Kubernetes).",
    "num_processes": "--backend=jax --strategy=multi_worker: the number of "
                     "processes (one per host); 0 = unset.",
    "process_id": "--backend=jax --strategy=multi_worker: this process's "
                  "index, 0 (the chief: it writes the files) to "
                  "--num_processes - 1; -1 = unset.",
    "allow_config_change": "Comma-separated flags a resumed run may "
                           "change from the model_dir's config.json (e.g. "
                           "global_batch_size,train_epochs); any other "
                           "change of what the run computes stops it. "
                           "config.json records each change.",
    "profile_steps": "first,last: write a TensorBoard profile of the host "
                     "loops that run these steps into the model_dir "
                     "(TensorBoard's Profile tab, with "
                     "tensorboard-plugin-profile); '' = off.",
    "init_checkpoint": "Fine-tune: start a new run from the network "
                       "weights of this model_dir's latest checkpoint or "
                       "this checkpoint prefix (local or gs://); the "
                       "classifier too when --num_classes matches. The "
                       "optimizer, step and input start afresh; ignored "
                       "when --model_dir already holds a checkpoint.",
    "jax_compilation_cache_dir": "--backend=jax: keep the compiled steps "
                                 "here, so that a restarted run loads "
                                 "them instead of compiling again (JAX's "
                                 "persistent compilation cache). auto = "
                                 "$JAX_COMPILATION_CACHE_DIR where set, "
                                 "else <model_dir>/jax_compilation_cache, or "
                                 "~/.cache/resnet_tpu/jax_compilation_cache "
                                 "(under $XDG_CACHE_HOME if set) for a "
                                 "gs:// model_dir; '' = off.",
    "export_dir": "Write a serving SavedModel of the final checkpoint "
                  "here (python -m tools.export_savedmodel); empty = no "
                  "export.",
}

# tensorflow/tpu's names (models/official/resnet/resnet_main.py) for flags
# with the same meaning here; its other shared flags have our names already
# (train_steps, eval_batch_size, base_learning_rate, momentum, precision,
# resnet_depth, data_dir, model_dir, export_dir, tpu, num_train_images,
# num_eval_images, label_smoothing, weight_decay).
TPU_ALIASES = {"train_batch_size": "global_batch_size",
               "iterations_per_loop": "steps_per_loop",
               "steps_per_eval": "eval_every_steps",
               "num_label_classes": "num_classes"}
# The config part each flag belongs to, as --help groups them.
PART_TITLES = {"input": "Input pipeline (Ying et al. §3.2)",
               "model": "Network and batch normalization",
               "optim": "Optimizer, learning rate and loss",
               "distribution": "Replicas, collectives and devices",
               "run": "Batches, length, cadence, resume and export"}

# String choices become enum flags (resnet_depth stays an integer flag).
_ENUMS = {name: choices for name, choices in CHOICES.items()
          if all(isinstance(c, str) for c in choices)}


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """Defines one absl flag per TrainConfig field in `flag_values`."""
  flags.DEFINE_string("model_dir", None, HELP["model_dir"],
                      flag_values=flag_values)
  for name, (_, field) in FLAG_FIELDS.items():
    help_text, default = HELP[name], field.default
    if name in _ENUMS:
      flags.DEFINE_enum(name, default, _ENUMS[name], help_text,
                        flag_values=flag_values)
    elif field.type is bool:
      flags.DEFINE_bool(name, default, help_text,
                        flag_values=flag_values)
    elif field.type is int:
      flags.DEFINE_integer(name, default, help_text,
                           flag_values=flag_values)
    elif field.type is float:
      flags.DEFINE_float(name, default, help_text,
                         flag_values=flag_values)
    else:
      flags.DEFINE_string(name, default, help_text,
                          flag_values=flag_values)
  for alias, name in TPU_ALIASES.items():
    flags.DEFINE_alias(alias, name, flag_values=flag_values)


def grouped_help(flag_values: flags.FlagValues = flags.FLAGS) -> str:
  """Every training flag with its default and help, grouped by the config
  part it fills (main.py's --help)."""
  lines = []
  parts = {"run": ["model_dir"]}
  for name, (part, _) in FLAG_FIELDS.items():
    parts.setdefault(part, []).append(name)
  aliases = {name: alias for alias, name in TPU_ALIASES.items()}
  for part, title in PART_TITLES.items():
    lines.append(f"\n{title} ({part}):")
    for name in parts[part]:
      flag = flag_values[name]
      also = (f" (also --{aliases[name]}, as tensorflow/tpu)"
              if name in aliases else "")
      lines.append(flags.text_wrap(
          f"--{name}: {flag.help}{also} (default: {flag.default!r})",
          indent="      ", firstline_indent="  "))
  return "\n".join(lines) + "\n"


def config_from_flags(flag_values: flags.FlagValues) -> TrainConfig:
  """The TrainConfig of the parsed flags (not yet validated)."""
  return TrainConfig.from_flat(
      flag_values.model_dir,
      **{name: getattr(flag_values, name) for name in FLAG_FIELDS})
