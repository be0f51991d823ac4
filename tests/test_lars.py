"""LARS (You et al. 2017; Ying et al. 2018 §3) against a numpy reference."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import cpu_strategy
from resnet_tpu.optim.lars import LARS, uses_layer_adaptation
from resnet_tpu.optim.optimizers import build_optimizer, weight_decay_in_loss

MOMENTUM = 0.9
WEIGHT_DECAY = 0.01
ETA = 0.02


def numpy_lars_step(w, v, g, lr, *, adapted, nesterov):
  """tensorflow/tpu's LARSOptimizer + apply_momentum, written out in numpy."""
  if adapted:
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    trust = (ETA * w_norm / (g_norm + WEIGHT_DECAY * w_norm)
             if w_norm > 0 and g_norm > 0 else 1.0)
    g = g + WEIGHT_DECAY * w
    lr = lr * trust
  v = MOMENTUM * v + lr * g
  w = w - (lr * g + MOMENTUM * v if nesterov else v)
  return w, v


def make_lars(nesterov=False, learning_rate=0.5):
  return LARS(learning_rate, momentum=MOMENTUM, nesterov=nesterov,
              weight_decay_rate=WEIGHT_DECAY, eta=ETA)


def test_bn_gamma_beta_and_biases_are_not_adapted_kernels_are():
  model = keras.Sequential([
      keras.Input((8, 8, 3)),
      keras.layers.Conv2D(4, 3, name="conv1"),
      keras.layers.BatchNormalization(name="conv1_bn"),
      keras.layers.Flatten(),
      keras.layers.Dense(2, name="logits"),
  ], name="net")
  optimizer = make_lars()
  optimizer.build(model.trainable_variables)
  adapted = {v.path: optimizer.is_adapted(v)
             for v in model.trainable_variables}
  assert adapted == {
      "net/conv1/kernel": True, "net/conv1/bias": False,
      "net/conv1_bn/gamma": False, "net/conv1_bn/beta": False,
      "net/logits/kernel": True, "net/logits/bias": False,
  }


def test_exclusion_list_matches_path_substrings_of_any_rank():
  assert uses_layer_adaptation("block1/conv/kernel", 2)
  assert not uses_layer_adaptation("block1/conv/kernel", 1)
  assert not uses_layer_adaptation("Block1_BN/scale", 2)
  assert not uses_layer_adaptation("head/kernel", 2, exclude=("head",))
  assert uses_layer_adaptation("head/kernel", 2, exclude=())


@pytest.mark.parametrize("nesterov", [False, True])
def test_matches_numpy_reference_over_4_steps(nesterov):
  rng = np.random.default_rng(0)
  initial = {
      "kernel": rng.normal(size=(4, 3)).astype(np.float32),
      "zero_kernel": np.zeros((3, 3), np.float32),  # ||w|| = 0: trust 1.
      "bias": rng.normal(size=(3,)).astype(np.float32),
      "offset": rng.normal(size=(3,)).astype(np.float32),  # Rank 1.
      "layer_gamma": rng.normal(size=(2, 3)).astype(np.float32),
  }
  adapted = {"kernel": True, "zero_kernel": True, "bias": False,
             "offset": False, "layer_gamma": False}
  variables = {k: keras.Variable(v, name=k) for k, v in initial.items()}
  optimizer = make_lars(nesterov)
  optimizer.build(list(variables.values()))
  assert {k: optimizer.is_adapted(v) for k, v in variables.items()} == adapted

  expected = {k: (v.copy(), np.zeros_like(v)) for k, v in initial.items()}
  for step in range(4):
    grads = {k: rng.normal(size=v.shape).astype(np.float32)
             for k, v in initial.items()}
    if step == 1:
      grads["kernel"][:] = 0.0  # ||g|| = 0: trust 1.
    optimizer.apply_gradients(
        [(tf.constant(grads[k]), variables[k]) for k in variables])
    for k in expected:
      expected[k] = numpy_lars_step(*expected[k], grads[k], 0.5,
                                    adapted=adapted[k], nesterov=nesterov)
      np.testing.assert_allclose(variables[k].numpy(), expected[k][0],
                                 rtol=1e-5, atol=1e-6, err_msg=k)


