"""The cases both engines run, and their data: one module, imported by the
TensorFlow reference (tf_reference.py, in .venv) and by the JAX tests, so
the two sides cannot drift apart. numpy and the config only: no engine."""
import keras
import numpy as np

from resnet_tpu.clock import EpochClock
from resnet_tpu.config import TrainConfig
from resnet_tpu.model import resnet
from resnet_tpu.optim.optimizers import build_optimizer

REPLICAS = 8
PER_REPLICA = 4
GLOBAL_BATCH = REPLICAS * PER_REPLICA
IMAGE_SIZE = 32
NUM_CLASSES = 10
GROUP_SIZES = (1, 2, 4, 8)
LEARNING_RATE = 0.1
# (precision, BN group size). float64 at every group: in float32 the two
# engines round differently, and where a pre-ReLU value sits within that
# rounding of 0 the ReLU passes its gradient on one engine and not the
# other (seen: one channel of one BN layer's beta gradient off by 2 % at
# group 2, every other tensor within 1e-5). float32 as the flags build it,
# with L2 in the loss, at group 1.
STEP_CASES = (("float32", 1),) + tuple(("float64", g) for g in GROUP_SIZES)


def step_config(precision: str, group_size: int) -> TrainConfig:
  """ResNet-18 v1.5 at 32 px, group BN of `group_size` replicas, momentum
  SGD with label smoothing, and L2 in the loss in float32 (TF's step adds
  a float32 L2 term, which a float64 loss cannot take). gamma starts at 1
  everywhere, so that every block's branch carries gradient."""
  return TrainConfig(model_dir="").replace(
      resnet_depth=18, image_size=IMAGE_SIZE, num_classes=NUM_CLASSES,
      bn_group_size=group_size, zero_init_gamma=False,
      weight_decay=1e-4 if precision == "float32" else 0.0,
      global_batch_size=GLOBAL_BATCH, num_train_images=GLOBAL_BATCH * 10,
      train_steps=10)


def case_name(precision: str, group_size: int) -> str:
  return f"step_{precision}_g{group_size}"


def build_network(precision: str, cfg: TrainConfig) -> keras.Model:
  """The network of `cfg`: as the flags build it in float32; in float64,
  the same builder under Keras's float64 policy, logits in float64 too (TF
  packs the gradients of one all-reduce into one tensor, which cannot mix
  dtypes; the input normalisation stays float32)."""
  if precision == "float32":
    return resnet.build_model(cfg.model, cfg.distribution)
  previous = keras.config.dtype_policy()
  keras.config.set_dtype_policy(precision)
  try:
    m = cfg.model
    return resnet.build_resnet(m.resnet_depth, m.num_classes, m.image_size,
                               m.bn_group_size, zero_init_gamma=False,
                               logits_dtype=precision)
  finally:
    keras.config.set_dtype_policy(previous)


def batch(precision: str = "float32", seed: int = 0
          ) -> tuple[np.ndarray, np.ndarray]:
  """A global batch of raw 0..255 images and labels (one label -1, which
  weighs 0 on both engines)."""
  rng = np.random.RandomState(seed)
  images = rng.uniform(0, 255, (GLOBAL_BATCH, IMAGE_SIZE, IMAGE_SIZE, 3))
  labels = rng.randint(0, NUM_CLASSES, GLOBAL_BATCH)
  labels[5] = -1
  return images.astype(precision), labels.astype(np.int32)


# Optimizer cases: variables (name, shape) whose names decide LARS's
# adaptation, three steps of gradients, and build_optimizer's arguments.
OPTIMIZER_VARIABLES = (("conv/kernel", (3, 3, 4, 8)), ("bn/gamma", (8,)),
                       ("dense/kernel", (8, 5)), ("dense/bias", (5,)))
OPTIMIZER_STEPS = 3
STEPS_PER_EPOCH = 2
# Large steps (LR 1, trust ratios near 0.1): the updates, not the weights,
# are compared, and they must stand well above float32 rounding.
OPTIMIZER_LEARNING_RATE = 1.0
OPTIMIZERS = {
    "lars": dict(momentum=0.9, weight_decay=1e-4, lars_eta=0.01),
    "lars_nesterov": dict(momentum=0.9, nesterov=True, weight_decay=5e-5,
                          lars_eta=0.02),
    "rmsprop_warmup": dict(momentum=0.9, rmsprop_learning_rate=1e-3,
                           rmsprop_warmup_center_epochs=1.0,
                           rmsprop_warmup_period_epochs=2.0),
    "momentum_correction": dict(momentum=0.9, momentum_correction=True),
    "momentum_correction_nesterov": dict(momentum=0.9, nesterov=True,
                                         momentum_correction=True),
}


def optimizer_name(case: str) -> str:
  return ("lars" if case.startswith("lars") else
          "momentum" if case.startswith("momentum") else case)


def optimizer_clock() -> EpochClock:
  """rmsprop_warmup's clock: two steps an epoch, so three steps cross its
  centre (epoch 1)."""
  return EpochClock(STEPS_PER_EPOCH * 16, ((0, 16),))


def optimizer_data(seed: int = 1):
  """Initial values and the gradients of each step."""
  rng = np.random.RandomState(seed)
  initial = {name: rng.randn(*shape).astype(np.float32)
             for name, shape in OPTIMIZER_VARIABLES}
  grads = [{name: rng.randn(*shape).astype(np.float32) * 0.1
            for name, shape in OPTIMIZER_VARIABLES}
           for _ in range(OPTIMIZER_STEPS)]
  return initial, grads


def optimizer_case(case: str):
  """(variables at their initial values, the optimizer of `case`, the
  gradients of each step). The variables' paths are the names above: LARS
  decides its adaptation from them."""
  initial, grads = optimizer_data()
  variables = [keras.Variable(initial[name], name=name.split("/")[1])
               for name, _ in OPTIMIZER_VARIABLES]
  for variable, (name, _) in zip(variables, OPTIMIZER_VARIABLES):
    variable._path = name
  optimizer = build_optimizer(
      optimizer_name(case), OPTIMIZER_LEARNING_RATE,
      clock=optimizer_clock(), **OPTIMIZERS[case])
  return variables, optimizer, grads
