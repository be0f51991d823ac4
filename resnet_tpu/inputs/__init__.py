"""From TFRecord shards to batches: the sharded pipeline, preprocessing, record
guards, the shard audit and manifests (Ying et al. 2018 §3.2)."""
