"""Epoch-based LR schedules (Goyal, Akiba 2017; Ying 2018 §3; Mikami 2018)."""
import math

import keras
import numpy as np
import pytest

from resnet_tpu.clock import EpochClock
from resnet_tpu.clock import parse_batch_size_schedule
from resnet_tpu.optim.schedules import EpochSchedule
from resnet_tpu.optim.schedules import epoch_tensor

BASE_LR = 0.1
IMAGES = 1000  # Images per epoch; batch 100 gives 10 steps per epoch.


def schedule(decay, *, train_epochs=10, warmup_epochs=2,
             batch_size_schedule=((0, 100),), **kwargs):
  return EpochSchedule(BASE_LR, images_per_epoch=IMAGES,
                       batch_size_schedule=batch_size_schedule,
                       train_epochs=train_epochs, warmup_epochs=warmup_epochs,
                       decay=decay, **kwargs)


def lr_at(sched, step):
  return float(sched(np.int64(step)))


PEAK = BASE_LR * 100 / 256  # Linear scaling of the base LR to batch 100.
END = 1e-4  # tensorflow/tpu's polynomial decay ends at 1e-4, not 0.


def poly(peak, fraction, power=2.0, end=END):
  """tf.train.polynomial_decay at `fraction` of the decay steps."""
  return (peak - end) * (1 - fraction)**power + end


@pytest.mark.parametrize("decay,step,expected", [
    ("polynomial", 0, 0.0),
    ("polynomial", 10, PEAK * 0.5),  # Mid warm-up (epoch 1 of 2).
    ("polynomial", 20, PEAK),  # Warm-up end.
    ("polynomial", 60, poly(PEAK, 4 / 8)),
    ("polynomial", 99, poly(PEAK, 7.9 / 8)),  # Last step.
    ("cosine", 20, PEAK),
    ("cosine", 60, PEAK * 0.5 * (1 + math.cos(math.pi * 4 / 8))),
    ("cosine", 99, PEAK * 0.5 * (1 + math.cos(math.pi * 7.9 / 8))),
    ("constant", 5, PEAK * 0.25),
    ("constant", 99, PEAK),
])
def test_warmup_and_decay_match_closed_form_over_10_epochs(decay, step,
                                                           expected):
  assert lr_at(schedule(decay), step) == pytest.approx(expected, rel=1e-4,
                                                       abs=1e-9)


def test_polynomial_power_is_configurable():
  assert lr_at(schedule("polynomial", decay_power=1.0), 60) == pytest.approx(
      poly(PEAK, 0.5, power=1.0), rel=1e-4)


def test_polynomial_decay_ends_at_end_learning_rate():
  # Epoch 10 of 10 (step 100, one past the last step) is the end itself.
  assert lr_at(schedule("polynomial"), 100) == pytest.approx(END, rel=1e-4)
  assert lr_at(schedule("polynomial", end_learning_rate=0.0), 100) == 0.0
  assert lr_at(schedule("polynomial", end_learning_rate=0.0),
               60) == pytest.approx(PEAK * 0.25, rel=1e-4)
  # The warm-up still starts at 0 and reaches the peak, end or not.
  assert lr_at(schedule("polynomial"), 0) == 0.0
  assert lr_at(schedule("polynomial"), 20) == pytest.approx(PEAK, rel=1e-6)
  # Other decays ignore it.
  assert lr_at(schedule("cosine"), 100) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("decay,step,expected", [
    ("step", 25, PEAK * 0.5),  # Warm-up over 5 epochs.
    ("step", 50, PEAK),
    ("step", 300, PEAK),  # Epoch 30 itself: not yet decayed.
    ("step", 301, PEAK * 0.1),
    ("step", 601, PEAK * 0.01),
    ("step", 801, PEAK * 0.001),
    ("step", 899, PEAK * 0.001),  # Last step of 90 epochs.
    ("slow_start", 25, PEAK * 0.5 * 0.5),
    ("slow_start", 50, PEAK * 0.5),
    ("slow_start", 400, PEAK * 0.5),
    ("slow_start", 401, PEAK * 0.075),
    ("slow_start", 701, PEAK * 0.01),
    ("slow_start", 851, PEAK * 0.001),
])
def test_piecewise_schedules_decay_after_their_boundary_epochs(decay, step,
                                                                expected):
  sched = schedule(decay, train_epochs=90, warmup_epochs=5)
  assert lr_at(sched, step) == pytest.approx(expected, rel=1e-4)


# Batch 400 for epochs [0, 3) then 250: phase 0 takes ceil(3000 / 400) = 8
# steps, so step 7 is epoch 2.8 and step 8 is epoch 3.
GROWING = ((0, 400), (3, 250))


