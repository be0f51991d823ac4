"""Every flags/*.cfg recipe parses, validates and trains on CPU.

The flagfiles hold the published recipes (Ying et al. 2018, Mikami et al.
2018, Akiba et al. 2017, Goyal et al. 2017) and per-machine settings. Each is
checked as written against the replica count its header names, then shrunk
to ResNet-18 at 32 px on 2 virtual CPU replicas, keeping its optimizer, LR
schedule, precision, label smoothing, BN statistics and batch-size control,
and trained for 2 steps; files that shrink to the same toy config (the
machine recipes differ only in what shrinking replaces) share one run. A
typo in a flag or an inconsistent recipe fails here, not on a pod. New files
in flags/ are picked up by the glob. Each published recipe's LR at chosen
steps (warm-up, decay boundaries, a batch-size switch, the last step) equals
the closed form of the source its header cites.
"""
import glob
import math
import os
import re

from absl import flags
import pytest
import tensorflow as tf

from resnet_tpu import config as config_lib
from resnet_tpu import flags as resnet_flags
from resnet_tpu import preflight
from resnet_tpu.config import TrainConfig
from resnet_tpu.train.metrics_log import read_metrics
from resnet_tpu.run import run
from resnet_tpu.runtime import compat
from resnet_tpu.optim.optimizers import build_optimizer_from_config

FLAGS_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "flags")
FLAGFILES = sorted(glob.glob(os.path.join(FLAGS_DIR, "*.cfg")))
RECIPES = ("ying2018_v3-1024.cfg", "mikami2018_abci_2176gpu.cfg",
           "akiba2017_32k.cfg", "goyal2017_8k.cfg", "v3-8.cfg", "v4-8.cfg",
           "v3-32.cfg", "v5e-8.cfg", "v6e-8.cfg", "gpu_8x.cfg",
           "cpu_demo.cfg", "small_images.cfg")
# The most TPU replicas one TPU VM host drives (a v2/v3 host: 8 cores).
ONE_HOST_TPU_REPLICAS = 8
TPU_DOC = os.path.join(os.path.dirname(FLAGS_DIR), "docs", "tpu.md")
REPLICAS_LINE = re.compile(r"^# replicas: (\d+)$", re.MULTILINE)
FLAG_LINE = re.compile(r"^--\w+=\S*$")
# Toy runs: 2 replicas x 4 images a micro-batch, 16 images an epoch. Batch-
# size control becomes 2 then 4 accumulated micro-batches: the phase changes
# after 1 step, and both phases use the one accumulating loop (one trace).
TINY_BATCH = 8
TINY_EPOCH = 16
TINY_SCHEDULE = "0:16,1:32"


def parse_flagfile(path: str) -> TrainConfig:
  """The TrainConfig of `main.py --flagfile=path` on the ImageNet files the
  recipes are written for (run.py takes the epoch from that 1024-file
  layout, preflight.num_train_images)."""
  flag_values = flags.FlagValues()
  resnet_flags.define_flags(flag_values)
  flag_values(["main.py", f"--flagfile={path}", "--model_dir=/tmp/unused"])
  cfg = resnet_flags.config_from_flags(flag_values)
  return cfg.replace(num_train_images=(cfg.run.num_train_images or
                                       preflight.IMAGENET_TRAIN_IMAGES))


def replicas_of(path: str, cfg: TrainConfig) -> int:
  """The '# replicas: N' of the header, or --num_cpu_replicas for CPU runs."""
  with open(path) as f:
    match = REPLICAS_LINE.search(f.read())
  if match:
    return int(match.group(1))
  assert cfg.distribution.strategy == "cpu", (
      f"{path}: the header must name its replica count ('# replicas: N').")
  return cfg.distribution.num_cpu_replicas


