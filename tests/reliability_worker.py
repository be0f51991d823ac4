"""main.py with the tiny network of tests/tiny_model.py: a fast worker for
tests/test_multi_worker_failure.py.

Usage (repository root on PYTHONPATH, TF_CONFIG set): the flags of main.py.
"""
from absl import app

import main
from resnet_tpu import trainer
from tiny_model import tiny_resnet

if __name__ == "__main__":
  trainer.build_model = tiny_resnet
  app.run(main.main)
