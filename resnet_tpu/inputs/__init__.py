"""From TFRecord shards to batches (Ying et al. 2018 §3.2).

The sharded, parallel input pipeline, its preprocessing, the guards against
bad records, the audit of damaged shards, the shards' manifest, and the
release of finished iterators beside the run.
"""
