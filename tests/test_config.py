"""Bad flag values and combinations fail before start-up, naming the flag."""
import pytest

from resnet_tpu import config as config_lib
from resnet_tpu import data_checks
from resnet_tpu.config import TrainConfig
from resnet_tpu.config import validate

OK = dict(model_dir="/tmp/unused", use_synthetic_data=True, train_steps=1,
          global_batch_size=64, eval_batch_size=64)


def _config(**overrides) -> TrainConfig:
  return TrainConfig.from_flat(**{**OK, **overrides})


def test_a_good_config_validates():
  validate(_config(bn_group_size=4), num_replicas=8)


@pytest.mark.parametrize("overrides,replicas,flag", [
    (dict(global_batch_size=60), 8, "--global_batch_size"),
    (dict(eval_batch_size=12), 8, "--eval_batch_size"),
    (dict(bn_group_size=3), 8, "--bn_group_size"),
    (dict(resnet_depth=42), None, "--resnet_depth"),
    (dict(image_size=16), None, "--image_size"),
    (dict(precision="float64"), None, "--precision"),
    (dict(bfloat16_conv_kernels="fp32"), None, "--bfloat16_conv_kernels"),
    (dict(strategy="horovod"), None, "--strategy"),
    (dict(train_steps=0), None, "--train_steps"),
    (dict(optimizer="adam"), None, "--optimizer"),
    (dict(lr_schedule="linear"), None, "--lr_schedule"),
    (dict(label_smoothing=1.0), None, "--label_smoothing"),
    (dict(batch_size_schedule="0:100"), None, "--batch_size_schedule"),
    (dict(batch_size_schedule="5:128"), None, "--batch_size_schedule"),
    (dict(model_dir=""), None, "--model_dir"),
    (dict(gradient_all_reduce="2d", all_reduce_grid="3x3"), 8,
     "--all_reduce_grid"),
    (dict(all_reduce_grid="4by2"), None, "--all_reduce_grid"),
    (dict(tpu="local", gradient_all_reduce="ring"), None,
     "--gradient_all_reduce"),
    (dict(strategy="tpu", gradient_all_reduce="2d_ying"), None,
     "--gradient_all_reduce"),
    (dict(optimizer="rmsprop_warmup", nesterov=True), None, "--nesterov"),
    (dict(bn_stats="ema"), None, "--bn_stats"),
])
def test_bad_setting_is_rejected_naming_its_flag(overrides, replicas, flag):
  with pytest.raises(ValueError, match=flag):
    validate(_config(**overrides), num_replicas=replicas)


MULTI_HOST_JAX = dict(backend="jax", strategy="multi_worker")


