"""The stock-Keras baseline: what a user writes before adopting a framework.

The same narrow ResNet-10 (lab/study_model.py, stock layers) trained by a
plain `model.fit` on one device: the TFRecords read by tf.data, decoded
and resized to the image size (no crop, a random flip), momentum SGD with
the project's LR rule read from the same config (cfg.optim's base LR per
256 images, linear warm-up then cosine decay, as Goyal et al. 2017 §2 and
keras.optimizers.schedules.CosineDecay), L2 weight decay in the loss, the
same label smoothing, batch and steps. What it trained with is read back
from the built optimizer, model and loss (lab/study_settings.py) and
recorded as `trained_with`. Its training loss is recorded as the
project's is (TRAIN_LOSS), not as `fit` logs it (with the L2 term).
With `zoom_min_area` below 1 (the confirmatory study, lab/confirm_plan.py)
it also zooms each training image in at random with Keras's own
RandomZoom layer, keeping a square of at least that share of the image
(centred, as RandomZoom zooms: the project's crop is placed at random).
Evaluation: plain resize of every test image. Nothing of the project's
path (its input pipeline, zero-init gamma, distributed BN, its schedule
code, its trainer) is used, so the comparison prices all of them at once.
"""
import math
import time

import keras
import tensorflow as tf

from resnet_tpu.config import TrainConfig
from lab import study_model
from lab import study_settings

SHUFFLE_SEED_OFFSET = 1000
EVALS = 4  # at each quarter of the run: the convergence check
# What a record's train_loss is, on both paths (study_runner's project
# records too): the data loss alone, averaged over the run's last quarter.
TRAIN_LOSS = ("cross-entropy with label smoothing, without the L2 term, "
              "mean over the last quarter of the steps")


def random_zoom(min_area: float, seed: int) -> keras.layers.RandomZoom:
  """Keras's RandomZoom keeping a square of `min_area` to all of the image:
  a zoom-in of up to 1 - sqrt(min_area) of each side."""
  return keras.layers.RandomZoom(
      height_factor=(-(1.0 - math.sqrt(min_area)), 0.0), width_factor=None,
      seed=seed)


def _dataset(cfg: TrainConfig, split: str, training: bool,
             zoom_min_area: float = 1.0) -> tf.data.Dataset:
  files = tf.io.gfile.glob(f"{cfg.input.data_dir}/{split}-*-of-*")
  features = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
              "image/class/label": tf.io.FixedLenFeature([], tf.int64)}

  def decode(record):
    parsed = tf.io.parse_single_example(record, features)
    image = tf.image.resize(tf.io.decode_jpeg(parsed["image/encoded"], 3),
                            [cfg.model.image_size, cfg.model.image_size])
    if training and cfg.input.random_flip:
      image = tf.image.random_flip_left_right(image)
    label = parsed["image/class/label"] - cfg.input.label_offset
    return image, tf.one_hot(label, cfg.model.num_classes)

  data = tf.data.TFRecordDataset(sorted(files))
  if training:
    data = data.repeat().shuffle(cfg.input.shuffle_buffer_size,
                                 seed=cfg.run.seed + SHUFFLE_SEED_OFFSET)
  batch = cfg.run.clock.batch_size_schedule[-1][1] if training else (
      cfg.run.eval_batch_size)
  data = data.map(decode, tf.data.AUTOTUNE).batch(batch)
  if training and zoom_min_area < 1.0:
    zoom = random_zoom(zoom_min_area, cfg.run.seed + SHUFFLE_SEED_OFFSET)

    def zoomed(images, labels):
      return zoom(images, training=True), labels

    data = data.map(zoomed)
  return data.prefetch(2)


def peak_learning_rate(cfg: TrainConfig, batch: int) -> float:
  """cfg's peak LR at `batch`: base_learning_rate * batch / 256 with
  --learning_rate_scaling=linear, base_learning_rate with none (as the
  project's EpochSchedule.peak)."""
  optim = cfg.optim
  if optim.learning_rate_scaling == "none":
    return optim.base_learning_rate
  if optim.learning_rate_scaling != "linear":
    raise ValueError("The stock-Keras baseline has no --learning_rate_scaling"
                     f"={optim.learning_rate_scaling}: linear or none.")
  return optim.base_learning_rate * batch / 256


