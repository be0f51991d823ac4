"""The training step on JAX: synchronous data parallelism over a device mesh
(Ying et al. 2018 §3), the same per-replica program as
engines/tensorflow/step.py's.

Every device is one replica and takes `global_batch / N` images. Under
`shard_map` each replica runs the Keras model statelessly, computes its loss
scaled by the GLOBAL batch (plus the L2 term over N, as TensorFlow's
ReplicaStep) and differentiates it; its BN layers sum their statistics over
their group with a psum (parallel/jax/bn_all_reduce.py). Then ONE psum over
all replicas carries, as one variadic all-reduce:
- every gradient, summed (the optimizer then updates each replica's copy of
  the weights identically);
- the replica-local BN moving statistics, averaged: what TensorFlow does once
  per host loop (moving_statistics.py), here every step at no extra
  collective (the average is linear, so the result is the same);
- the step's metric sums.
The collectives of a step are thus that one all-reduce and two BN group sums
per BN layer (forward and backward); tests_jax/test_collective_census.py
counts them in the compiled HLO.

Each step also says whether its loss or any summed gradient was NaN/Inf
("nonfinite", computed after the all-reduce, so every replica agrees); a
JAX run stops on such a step (loop_report.check_finite). `evaluate` sums
an eval batch's metrics over the replicas, its padding masked out.

With --skip_nonfinite_steps such a step leaves no trace instead: the
weights, the optimizer's variables (its step count among them) and the BN
moving statistics keep their values, as ReplicaStep's
_apply_if_finite. --precision=float16 scales the loss by the state's S
and unscales the summed gradients; a step that overflows is skipped the
same way, and S follows loss_scaling.next_scale (halved, or doubled after
its growth steps), as on TensorFlow (loss_scale.py).

Batch-size control (Mikami et al. 2018; `accumulated_step`): a larger
global batch is k micro-batches of the fixed one, stacked [k, b, ...]. Each
replica sums its gradients over them in one lax.scan (its loss scaled by k
global batches, and the L2 term by k), carrying the BN moving statistics
through them in order, as ReplicaStep.accumulate; then the same
one all-reduce and one update. BN statistics stay per micro-batch.

--bn_stats=recompute (Akiba et al. 2017; `recompute_statistics`): batches
run forward in training mode with every BN layer adding its local [sum, sum
of squares, count] to a sink (distributed_batch_norm.collect_statistics, as
engines/tensorflow/bn_recompute.py on TensorFlow), summed over all replicas and
batches; the moving mean and variance become those exact statistics.
"""
import functools

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec
import keras
from keras import ops
import numpy as np

from resnet_tpu.engines.jax.state import decayed_indices
from resnet_tpu.engines.jax.state import LossConfig
from resnet_tpu.engines.jax.state import replica_local_indices
from resnet_tpu.engines.jax.state import TrainState
from resnet_tpu.model.batch_statistics import moments_from_sums
from resnet_tpu.model.distributed_batch_norm import collect_statistics
from resnet_tpu.model.distributed_batch_norm import (
    DistributedBatchNormalization)
from resnet_tpu.parallel.jax.bn_all_reduce import REPLICA_AXES
from resnet_tpu.train.loss import losses_and_hits
from resnet_tpu.train.loss_scaling import next_scale

METRICS = ("loss", "top1", "top5", "examples")


def replica_count() -> int:
  """The number of replicas the step runs over, read from its mapped axes
  (a mesh's under shard_map, or vmap's virtual replicas)."""
  return jax.lax.psum(1, REPLICA_AXES)