def test_8_replicas_match_numpy_on_the_summed_gradient():
  num_replicas, per_replica, steps = 8, 4, 3
  global_batch = num_replicas * per_replica
  rng = np.random.default_rng(1)
  x = rng.normal(size=(steps, global_batch, 5)).astype(np.float32)
  y = rng.normal(size=(steps, global_batch, 2)).astype(np.float32)
  kernel0 = rng.normal(size=(5, 2)).astype(np.float32)
  bias0 = rng.normal(size=(2,)).astype(np.float32)

  strategy = cpu_strategy(num_replicas)
  with strategy.scope():
    kernel = keras.Variable(kernel0, name="kernel")
    bias = keras.Variable(bias0, name="bias")
    optimizer = make_lars(nesterov=True, learning_rate=0.3)
    optimizer.build([kernel, bias])

  @tf.function
  def train_step(x_step, y_step):
    def replica_fn():
      i = tf.distribute.get_replica_context().replica_id_in_sync_group
      xs = x_step[i * per_replica:(i + 1) * per_replica]
      ys = y_step[i * per_replica:(i + 1) * per_replica]
      with tf.GradientTape() as tape:
        residual = tf.matmul(xs, kernel) + bias - ys
        # Scaled by the GLOBAL batch: Keras sums gradients over replicas.
        loss = 0.5 * tf.reduce_sum(residual**2) / global_batch
      grads = tape.gradient(loss, [kernel.value, bias.value])
      optimizer.apply_gradients(zip(grads, [kernel, bias]))
    strategy.run(replica_fn)

  w, vw, b, vb = kernel0, np.zeros_like(kernel0), bias0, np.zeros_like(bias0)
  for step in range(steps):
    train_step(tf.constant(x[step]), tf.constant(y[step]))
    residual = x[step] @ w + b - y[step]
    grad_w = x[step].T @ residual / global_batch
    grad_b = residual.sum(axis=0) / global_batch
    w, vw = numpy_lars_step(w, vw, grad_w, 0.3, adapted=True, nesterov=True)
    b, vb = numpy_lars_step(b, vb, grad_b, 0.3, adapted=False, nesterov=True)
  for replica_value in strategy.experimental_local_results(kernel.value):
    np.testing.assert_allclose(replica_value.numpy(), w, rtol=1e-5, atol=1e-6)
  for replica_value in strategy.experimental_local_results(bias.value):
    np.testing.assert_allclose(replica_value.numpy(), b, rtol=1e-5, atol=1e-6)


def _model_and_optimizer():
  model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
  model.set_weights([np.arange(6, dtype=np.float32).reshape(3, 2) / 6,
                     np.ones(2, np.float32)])
  optimizer = make_lars()
  optimizer.build(model.trainable_variables)
  return model, optimizer


def _train(model, optimizer, steps):
  for step in range(steps):
    grads = [tf.fill(v.shape, 0.1 * (step + 1))
             for v in model.trainable_variables]
    optimizer.apply_gradients(zip(grads, model.trainable_variables))


def test_checkpoint_round_trip_restores_momentum_and_continues_identically(
    tmp_path):
  model, optimizer = _model_and_optimizer()
  _train(model, optimizer, 2)
  path = tf.train.Checkpoint(model=model, optimizer=optimizer).save(
      str(tmp_path / "ckpt"))
  _train(model, optimizer, 2)

  restored_model, restored_optimizer = _model_and_optimizer()
  tf.train.Checkpoint(model=restored_model,
                      optimizer=restored_optimizer).restore(
                          path).assert_consumed()
  assert int(restored_optimizer.iterations.numpy()) == 2
  assert np.abs(restored_optimizer.momentums[0].numpy()).sum() > 0
  _train(restored_model, restored_optimizer, 2)
  for a, b in zip(model.get_weights(), restored_model.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_config_round_trip_and_base_weight_decay_is_refused():
  optimizer = LARS(0.2, momentum=0.8, nesterov=True, weight_decay_rate=5e-5,
                   eta=0.003, exclude_from_adaptation=("head",))
  config = optimizer.get_config()
  assert LARS.from_config(config).get_config() == config
  with pytest.raises(ValueError, match="weight_decay_rate"):
    LARS(0.1, weight_decay=1e-4)


def test_build_optimizer_lars_decays_in_the_update_momentum_in_the_loss():
  lars = build_optimizer("lars", 0.1, momentum=0.8, nesterov=True,
                         weight_decay=5e-5, lars_eta=0.002)
  assert isinstance(lars, LARS)
  assert (lars.momentum, lars.nesterov, lars.weight_decay_rate, lars.eta) == (
      0.8, True, 5e-5, 0.002)
  assert not weight_decay_in_loss("lars")

  sgd = build_optimizer("momentum", 0.1, momentum=0.8, nesterov=True)
  assert isinstance(sgd, keras.optimizers.SGD)
  assert (sgd.momentum, sgd.nesterov, sgd.weight_decay) == (0.8, True, None)
  assert weight_decay_in_loss("momentum")