def shrink(cfg: TrainConfig, model_dir: str) -> TrainConfig:
  """`cfg` at toy size: ResNet-18, 32 px, 2 CPU replicas, 2 steps.

  The LR schedule keeps the recipe's length in epochs; two steps are an
  epoch or more of it, so warm-up and decays move. A batch-size schedule
  becomes TINY_SCHEDULE; a 2-D all-reduce grid becomes the squarest for 2.
  """
  return cfg.replace(
      model_dir=model_dir, data_dir="", use_synthetic_data=True,
      resnet_depth=18, image_size=32, strategy="cpu", tpu="",
      num_cpu_replicas=2, bn_group_size=min(cfg.model.bn_group_size, 2),
      global_batch_size=TINY_BATCH, eval_batch_size=TINY_BATCH,
      batch_size_schedule=TINY_SCHEDULE if cfg.run.batch_size_schedule else "",
      num_train_images=TINY_EPOCH, train_epochs=cfg.run.total_train_epochs,
      train_steps=2, steps_per_loop=1, all_reduce_grid="", eval_every_steps=0,
      checkpoint_every_steps=0, cache_dataset=False, export_dir="")


def test_every_published_recipe_and_machine_has_a_flagfile():
  names = {os.path.basename(p) for p in FLAGFILES}
  assert set(RECIPES) <= names, sorted(set(RECIPES) - names)


@pytest.mark.parametrize("path", FLAGFILES, ids=os.path.basename)
def test_flagfile_is_a_header_then_one_flag_per_line(path):
  with open(path) as f:
    lines = [line.rstrip("\n") for line in f]
  assert lines[0].startswith("# "), f"{path} must start with a comment"
  header_end = next(i for i, line in enumerate(lines)
                    if not line.startswith("#"))
  body = lines[header_end:]
  assert body and all(FLAG_LINE.match(line) for line in body), body
  names = [line[2:].split("=")[0] for line in body]
  assert len(names) == len(set(names)), f"{path} repeats a flag"
  assert not {"data_dir", "model_dir"} & set(names), (
      f"{path}: --data_dir and --model_dir belong on the command line")


@pytest.mark.parametrize("path", FLAGFILES, ids=os.path.basename)
def test_flagfile_validates_for_the_replica_count_it_names(path):
  cfg = parse_flagfile(path)
  config_lib.validate(cfg.replace(use_synthetic_data=True),
                      replicas_of(path, cfg))


@pytest.fixture(scope="module")
def train_toy(tmp_path_factory):
  """Trains a shrunk config once per module; returns its train records."""
  trained = {}

  def train(toy: TrainConfig) -> list[dict]:
    if toy not in trained:
      cfg = toy.replace(model_dir=str(tmp_path_factory.mktemp("toy_run")))
      # A fresh MirroredStrategy per run in one process: shift its collective
      # keys, as conftest.cpu_strategy does, so runs never share an instance.
      compat.shift_collective_keys(tf.distribute.MirroredStrategy, 100000)
      run(cfg)
      trained[toy] = [r for r in read_metrics(cfg.model_dir)
                      if r["split"] == "train"]
    return trained[toy]

  return train


@pytest.mark.parametrize("path", FLAGFILES, ids=os.path.basename)
def test_flagfile_recipe_trains_2_steps_on_2_cpu_replicas(path, train_toy):
  toy = shrink(parse_flagfile(path), model_dir="")
  train = train_toy(toy)
  assert train[-1]["step"] == 2
  assert all(math.isfinite(r["loss"]) for r in train), train
  last_batch = toy.run.clock.global_batch_at_step(1)
  assert last_batch == (32 if toy.run.batch_size_schedule else TINY_BATCH)
  assert train[-1]["examples"] == last_batch


@pytest.mark.parametrize("path", FLAGFILES, ids=os.path.basename)
def test_tpu_flagfiles_follow_the_route_tensorflow_documents(path):
  """One host: --tpu=local on that TPU VM. A pod slice: one process on
  worker 0 with --tpu=$TPU_NAME (TensorFlow on TPU VMs is single-
  controller), which docs/tpu.md's "Pod slices" tells the same way."""
  cfg = parse_flagfile(path)
  if cfg.distribution.strategy != "tpu":
    return
  with open(path) as f:
    header = f.read()
  if replicas_of(path, cfg) <= ONE_HOST_TPU_REPLICAS:
    assert cfg.distribution.tpu == "local"
    return
  assert cfg.distribution.tpu == "", (
      f"{path}: a pod slice is named on the command line")
  for said in ("worker 0 only", "--tpu=$TPU_NAME", "requirements/tpu-pod.txt",
               "tpu-vm-tf-*-pod"):
    assert said in header, f"{path} does not say {said!r}"
  with open(TPU_DOC) as f:
    doc = f.read()
  pod = doc[doc.index("\n## Pod slices\n"):]
  pod = pod[:pod.index("\n## ", 1)]
  for said in ("worker 0", "--tpu=$TPU_NAME", "requirements/tpu-pod.txt",
               "tpu-vm-tf-", os.path.basename(path)):
    assert said in pod, f"docs/tpu.md's Pod slices does not say {said!r}"