def test_clock_maps_steps_to_epochs_and_batches_across_phases():
  clock = EpochClock(IMAGES, GROWING)
  assert clock.phase_start_steps() == (0, 8)
  assert [clock.global_batch_at_step(s) for s in (0, 7, 8, 100)] == [
      400, 400, 250, 250]
  assert clock.steps_for_epochs(2) == 5
  assert clock.steps_for_epochs(10) == 8 + 28
  epochs = [float(epoch_tensor(clock, np.int64(s))) for s in (0, 5, 7, 8, 12)]
  np.testing.assert_allclose(epochs, [0.0, 2.0, 2.8, 3.0, 4.0], rtol=1e-6)


@pytest.mark.parametrize("step,expected", [
    (2, BASE_LR * 400 / 256 * 0.8 / 2),  # Epoch 0.8, warming up.
    (7, poly(BASE_LR * 400 / 256, 0.8 / 8)),  # Epoch 2.8.
    (12, poly(BASE_LR * 250 / 256, 2 / 8)),  # Epoch 4, new batch.
    (35, poly(BASE_LR * 250 / 256, 7.75 / 8)),  # Last step, epoch 9.75.
])
def test_batch_size_schedule_scales_lr_with_the_current_batch(step,
                                                              expected):
  sched = schedule("polynomial", batch_size_schedule=GROWING)
  assert lr_at(sched, step) == pytest.approx(expected, rel=1e-4)


@pytest.mark.parametrize("step,expected", [
    (2, BASE_LR * 0.8 / 2),  # Epoch 0.8 at batch 400, warming up.
    (7, poly(BASE_LR, 0.8 / 8)),  # Epoch 2.8, the last step at batch 400.
    (8, poly(BASE_LR, 1 / 8)),  # Epoch 3, batch 250: no jump.
    (35, poly(BASE_LR, 7.75 / 8)),
])
def test_absolute_lr_is_held_across_a_batch_size_switch(step, expected):
  sched = schedule("polynomial", batch_size_schedule=GROWING, scaling="none")
  assert lr_at(sched, step) == pytest.approx(expected, rel=1e-4)


def test_lr_per_image_is_a_function_of_the_epoch_only():
  growing = schedule("cosine", batch_size_schedule=GROWING)
  constant = schedule("cosine", batch_size_schedule=((0, 250),))
  # Epoch 4.0 is step 12 with the growing batch and step 16 at batch 250.
  assert lr_at(growing, 12) == pytest.approx(lr_at(constant, 16), rel=1e-6)


def test_config_round_trip_through_keras_serialization():
  sched = schedule("slow_start", train_epochs=90, warmup_epochs=5,
                   batch_size_schedule=GROWING)
  restored = keras.optimizers.schedules.deserialize(
      keras.optimizers.schedules.serialize(sched))
  assert restored.get_config() == sched.get_config()
  optimizer = keras.optimizers.SGD.from_config(
      keras.optimizers.SGD(sched, momentum=0.9).get_config())
  optimizer.iterations.assign(300)
  assert float(optimizer.learning_rate) == lr_at(sched, 300)


def test_parse_batch_size_schedule():
  assert parse_batch_size_schedule("0:16384,30:32768") == ((0, 16384),
                                                           (30, 32768))
  assert parse_batch_size_schedule(" 0:1024 ") == ((0, 1024),)


@pytest.mark.parametrize("text", [
    "", "16384", "0:16384,30", "0:16384,x:32768", "5:1024", "0:1024,0:2048",
    "0:1024,30:0", "0:1024,30:2048,20:4096",
])
def test_parse_batch_size_schedule_names_the_flag_on_bad_input(text):
  with pytest.raises(ValueError, match="--batch_size_schedule"):
    parse_batch_size_schedule(text)


@pytest.mark.parametrize("kwargs,flag", [
    ({"decay": "polynomial", "train_epochs": 2}, "--train_epochs"),
    ({"decay": "cosine", "warmup_epochs": -1}, "--warmup_epochs"),
    ({"decay": "step", "warmup_epochs": 30}, "--warmup_epochs"),
    ({"decay": "polynomial", "end_learning_rate": -1.0},
     "--end_learning_rate"),
])
def test_bad_schedule_arguments_name_the_flag(kwargs, flag):
  with pytest.raises(ValueError, match=flag):
    schedule(**kwargs)


def test_epoch_of_step_is_the_tensor_epoch_without_running_tensorflow():
  clock = EpochClock(1000, ((0, 100), (2, 200), (5, 400)))
  for step in (0, 7, 20, 21, 35, 36, 50, 99):
    assert clock.epoch_of_step(step) == pytest.approx(
        float(epoch_tensor(clock, step)), rel=1e-6), step