class JaxTrainStep:
  """One training step of `model` and `optimizer` over `mesh`'s devices.

  `state()` reads the variables' values, `step(state, images, labels)` (one
  jitted call) returns the next state and the step's metric sums over all
  replicas (METRICS and "nonfinite"), `write_back(state)` puts values into
  the Keras variables; `gradients(state, images, labels)` is the step
  without its update; `evaluate(state, images, labels, mask)` an eval
  batch's METRICS sums, in inference mode.
  """

  def __init__(self, model: keras.Model,
               optimizer: keras.optimizers.Optimizer,
               mesh: jax.sharding.Mesh, loss: LossConfig,
               skip_nonfinite: bool = False,
               loss_scale: tuple[float, int] | None = None):
    """skip_nonfinite: --skip_nonfinite_steps; loss_scale: float16's
    (initial S, growth steps), None without loss scaling."""
    if keras.backend.backend() != "jax":
      raise RuntimeError("JaxTrainStep needs KERAS_BACKEND=jax.")
    if loss.global_batch_size % mesh.size:
      raise ValueError(f"the global batch ({loss.global_batch_size}) must "
                       f"divide over the {mesh.size} devices.")
    self.model = model
    self.optimizer = optimizer
    self.mesh = mesh
    self.loss = loss
    self.loss_scale = loss_scale
    self.skip_nonfinite = skip_nonfinite or loss_scale is not None
    optimizer.build(model.trainable_variables)
    self.decayed = decayed_indices(model) if loss.weight_decay else []
    self.replica_local = replica_local_indices(model)
    replicated = PartitionSpec()
    batch = PartitionSpec(REPLICA_AXES)
    self.replicated = NamedSharding(mesh, replicated)
    self.batch_sharding = NamedSharding(mesh, batch)
    # check_vma=False: each replica differentiates its own loss, and the
    # one psum below sums the gradients (with check_vma the transpose of
    # the replicated weights' broadcast would sum them once more).
    per_replica = functools.partial(
        jax.shard_map, mesh=mesh, in_specs=(replicated, batch, batch),
        out_specs=replicated, check_vma=False)
    self.step = jax.jit(per_replica(self._replica_step), donate_argnums=0)
    # k micro-batches stacked on a leading axis (batch-size control).
    stacked = PartitionSpec(None, REPLICA_AXES)
    self.stacked_sharding = NamedSharding(mesh, stacked)
    self.accumulated_step = jax.jit(jax.shard_map(
        self._replica_step, mesh=mesh, in_specs=(replicated, stacked, stacked),
        out_specs=replicated, check_vma=False), donate_argnums=0)
    # The summed gradients alone, without the update (tests, debugging).
    self.gradients = jax.jit(per_replica(self._replica_gradients))
    self.bn_layers = [layer for layer in model.layers if isinstance(
        layer, DistributedBatchNormalization)]
    # Each BN layer's statistics sink (plain variables, not the model's).
    self._sinks = [keras.Variable(np.zeros(2 * layer.moving_mean.shape[0]
                                           + 1, np.float32),
                                  trainable=False, name=f"{layer.name}_sums")
                   for layer in self.bn_layers]
    self.statistics = jax.jit(jax.shard_map(
        self._replica_statistics, mesh=mesh, in_specs=(replicated, batch),
        out_specs=replicated, check_vma=False))
    self.evaluate = jax.jit(jax.shard_map(
        self._replica_eval, mesh=mesh,
        in_specs=(replicated, batch, batch, batch), out_specs=replicated))

  def state(self) -> TrainState:
    """The variables' current values, replicated on every device (of
    every process: each must hold the same values)."""
    scale = ([np.float32(self.loss_scale[0]), np.int32(0)]
             if self.loss_scale else ())
    return self.replicate(TrainState(
        [v.value for v in self.model.trainable_variables],
        [v.value for v in self.model.non_trainable_variables],
        [v.value for v in self.optimizer.variables], scale))

  def replicate(self, state: TrainState) -> TrainState:
    """`state`'s values (host or device arrays, the same in every process)
    replicated on every device of the mesh. No loss scale is always () (a
    restored state's empty list too): a jitted step is traced for one
    structure."""
    state = state._replace(loss_scale=list(state.loss_scale)
                           if len(state.loss_scale) else ())
    return jax.device_put(jax.tree.map(np.asarray, state), self.replicated)

  def shard_batch(self, *arrays):
    """This process's share of a global batch's arrays, split over its
    replicas: one global array each, in device order (one process: the
    whole batch); a jax.Array is already there (prefetch.py)."""
    return tuple(a if isinstance(a, jax.Array) else
                 jax.make_array_from_process_local_data(
                     self.batch_sharding, np.asarray(a)) for a in arrays)

  def shard_micro_batches(self, *arrays):
    """As shard_batch, for arrays of k stacked micro-batches [k, b, ...]
    (accumulated_step)."""
    return tuple(jax.make_array_from_process_local_data(
        self.stacked_sharding, np.asarray(a)) for a in arrays)

  def write_back(self, state: TrainState) -> None:
    """Sets the Keras variables to `state` (to save or evaluate)."""
    for variables, values in (
        (self.model.trainable_variables, state.trainable),
        (self.model.non_trainable_variables, state.non_trainable),
        (self.optimizer.variables, state.optimizer)):
      for variable, value in zip(variables, values):
        variable.assign(value)

  def _replica_loss(self, trainable, non_trainable, images, labels,
                    micro_batches: int = 1, scale=1.0):
    logits, non_trainable = self.model.stateless_call(
        trainable, non_trainable, images, training=True)
    per_example, top1, top5, weight = losses_and_hits(
        logits, labels, self.loss.num_classes, self.loss.label_smoothing)
    # Scaled by the GLOBAL batch (of all micro-batches): the gradients are
    # summed over replicas (and micro-batches).
    loss = ops.sum(per_example) / (self.loss.global_batch_size *
                                   micro_batches)
    if self.decayed:
      l2 = sum(ops.sum(ops.square(trainable[i])) / 2 for i in self.decayed)
      loss += self.loss.weight_decay * l2 / (replica_count() * micro_batches)
    sums = ops.stack([ops.sum(per_example), ops.sum(top1), ops.sum(top5),
                      ops.sum(weight)])
    # float16: scaled so that small gradients do not underflow.
    return loss * scale, (non_trainable, sums)

  def _replica_gradients(self, state: TrainState, images, labels):
    """The gradients summed over all replicas, the non-trainable variables
    with the moving statistics averaged, and the metric sums."""
    grads, non_trainable, sums = self._local_gradients(state, images,
                                                       labels)
    local = [non_trainable[i] / replica_count() for i in self.replica_local]
    # One all-reduce: gradients, moving statistics and metric sums.
    grads, local, sums = jax.lax.psum((grads, local, sums), REPLICA_AXES)
    for i, value in zip(self.replica_local, local):
      non_trainable[i] = value
    if self.loss_scale:
      grads = [g / state.loss_scale[0] for g in grads]
    return grads, non_trainable, sums

  def _local_gradients(self, state: TrainState, images, labels):
    """This replica's gradients, non-trainable variables and metric sums,
    before the all-reduce; for k stacked micro-batches, their sums, the
    non-trainable variables carried through them in order."""
    grad_fn = jax.grad(self._replica_loss, has_aux=True)
    if images.ndim == 4:  # one batch [b, S, S, 3]
      scale = state.loss_scale[0] if self.loss_scale else 1.0
      grads, (non_trainable, sums) = grad_fn(
          state.trainable, state.non_trainable, images, labels, 1, scale)
      return grads, non_trainable, sums
    micro_batches = images.shape[0]

    def one(carry, batch):
      grads, non_trainable, sums = carry
      more, (non_trainable, more_sums) = grad_fn(
          state.trainable, non_trainable, *batch, micro_batches)
      return (jax.tree.map(ops.add, grads, more), non_trainable,
              sums + more_sums), None

    start = (jax.tree.map(ops.zeros_like, state.trainable),
             state.non_trainable, ops.zeros([len(METRICS)], "float32"))
    (grads, non_trainable, sums), _ = jax.lax.scan(one, start,
                                                   (images, labels))
    return grads, non_trainable, sums

  def _replica_step(self, state: TrainState, images, labels):
    grads, non_trainable, sums = self._replica_gradients(state, images,
                                                         labels)
    trainable, optimizer = self.optimizer.stateless_apply(
        state.optimizer, grads, state.trainable)
    finite = ops.all(ops.stack([ops.all(ops.isfinite(g))
                                for g in [sums[0]] + list(grads)]))
    metrics = dict(zip(METRICS, ops.unstack(sums)))
    metrics["nonfinite"] = 1.0 - ops.cast(finite, "float32")
    new = TrainState(list(trainable), list(non_trainable), list(optimizer),
                     state.loss_scale)
    if self.skip_nonfinite:  # `finite` is the same on every replica
      new = jax.tree.map(lambda n, old: ops.where(finite, n, old), new,
                         state)
    if self.loss_scale:
      new = new._replace(loss_scale=list(next_scale(
          *state.loss_scale, finite, self.loss_scale[1])))
    return new, metrics

  def recompute_statistics(self, state: TrainState, batches) -> TrainState:
    """`state` with every BN layer's moving mean and variance set to the
    exact statistics of `batches` (this process's images of each global
    batch) under its weights, in training mode (Akiba et al. 2017)."""
    total = None
    for images in batches:
      sums = self.statistics(state, *self.shard_batch(images))
      total = sums if total is None else jax.tree.map(ops.add, total, sums)
    paths = [v.path for v in self.model.non_trainable_variables]
    non_trainable = list(state.non_trainable)
    for layer, sums in zip(self.bn_layers, total):
      mean, variance = moments_from_sums(sums)
      for variable, value in ((layer.moving_mean, mean),
                              (layer.moving_variance, variance)):
        non_trainable[paths.index(variable.path)] = ops.cast(
            value, variable.dtype)
    return state._replace(non_trainable=non_trainable)

  def _replica_statistics(self, state: TrainState, images):
    """Every BN layer's [sum, sum of squares, count] of `images` in
    training mode, summed over all replicas."""
    mapping = (list(zip(self.model.trainable_variables, state.trainable)) +
               list(zip(self.model.non_trainable_variables,
                        state.non_trainable)) +
               [(sink, ops.zeros_like(sink.value)) for sink in self._sinks])
    with collect_statistics(self.bn_layers, self._sinks):
      with keras.StatelessScope(state_mapping=mapping) as scope:
        self.model(images, training=True)
      sums = [scope.get_current_value(sink) for sink in self._sinks]
    return jax.lax.psum(sums, REPLICA_AXES)

  def _replica_eval(self, state: TrainState, images, labels, mask):
    logits, _ = self.model.stateless_call(
        state.trainable, state.non_trainable, images, training=False)
    per_example, top1, top5, _ = losses_and_hits(
        logits, labels, self.loss.num_classes, self.loss.label_smoothing)
    mask = ops.cast(mask, "float32")
    sums = ops.stack([ops.sum(v * mask) for v in (per_example, top1, top5)]
                     + [ops.sum(mask)])
    return dict(zip(METRICS, ops.unstack(
        jax.lax.psum(sums, REPLICA_AXES))))
