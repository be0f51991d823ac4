"""Specification of resnet_tpu/export.py and tools/export_savedmodel.py."""
import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf

from data.build_tfrecords import build
from data.make_synthetic import make_synthetic
from resnet_tpu import export
from resnet_tpu.inputs import input_pipeline
from resnet_tpu.inputs import preprocessing
from resnet_tpu.config import InputConfig
from resnet_tpu.config import TrainConfig
from resnet_tpu.model.resnet import build_resnet
from resnet_tpu import config as config_lib
from resnet_tpu.model.resnet import build_model
from resnet_tpu.model.resnet import dtype_policy
from resnet_tpu.optim.optimizers import build_optimizer_from_config

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = 32
CLASSES = 7
TOLERANCE = dict(rtol=1e-4, atol=1e-4)
# Not the default 0.875: serve_jpeg must take the run's own crop.
CROP_FRACTION = 0.6

# Runs in a fresh interpreter: only TensorFlow, never resnet_tpu.
LOADER = """
import json, sys
import numpy as np
import tensorflow as tf
export_dir, inputs_path, outputs_path = sys.argv[1:]
loaded = tf.saved_model.load(export_dir)
inputs = np.load(inputs_path)
outputs = {}
calls = {"serving_default": dict(images=inputs["floats"]),
         "serve_uint8": dict(images=inputs["uint8"]),
         "serve_jpeg": dict(image_bytes=tf.constant(list(inputs["jpegs"])))}
op_types, dtypes = set(), set()
for name, kwargs in calls.items():
  signature = loaded.signatures[name]
  for key, value in signature(**kwargs).items():
    outputs[f"{name}/{key}"] = value.numpy()
  graph = signature.graph.as_graph_def()
  for node in list(graph.node) + [
      n for f in graph.library.function for n in f.node_def]:
    op_types.add(node.op)
    dtypes.update(a.type for a in node.attr.values() if a.type)
for key in ("floats", "uint8"):
  outputs[f"serve/{key}"] = loaded.serve(inputs[key])["logits"].numpy()
np.savez(outputs_path, **outputs)
print(json.dumps({
    "resnet_tpu_imported": any(m.startswith("resnet_tpu")
                               for m in sys.modules),
    "op_types": sorted(op_types), "dtypes": sorted(dtypes),
    "signatures": sorted(loaded.signatures),
    "image_size": int(loaded.image_size.numpy()),
    "label_offset": int(loaded.label_offset.numpy()),
    "eval_crop_fraction": float(loaded.eval_crop_fraction.numpy()),
    "labels_file": loaded.labels_file.asset_path.numpy().decode()}))
"""


def run_python(*args: str, **environ: str) -> str:
  result = subprocess.run([sys.executable, *args], cwd=REPO, text=True,
                          capture_output=True, timeout=120,
                          env={**os.environ, **environ})
  assert result.returncode == 0, result.stderr[-3000:]
  return result.stdout


def randomize(model: keras.Model, seed: int = 0) -> None:
  """Random values in every variable, BN statistics and gammas included.

  A restore that missed any variable (e.g. the BN moving statistics, which
  are 0/1 at initialisation) then changes the outputs.
  """
  rng = np.random.default_rng(seed)
  for v in model.variables:
    value = rng.normal(0, 0.05, v.shape)
    if "moving_variance" in v.path or "gamma" in v.path:
      value = rng.uniform(0.5, 1.5, v.shape)
    v.assign(value.astype(np.float32))