@pytest.mark.parametrize("overrides,message", [
    (dict(num_processes=2), "^--num_processes: for --backend=jax "
     "--strategy=multi_worker .*TensorFlow's workers come from TF_CONFIG"),
    (dict(strategy="multi_worker", coordinator_address="h:1",
          num_processes=2, process_id=0),
     "^--coordinator_address, --num_processes, --process_id: for "
     "--backend=jax"),
    (dict(MULTI_HOST_JAX, num_processes=2),
     "^--num_processes given alone: set all three"),
    (dict(MULTI_HOST_JAX, coordinator_address="h:1", process_id=0),
     "^--coordinator_address, --process_id given alone"),
    (dict(MULTI_HOST_JAX, coordinator_address="h:1", num_processes=2,
          process_id=2), r"^--process_id=2 must be in \[0, "
     r"--num_processes=2\)"),
    (dict(MULTI_HOST_JAX, coordinator_address="host", num_processes=2,
          process_id=1), "^--coordinator_address must be HOST:PORT"),
])
def test_the_jax_process_flags_go_together(overrides, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    validate(_config(**overrides))


def test_a_multi_host_jax_run_takes_all_three_process_flags_or_none():
  validate(_config(**MULTI_HOST_JAX))
  validate(_config(**MULTI_HOST_JAX, coordinator_address="10.0.0.2:8476",
                   num_processes=4, process_id=3))


def test_missing_data_dir_is_rejected(tmp_path):
  with pytest.raises(ValueError, match="--data_dir"):
    validate(_config(use_synthetic_data=False, data_dir=""))
  with pytest.raises(ValueError, match="not a directory"):
    data_checks.find_data_files(str(tmp_path / "nope"))


def test_data_dir_without_tfrecords_is_rejected(tmp_path):
  (tmp_path / "readme.txt").write_text("not a TFRecord")
  with pytest.raises(ValueError, match="train-"):
    data_checks.find_data_files(str(tmp_path))


def test_batch_size_schedule_sets_steps_from_epochs():
  cfg = _config(train_steps=0, train_epochs=2, num_train_images=1024,
                batch_size_schedule="0:64,1:128")
  # 1024/64 steps in epoch 0, then 1024/128 in epoch 1.
  assert cfg.run.total_train_steps == 16 + 8


def _numeric_fields() -> list[str]:
  return [name for name, (_, field) in config_lib.FLAG_FIELDS.items()
          if field.type in (int, float) and name not in config_lib.CHOICES]


def test_every_numeric_field_has_a_range_and_every_range_a_field():
  assert sorted(config_lib.RANGES) == sorted(_numeric_fields())


def _outside(allowed: config_lib.Range) -> list[float]:
  values = []
  if allowed.low is not None:
    values.append(allowed.low if allowed.low_open else allowed.low - 1)
  if allowed.high is not None:
    values.append(allowed.high if allowed.high_open else allowed.high + 1)
  return values


@pytest.mark.parametrize("name", sorted(config_lib.RANGES))
def test_each_field_out_of_range_fails_naming_its_flag(name):
  allowed = config_lib.RANGES[name]
  _, field = config_lib.FLAG_FIELDS[name]
  field_type = field.type
  assert _outside(allowed), name  # every range bounds something
  for value in _outside(allowed):
    with pytest.raises(config_lib.ConfigError,
                       match=rf"^--{name} must be .*got {value!r}"):
      validate(_config(**{name: field_type(value)}))
  inside = field.default
  assert allowed.contains(inside), (name, inside)  # defaults are valid


def test_the_ranges_of_the_issue_hold():
  ranges = config_lib.RANGES
  assert not ranges["base_learning_rate"].contains(-1.0)
  assert not ranges["base_learning_rate"].contains(0.0)
  assert ranges["momentum"].contains(0.0)
  assert not ranges["momentum"].contains(1.0)
  assert not ranges["lars_eta"].contains(0.0)
  assert ranges["warmup_epochs"].contains(0.0)
  assert not ranges["global_batch_size"].contains(0)
  assert not ranges["label_smoothing"].contains(1.5)


@pytest.mark.parametrize("name", sorted(config_lib.CHOICES))
def test_each_enum_outside_its_choices_fails_naming_its_flag(name):
  """The one place choices are checked: the library trusts a validated
  config (the BN layer and LARS, public outside a run, keep guards)."""
  with pytest.raises(ValueError, match=f"--{name} must be one of"):
    validate(_config(**{name: "not-a-choice" if name != "resnet_depth"
                        else 7}))


def test_the_enum_choices_are_the_model_depths_and_the_flag_enums():
  from resnet_tpu.model.resnet import LAYERS  # pylint: disable=g-import-not-at-top
  assert tuple(LAYERS) == config_lib.RESNET_DEPTHS


def test_flat_names_route_to_their_parts_and_back():
  cfg = TrainConfig.from_flat(model_dir="m", data_dir="d", resnet_depth=18,
                              optimizer="lars", strategy="cpu", seed=3)
  assert (cfg.input.data_dir, cfg.model.resnet_depth, cfg.optim.optimizer,
          cfg.distribution.strategy, cfg.run.seed) == ("d", 18, "lars",
                                                       "cpu", 3)
  assert set(cfg.flat()) == {"model_dir", *config_lib.FLAG_FIELDS}
  assert TrainConfig.from_flat(**cfg.flat()) == cfg
  assert cfg.replace(seed=4, model_dir="n").flat() == dict(
      cfg.flat(), seed=4, model_dir="n")
  with pytest.raises(TypeError, match="resnet_dept"):
    cfg.replace(resnet_dept=18)


@pytest.mark.parametrize("kind, makes_replicas, rejected", [
    ("cpu", True, True),     # 3 replicas it makes cannot split 8 images
    ("cpu", False, False),   # replicas counted later, from the devices
    ("gpu", True, False),    # no CPU replicas: counted after start-up
])
def test_start_up_validates_the_cpu_replicas_it_makes_under_its_kind(
    kind, makes_replicas, rejected):
  cfg = TrainConfig.tiny("m", strategy="auto", num_cpu_replicas=3,
                         use_synthetic_data=True)
  if rejected:
    with pytest.raises(config_lib.ConfigError, match="--global_batch_size"):
      config_lib.validate_start_up(cfg, kind, makes_replicas)
    return
  started = config_lib.validate_start_up(cfg, kind, makes_replicas)
  assert started.distribution.strategy == kind