def schedule(cfg: TrainConfig, steps: int, batch: int
             ) -> keras.optimizers.schedules.LearningRateSchedule:
  """Linear warm-up to cfg's peak LR, then cosine decay to 0 (or, with
  --lr_schedule=constant as the calibration runs, the peak held)."""
  decay = cfg.optim.lr_schedule
  if decay not in ("cosine", "constant"):
    raise ValueError("The stock-Keras baseline decays by cosine or holds "
                     f"the LR constant; the config has --lr_schedule={decay}.")
  warmup = round(steps * cfg.optim.warmup_epochs / cfg.run.total_train_epochs)
  return keras.optimizers.schedules.CosineDecay(
      0.0, max(1, steps - warmup), alpha=1.0 if decay == "constant" else 0.0,
      warmup_target=peak_learning_rate(cfg, batch), warmup_steps=warmup)


def build(cfg: TrainConfig, features: tuple[str, ...] = ()) -> keras.Model:
  """The stock network compiled with cfg's optimizer, LR rule and loss;
  `features`: the project's choices it takes (study_model.FEATURES)."""
  steps = cfg.run.total_train_steps
  batch = cfg.run.clock.batch_size_schedule[-1][1]
  model = study_model.stock_narrow_resnet(cfg.model, cfg.optim.weight_decay,
                                          features)
  model.compile(
      optimizer=keras.optimizers.SGD(schedule(cfg, steps, batch),
                                     momentum=cfg.optim.momentum,
                                     nesterov=cfg.optim.nesterov),
      loss=keras.losses.CategoricalCrossentropy(
          from_logits=True, label_smoothing=cfg.optim.label_smoothing),
      metrics=["accuracy", keras.metrics.CategoricalCrossentropy(
          "data_loss", from_logits=True,
          label_smoothing=cfg.optim.label_smoothing)])
  return model


def trained_with(model: keras.Model, steps: int) -> dict:
  """What the compiled stock model trains with, read back from it (call
  before it trains: the init is read from its weights)."""
  return {**study_settings.optimizer_settings(model.optimizer, steps),
          **study_settings.model_settings(model),
          **study_settings.stock_regularisation(model),
          "label_smoothing": float(model.loss.label_smoothing)}


class TrainTimer(keras.callbacks.Callback):
  """Seconds of training steps after the first quarter (which traces),
  evaluations left out: the steady steps/s the calibration needs."""

  def __init__(self):
    super().__init__()
    self.seconds, self.steps, self._start = 0.0, 0, 0.0

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch, self._start = epoch, time.time()

  def on_train_batch_end(self, batch, logs=None):
    self._last = time.time()
    self._batches = batch + 1

  def on_epoch_end(self, epoch, logs=None):
    if epoch > 0:  # the first quarter traces the step
      self.seconds += self._last - self._start
      self.steps += self._batches


def fit(cfg: TrainConfig, features: tuple[str, ...] = (),
        zoom_min_area: float = 1.0) -> dict:
  """Trains and evaluates the stock network (with the project's
  `features`, and random_zoom below `zoom_min_area` 1) at cfg's budget
  (momentum); cfg's steps are a multiple of EVALS
  (study_plan.baseline_runs). The record's `trained_with` is read back
  before training (trained_with), with its input's augmentations."""
  keras.utils.set_random_seed(cfg.run.seed)
  steps = cfg.run.total_train_steps
  batch = cfg.run.clock.batch_size_schedule[-1][1]
  model = build(cfg, features)
  settings = dict(trained_with(model, steps),
                  random_flip=cfg.input.random_flip,
                  random_zoom_min_area=zoom_min_area)
  quarter = steps // EVALS
  timer = TrainTimer()
  start = time.time()
  history = model.fit(_dataset(cfg, "train", True, zoom_min_area),
                      epochs=EVALS,
                      steps_per_epoch=quarter, verbose=0, callbacks=[timer],
                      validation_data=_dataset(cfg, "validation", False)
                      ).history
  seconds = time.time() - start
  at = [quarter * (i + 1) for i in range(EVALS)]
  return {"trained_with": settings,
          "top1": float(history["val_accuracy"][-1]),
          "eval_loss": float(history["val_loss"][-1]),
          # fit's "loss" holds the kernels' L2 term, the project's does not.
          "train_loss": float(history["data_loss"][-1]),
          "train_loss_with_l2": float(history["loss"][-1]),
          "train_loss_measure": TRAIN_LOSS,
          "train_steps": quarter * EVALS, "images": quarter * EVALS * batch,
          "steps_per_sec": timer.steps / max(timer.seconds, 1e-9),
          "seconds": seconds,
          "evals": [(s, float(t)) for s, t in zip(at, history["val_accuracy"])],
          "train_losses": [(s, float(t))
                           for s, t in zip(at, history["data_loss"])]}
