"""The run's metrics log: `<model_dir>/metrics.jsonl`, one JSON object a line.

Each line has at least step, split ("train"|"eval"), loss, top1, top5,
examples, images_per_sec and elapsed_s; TensorBoard gets the same scalars
where TensorFlow is installed (a JAX run without it writes metrics.jsonl
alone, and says so once: tools/plot_metrics.py reads it).
A host loop that trained on no example (every step skipped) has no loss,
top1 or top5 (loop_report.train_record).
"""
import json
import os

from absl import logging

from resnet_tpu import files
from resnet_tpu.train.checkpoints import storage

REQUIRED_KEYS = ("step", "split", "loss", "top1", "top5", "examples",
                 "images_per_sec", "elapsed_s")
# What a record of no examples has no value for.
OF_EXAMPLES = ("loss", "top1", "top5")


class MetricsLog:
  """Appends metric records to metrics.jsonl and TensorBoard summaries."""

  def __init__(self, model_dir: str, enabled: bool = True):
    self.enabled = enabled
    if enabled:
      files.makedirs(model_dir)
    self.path = os.path.join(model_dir, "metrics.jsonl")
    self._writers = {}
    self._model_dir = model_dir
    self._summaries = files.tensorflow_installed()
    if enabled and not self._summaries:
      logging.info("No TensorBoard summaries: TensorFlow writes them and is "
                   "not installed; the metrics go to %s alone.", self.path)

  def _summarize(self, record: dict) -> None:
    """The record's numbers as TensorBoard scalars of its split."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
    split = record["split"]
    if split not in self._writers:
      self._writers[split] = tf.summary.create_file_writer(
          os.path.join(self._model_dir, split))
    with self._writers[split].as_default(step=record["step"]):
      for key, value in record.items():
        if key not in ("step", "split") and isinstance(value, (int, float)):
          tf.summary.scalar(key, value)

  def write(self, record: dict) -> None:
    missing = [k for k in REQUIRED_KEYS if k not in record and not (
        k in OF_EXAMPLES and record.get("examples") == 0)]
    if missing:
      raise ValueError(f"metrics record lacks {missing}: {record}")
    if not self.enabled:
      return
    storage.written("a metrics record", self.path, self._model_dir,
                    lambda: self._append(record))

  def _append(self, record: dict) -> None:
    with files.open_file(self.path, "a") as f:
      f.write(json.dumps(record) + "\n")
    if self._summaries:
      self._summarize(record)

  def drop_after(self, step: int) -> int:
    """Removes records of steps after `step` (a resumed run redoes them).

    Returns how many were removed.
    """
    if not self.enabled or not files.exists(self.path):
      return 0
    records = read_metrics(self._model_dir)
    kept = [r for r in records if r["step"] <= step]
    if len(kept) < len(records):
      with files.open_file(self.path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in kept))
    return len(records) - len(kept)

  def flush(self) -> None:
    for split, writer in self._writers.items():
      storage.written("TensorBoard summaries",
                      os.path.join(self._model_dir, split), self._model_dir,
                      writer.flush)


def read_metrics(model_dir: str) -> list[dict]:
  """All records of `<model_dir>/metrics.jsonl`, in order."""
  path = os.path.join(model_dir, "metrics.jsonl")
  with files.open_file(path) as f:
    return [json.loads(line) for line in f if line.strip()]