@pytest.mark.parametrize("name", ["v5e-8.cfg", "v6e-8.cfg"])
def test_the_pjrt_tpu_recipes_move_uint8_images(name):
  """uint8 on the wire, cast on the chip, where the recipe allows it
  (issue 60): half of bfloat16's bytes for the host to batch and move."""
  assert parse_flagfile(os.path.join(FLAGS_DIR, name)).transfer_dtype == (
      "uint8")


def test_unknown_flag_in_a_flagfile_fails_parsing(tmp_path):
  path = tmp_path / "typo.cfg"
  path.write_text("# A recipe with a typo.\n--global_batch_size=8\n"
                  "--lables_smoothing=0.1\n")
  with pytest.raises(flags.UnrecognizedFlagError, match="lables_smoothing"):
    parse_flagfile(str(path))


def test_bad_enum_value_in_a_flagfile_fails_parsing(tmp_path):
  path = tmp_path / "bad_optimizer.cfg"
  path.write_text("# A recipe with an unknown optimizer.\n--optimizer=lamb\n")
  with pytest.raises(flags.IllegalFlagValueError, match="lamb"):
    parse_flagfile(str(path))


# --- Each recipe's LR at chosen steps against the closed form of its source.
IMAGENET = 1281167


def epoch_at(step: int, phases: tuple[tuple[int, int], ...]) -> float:
  """Epoch after `step` steps of (start_epoch, batch) phases, in closed form."""
  start_step = 0
  for (start, batch), (end, _) in zip(phases, phases[1:] + ((None, 0),)):
    steps = (math.inf if end is None else
             math.ceil((end - start) * IMAGENET / batch))
    if step < start_step + steps:
      return start + (step - start_step) * batch / IMAGENET
    start_step += steps
  raise AssertionError("unreachable")


def lars_poly(peak: float, warmup: float, epochs: float, epoch: float,
              end: float = 1e-4) -> float:
  """tensorflow/tpu lars_util.py poly_rate_schedule, in epochs."""
  if epoch < warmup:
    return peak * epoch / warmup
  return (peak - end) * (1 - (epoch - warmup) / (epochs - warmup))**2 + end


def goyal_step(peak: float, epoch: float, warmup: float = 5.0) -> float:
  """Goyal et al.: warm-up, then x0.1 after epochs 30, 60 and 80."""
  if epoch < warmup:
    return peak * epoch / warmup
  return peak * 0.1**sum(epoch > b for b in (30, 60, 80))


def akiba_slow_start(peak: float, epoch: float) -> float:
  """5-epoch warm-up, then x0.5, x0.075, x0.01, x0.001 (schedules.py)."""
  factor = (0.5, 0.075, 0.01, 0.001)[sum(epoch > b for b in (40, 70, 85))]
  return peak * min(1.0, epoch / 5) * factor


def around(epoch: float, batch: int) -> tuple[int, int]:
  """The last step before `epoch` at `batch` and the first one after it."""
  step = math.ceil(epoch * IMAGENET / batch)
  return step - 1, step


