"""The JSON body of a TensorFlow Serving REST request to an export's
`serve_jpeg` signature, for photos given by path.

  python -m tools.serving_request photo.jpg [more.png ...] > request.json
  curl -d @request.json \
      http://localhost:8501/v1/models/resnet:predict

TensorFlow Serving's REST API takes binary inputs base64-encoded as
{"b64": ...} (tensorflow/serving's docs/api_rest.md, "Encoding binary
values"); the signature's one input is `image_bytes`, one JPEG an instance.
Photos in other formats training takes (PNG, BMP, GIF) are re-encoded as
training's records hold them (tools/predict.as_training_jpeg). The response
lists each instance's `logits`, `probabilities` and `top5_classes` (0-based
class ids; the export's synsets.txt names them).
"""
import base64
import json
import os
import sys

from absl import app
import tensorflow as tf

if not __package__:  # run as a file: the repository's root on the path
  sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir))

from tools.predict import as_training_jpeg

SIGNATURE = "serve_jpeg"
INPUT = "image_bytes"


def request_body(paths: list[str]) -> dict:
  """{"signature_name": "serve_jpeg", "instances": [{"image_bytes":
  {"b64": ...}}, ...]} for the photos at `paths`."""
  instances = []
  for path in paths:
    with tf.io.gfile.GFile(path, "rb") as f:
      jpeg = as_training_jpeg(f.read())
    instances.append({INPUT: {"b64": base64.b64encode(jpeg).decode()}})
  return {"signature_name": SIGNATURE, "instances": instances}


def main(argv: list[str]) -> None:
  if len(argv) < 2:
    raise app.UsageError("Name at least one photo.")
  json.dump(request_body(argv[1:]), sys.stdout)
  sys.stdout.write("\n")


if __name__ == "__main__":
  app.run(main)
