"""The network: ResNet v1.5, distributed and recomputed batch norm, bfloat16
convolutions."""
