"""main.py with the tiny network of tests/tiny_model.py: a fast worker for
tests/test_multi_worker_failure.py.

Usage (repository root on PYTHONPATH, TF_CONFIG set): the flags of main.py.
"""
import functools

from absl import app

import main
from tiny_model import tiny_resnet

if __name__ == "__main__":
  app.run(functools.partial(main.main, model_fn=tiny_resnet))