YING = ((0, 32768),)
MIKAMI = ((0, 34816), (30, 69632))
# Steps: 0, inside the warm-up, either side of its end, of each decay
# boundary and of a batch-size switch, mid-decay, and the last step.
LR_CASES = [
    # Ying et al.: peak 34.0 after 12 warm-up epochs at batch 32768
    # (tensorflow/tpu lars_util.py at f4fa4d7), polynomial to 1e-4.
    ("ying2018_v3-1024.cfg", s, lars_poly(34.0, 12, 90, epoch_at(s, YING)))
    for s in (0, 100, *around(12, 32768), 1500, 3518)
] + [
    # Mikami et al. v1: absolute peak 41.0 after 16 warm-up epochs (lars_util
    # at b13e6b6), held across the switch to 69632 at epoch 30.
    ("mikami2018_abci_2176gpu.cfg", s,
     lars_poly(41.0, 16, 90, epoch_at(s, MIKAMI)))
    for s in (0, 300, *around(16, 34816), *around(30, 34816), 1655, 2207)
] + [
    # Akiba et al.: 0.1 per 256 images, slow start (schedules.py).
    ("akiba2017_32k.cfg", s,
     akiba_slow_start(0.1 * 32768 / 256, epoch_at(s, YING)))
    for s in (0, 100, *around(5, 32768), *around(40, 32768),
              *around(70, 32768), *around(85, 32768), 3518)
] + [
    (name, s, goyal_step(0.1 * batch / 256, epoch_at(s, ((0, batch),))))
    for name, batch in (("goyal2017_8k.cfg", 8192), ("v3-8.cfg", 1024),
                        ("v4-8.cfg", 1024), ("gpu_8x.cfg", 1024),
                        ("v3-32.cfg", 4096))
    for s in (0, 100, *around(5, batch), *around(30, batch),
              *around(80, batch), math.ceil(90 * IMAGENET / batch) - 1)
]


@pytest.mark.parametrize("name,step,expected", LR_CASES,
                         ids=lambda v: str(v) if isinstance(v, int) else None)
def test_flagfile_lr_at_chosen_steps_matches_its_source(name, step, expected):
  cfg = parse_flagfile(os.path.join(FLAGS_DIR, name))
  optimizer = build_optimizer_from_config(cfg.optim, cfg.run)
  optimizer.iterations.assign(step)
  assert float(optimizer.learning_rate) == pytest.approx(
      expected, rel=1e-5, abs=1e-8)  # float32 rounding near the decay's end


def test_mikami_lr_does_not_jump_at_the_batch_size_switch():
  cfg = parse_flagfile(os.path.join(FLAGS_DIR, "mikami2018_abci_2176gpu.cfg"))
  switch = cfg.run.clock.phase_start_steps()[1]
  batches = [cfg.run.clock.global_batch_at_step(s)
             for s in (switch - 1, switch)]
  assert batches == [34816, 69632]
  optimizer = build_optimizer_from_config(cfg.optim, cfg.run)
  lrs = []
  for step in (switch - 1, switch):
    optimizer.iterations.assign(step)
    lrs.append(float(optimizer.learning_rate))
  assert lrs[1] == pytest.approx(lrs[0], rel=0.01)


@pytest.mark.parametrize("images", [500, 5_000, 50_000])
def test_the_fine_tune_flagfile_warms_up_and_decays_within_the_run(images):
  """flags/finetune.cfg on a folder of a few hundred to tens of thousands
  of images: the pre-flight has nothing to warn of, the LR peaks after one
  epoch and reaches 0 at the end (issue 50: the README's old command
  inherited gpu_8x.cfg's step decays at epochs 30/60/80)."""
  cfg = parse_flagfile(os.path.join(FLAGS_DIR, "finetune.cfg")).replace(
      num_train_images=images)
  assert preflight.schedule_warnings(cfg) == []
  optimizer = build_optimizer_from_config(cfg.optim, cfg.run)
  steps = cfg.run.total_train_steps
  peak = 0.01 * 256 / 256
  for step, expected in ((0, 0.0),
                         (cfg.run.clock.steps_for_epochs(1), peak),
                         (steps, 0.0)):
    optimizer.iterations.assign(step)
    assert float(optimizer.learning_rate) == pytest.approx(
        expected, rel=1e-2, abs=1e-6), step


# What the JAX engine trains of the shipped flagfiles (docs/jax.md), and
# the flag it names for the rest (config.JAX_UNSUPPORTED).
JAX_REFUSES = {"mikami2018_abci_2176gpu.cfg": "--gradient_all_reduce=2d"}


@pytest.mark.parametrize("path", FLAGFILES, ids=os.path.basename)
def test_the_jax_engine_takes_each_flagfile_or_names_what_it_refuses(
    path):
  cfg = parse_flagfile(path).replace(backend="jax", data_dir="/data")
  refused = JAX_REFUSES.get(os.path.basename(path))
  if refused is None:
    config_lib.validate(cfg)
    return
  with pytest.raises(config_lib.ConfigError,
                     match=re.escape(refused) + ".* is not supported with "
                     "--backend=jax"):
    config_lib.validate(cfg)