def float32_copy(cfg: TrainConfig, model: keras.Model) -> keras.Model:
  with dtype_policy("float32"):
    reference = build_resnet(cfg.model.resnet_depth, cfg.model.num_classes,
                             cfg.model.image_size)
  reference.set_weights(model.get_weights())
  return reference


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A bfloat16 'run': data, config.json, a trainer-style checkpoint."""
  root = tmp_path_factory.mktemp("export")
  make_synthetic(str(root / "images"), num_classes=CLASSES,
                 images_per_class=1, validation_images_per_class=1,
                 image_size=40)
  build(str(root / "images" / "validation"), str(root / "data"),
        "validation", 1)
  cfg = TrainConfig.from_flat(
      model_dir=str(root / "model"), data_dir=str(root / "data"),
      resnet_depth=18, num_classes=CLASSES, image_size=SIZE,
      precision="bfloat16", bn_group_size=2, train_steps=1,
      num_train_images=CLASSES, eval_crop_fraction=CROP_FRACTION)
  model = build_model(cfg.model, cfg.distribution)
  optimizer = build_optimizer_from_config(cfg.optim, cfg.run,
                                          cfg.distribution)
  optimizer.build(model.trainable_variables)
  randomize(model)
  config_lib.write_config(cfg, export.labels_file(cfg.input.data_dir))
  checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
  tf.train.CheckpointManager(checkpoint, cfg.model_dir, 2).save(
      checkpoint_number=3)
  return root, cfg, float32_copy(cfg, model)


@pytest.fixture(scope="module")
def served(run_dir):
  """Export by the CLI, then the outputs of a fresh TF-only process. The
  CLI runs from a JAX user's shell (KERAS_BACKEND=jax, JAX installed
  beside TensorFlow): the tool chooses TensorFlow's engine itself
  (tools/__init__.py)."""
  root, cfg, reference = run_dir
  export_dir = str(root / "export")
  run_python("-m", "tools.export_savedmodel", f"--model_dir={cfg.model_dir}",
             f"--export_dir={export_dir}", KERAS_BACKEND="jax")
  records = list(tf.data.TFRecordDataset(
      input_pipeline.split_files(cfg.input.data_dir, "validation")))
  jpegs = [tf.train.Example.FromString(r.numpy()).features.feature[
      "image/encoded"].bytes_list.value[0] for r in records]
  rng = np.random.default_rng(1)
  uint8 = rng.integers(0, 256, (3, SIZE, SIZE, 3), dtype=np.uint8)
  inputs = {"floats": rng.uniform(0, 255, (4, SIZE, SIZE, 3)).astype(
      np.float32), "uint8": uint8, "jpegs": np.array(jpegs)}
  np.savez(root / "inputs.npz", **inputs)
  info = json.loads(run_python(
      "-c", LOADER, export_dir, str(root / "inputs.npz"),
      str(root / "outputs.npz")).strip().splitlines()[-1])
  outputs = dict(np.load(root / "outputs.npz"))
  return info, inputs, outputs, reference


def expected(reference: keras.Model, images: np.ndarray) -> dict:
  logits = reference(tf.cast(images, tf.float32), training=False).numpy()
  return {"logits": logits, "probabilities": tf.nn.softmax(logits).numpy(),
          "top5_classes": np.argsort(-logits, axis=1)[:, :5]}


@pytest.mark.parametrize("signature,key", [("serving_default", "floats"),
                                           ("serve_uint8", "uint8")])
def test_image_signatures_equal_keras_inference_on_same_batch(
    served, signature, key):
  _, inputs, outputs, reference = served
  want = expected(reference, inputs[key])
  for name in ("logits", "probabilities"):
    np.testing.assert_allclose(outputs[f"{signature}/{name}"], want[name],
                               **TOLERANCE)
  np.testing.assert_array_equal(outputs[f"{signature}/top5_classes"],
                                want["top5_classes"])


def test_serve_accepts_uint8_and_float32_images(served):
  outputs = served[2]
  np.testing.assert_array_equal(outputs["serve/floats"],
                                outputs["serving_default/logits"])
  np.testing.assert_array_equal(outputs["serve/uint8"],
                                outputs["serve_uint8/logits"])


def eval_images(cfg: TrainConfig, num: int, crop_fraction: float):
  data_dir = cfg.input.data_dir
  dataset = input_pipeline.eval_dataset_fn(
      InputConfig(data_dir, eval_crop_fraction=crop_fraction),
      input_pipeline.split_files(data_dir, "validation"), num, num,
      image_size=SIZE)(tf.distribute.InputContext())
  images, _, mask = next(iter(dataset))
  assert mask.numpy().all()
  return images


def test_serve_jpeg_equals_eval_pipeline_then_keras_model(served, run_dir):
  info, inputs, outputs, reference = served
  _, cfg, _ = run_dir
  num = len(inputs["jpegs"])
  assert info["eval_crop_fraction"] == pytest.approx(CROP_FRACTION)
  want = expected(reference, eval_images(cfg, num, CROP_FRACTION))
  np.testing.assert_allclose(outputs["serve_jpeg/logits"], want["logits"],
                             **TOLERANCE)
  np.testing.assert_array_equal(outputs["serve_jpeg/top5_classes"],
                                want["top5_classes"])
  default_crop = expected(reference, eval_images(
      cfg, num, preprocessing.EVAL_CROP_FRACTION))
  assert not np.allclose(outputs["serve_jpeg/logits"],
                         default_crop["logits"], **TOLERANCE)


def test_export_loads_without_resnet_tpu_and_has_no_collective_op(served):
  info = served[0]
  assert not info["resnet_tpu_imported"]
  assert info["signatures"] == ["serve_jpeg", "serve_uint8",
                                "serving_default"]
  assert not [op for op in info["op_types"]
              if "Collective" in op or "AllReduce" in op or "Nccl" in op]


def test_bfloat16_run_exports_a_float32_graph(served):
  info, _, outputs, _ = served
  assert tf.bfloat16.as_datatype_enum not in info["dtypes"]
  assert outputs["serving_default/logits"].dtype == np.float32


def test_export_carries_image_size_label_offset_and_labels_file(
    served, run_dir):
  info = served[0]
  _, cfg, _ = run_dir
  assert (info["image_size"], info["label_offset"]) == (SIZE, 1)
  with open(info["labels_file"]) as f, open(
      os.path.join(cfg.input.data_dir, export.LABELS_FILE)) as g:
    assert f.read() == g.read()
  assert info["labels_file"].startswith(str(run_dir[0] / "export"))


def test_config_json_records_the_network_and_labels_file(run_dir):
  _, cfg, _ = run_dir
  config = config_lib.read_config(cfg.model_dir)
  assert {k: config[k] for k in ("resnet_depth", "num_classes", "image_size",
                                 "precision", "bn_group_size")} == {
      "resnet_depth": 18, "num_classes": CLASSES, "image_size": SIZE,
      "precision": "bfloat16", "bn_group_size": 2}
  assert config["labels_file"] == os.path.join(cfg.input.data_dir,
                                               "synsets.txt")


def test_named_checkpoint_is_restored_not_the_latest(run_dir):
  root, cfg, reference = run_dir
  config = config_lib.read_config(cfg.model_dir)
  first = export.checkpoint_path(cfg.model_dir)
  model = export.restore_inference_model(config, first)
  randomize(model, seed=5)
  later = tf.train.Checkpoint(model=model).save(str(root / "later" / "ckpt"))
  assert export.checkpoint_path(cfg.model_dir) == first
  named = export.restore_inference_model(
      config, export.checkpoint_path(cfg.model_dir, later))
  images = np.full((1, SIZE, SIZE, 3), 100.0, np.float32)
  np.testing.assert_allclose(named(images, training=False),
                             model(images, training=False), **TOLERANCE)
  assert not np.allclose(named(images, training=False),
                         reference(images, training=False), atol=1e-3)


def test_checkpoint_of_another_architecture_is_refused(run_dir):
  _, cfg, _ = run_dir
  config = dict(config_lib.read_config(cfg.model_dir), resnet_depth=34)
  with pytest.raises(ValueError, match="does not match the ResNet-34"):
    export.restore_inference_model(config,
                                   export.checkpoint_path(cfg.model_dir))


def test_missing_config_or_checkpoint_gives_clear_errors(tmp_path):
  with pytest.raises(ValueError, match="no config.json"):
    export.export_saved_model(str(tmp_path), str(tmp_path / "e"))
  with pytest.raises(ValueError, match="holds no checkpoint"):
    export.checkpoint_path(str(tmp_path))
  with pytest.raises(ValueError, match="is not a checkpoint"):
    export.checkpoint_path(str(tmp_path), str(tmp_path / "ckpt-9"))
