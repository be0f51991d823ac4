"""The private TensorFlow and Keras APIs the project calls, in one place.

Supported: TensorFlow 2.19.1 (the last TPU build, tensorflow-tpu) to 2.21 with
the Keras each pairs with (requirements*.txt). Each function below wraps one
API that is not covered by TensorFlow's or Keras's compatibility promise;
tests/test_compat.py checks every one of them on each supported version, so
an upgrade that changes one fails there, by name, and not deep in a run.
One more is not a call but an override: DistributedBatchNormalization
replaces Keras's BatchNormalization._moments; tests/test_compat.py checks
that Keras still routes its training statistics through it.
"""
import keras
import numpy as np
import tensorflow as tf

# pylint: disable=g-direct-tensorflow-import
from tensorflow.python.framework import kernels as _kernels
from tensorflow.python.profiler import trace as _trace
from tensorflow.python.profiler.internal import _pywrap_traceme
from tensorflow.python.tpu import tpu_system_metadata as _tpu_system_metadata
from tensorflow.python.util import _pywrap_util_port

# Keras 3's TensorFlow optimizer sums per-replica gradients here, once, in
# apply_gradients (keras/src/backend/tensorflow/optimizer.py).
KERAS_GRADIENT_SUMMATION = "_all_reduce_sum_gradients"


# --- Keras -------------------------------------------------------------------


def replace_gradient_summation(optimizer: keras.optimizers.Optimizer,
                               summation) -> None:
  """Makes `optimizer` sum gradients across replicas with `summation`.

  `summation(grads_and_vars) -> grads_and_vars` takes the place of Keras's
  private `_all_reduce_sum_gradients` for this optimizer object only.
  """
  if not callable(getattr(optimizer, KERAS_GRADIENT_SUMMATION, None)):
    raise ValueError(
        f"{type(optimizer).__name__} has no {KERAS_GRADIENT_SUMMATION} "
        f"(Keras {keras.__version__} changed it): --gradient_all_reduce must "
        "stay auto.")
  setattr(optimizer, KERAS_GRADIENT_SUMMATION, summation)


# --- tf.distribute -----------------------------------------------------------


def strategy_supports_no_merge_call() -> bool:
  """Whether the strategy in scope synchronises without merge_call."""
  return tf.__internal__.distribute.strategy_supports_no_merge_call()


def shift_collective_keys(strategy_class: type, offset: int) -> None:
  """Moves the collective keys of later `strategy_class` objects by `offset`.

  Two MirroredStrategy objects in one process number their collectives from
  the same base; tests that build several shift it, as TensorFlow's own
  strategy_combinations does.
  """
  # pylint: disable-next=protected-access
  strategy_class._collective_key_base += offset


# --- raw V2 collectives (a subgroup of replicas) -----------------------------


def collective_sum(x: tf.Tensor, group_size: int, group_key: int,
                   instance_key: int, ordering_token: tf.Tensor,
                   timeout_seconds: float) -> tf.Tensor:
  """CollectiveReduceV2 (Add): the sum of `x` over the group's members."""
  return tf.raw_ops.CollectiveReduceV2(
      input=x, group_size=group_size, group_key=group_key,
      instance_key=instance_key, ordering_token=[ordering_token],
      merge_op="Add", final_op="Id", timeout_seconds=timeout_seconds)


def collective_all_to_all(x: tf.Tensor, group_size: int, group_key: int,
                          instance_key: int, ordering_token: tf.Tensor,
                          timeout_seconds: float) -> tf.Tensor:
  """CollectiveAllToAllV2: member i gets the i-th row of every member's x."""
  return tf.raw_ops.CollectiveAllToAllV2(
      input=x, group_size=group_size, group_key=group_key,
      instance_key=instance_key, ordering_token=[ordering_token],
      timeout_seconds=timeout_seconds)


def collective_gather(x: tf.Tensor, group_size: int, group_key: int,
                      instance_key: int, ordering_token: tf.Tensor,
                      timeout_seconds: float) -> tf.Tensor:
  """CollectiveGatherV2: the members' `x` concatenated in rank order."""
  return tf.raw_ops.CollectiveGatherV2(
      input=x, group_size=group_size, group_key=group_key,
      instance_key=instance_key, ordering_token=[ordering_token],
      timeout_seconds=timeout_seconds)


def ordering_token(device: str, name: str) -> tf.Tensor:
  """A resource handle on `device` that orders that device's collectives.

  tf.function chains ops sharing a resource in program order (as
  tf.distribute's own collective launcher does with one handle per device).
  """
  with tf.init_scope(), tf.device(device):
    return tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[],
                                  shared_name=name)


# --- tensors -------------------------------------------------------------------


def tensor_buffer(tensor: tf.Tensor) -> np.ndarray:
  """An eager tensor's host buffer as numpy, not copied (the array keeps the
  tensor alive): EagerTensor._numpy(), as flax's imagenet example hands
  tf.data batches to JAX. `.numpy()` copies (TF 2.21), and big_vision's
  `np.asarray(memoryview(x))` refuses bfloat16 (--input_dtype=compute)."""
  return tensor._numpy()  # pylint: disable=protected-access


# --- build and kernel facts ---------------------------------------------------


def onednn_enabled() -> bool:
  """Whether the TensorFlow loaded in this process runs oneDNN's kernels."""
  return bool(_pywrap_util_port.IsMklEnabled())


def has_kernel(op_type: str, device_type: str = "") -> bool:
  """Whether this TensorFlow build registers a kernel of `op_type` (on
  `device_type`, e.g. "CPU", when given); TPU ops have kernels only in
  tensorflow-tpu."""
  registered = _kernels.get_registered_kernels_for_op(op_type).kernel
  return any(not device_type or k.device_type == device_type
             for k in registered)


# --- the profiler's trace check ----------------------------------------------


def restore_trace_check() -> None:
  """Puts TensorFlow's profiler check back where jaxlib 0.6.2, the last JAX
  for Python 3.10, replaced it. In TensorFlow 2.21 the check
  (`tensorflow.python.profiler.trace.enabled`) is a function, which
  convert_to_tensor, tf.Variable and tf.summary call; jaxlib 0.6.2's
  profiler hooks set it to True when a JAX trace starts and to False when
  it stops, as they do for TensorFlow 2.19 (the TPU build), where it is a
  bool that the hooks own (left as it is here). On 2.21 every call then
  raised TypeError: 'bool' object is not callable; jaxlib 0.10.2 does not
  touch it. A no-op where the check is intact."""
  check = getattr(_pywrap_traceme, "traceme_enabled", None)
  if check is not None and not callable(_trace.enabled):
    _trace.enabled = check


# --- graphs without a device (traced, never run) -------------------------------


def tpu_system_metadata(topology: tf.tpu.experimental.Topology,
                        devices: list[tf.config.LogicalDevice]):
  """The TPUSystemMetadata a TPUClusterResolver answers for a slice of
  `topology` with `devices`: what TPUStrategy reads at construction, so a
  strategy over a simulated slice can trace TPU steps without a TPU."""
  hosts, per_host = topology.num_tasks, topology.num_tpus_per_task
  return _tpu_system_metadata.TPUSystemMetadata(
      num_cores=hosts * per_host, num_hosts=hosts,
      num_of_cores_per_host=per_host, topology=topology, devices=devices)


def dataset_graph(dataset: tf.data.Dataset) -> tf.compat.v1.GraphDef:
  """The GraphDef of a tf.data pipeline, its functions included."""
  graph = tf.compat.v1.GraphDef()
  # pylint: disable-next=protected-access
  graph.ParseFromString(dataset._as_serialized_graph().numpy())
  return graph

