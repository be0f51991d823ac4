"""Developer profilers: where a benchmark's time goes, op by op or by CPU
sample, and the A/B runs behind machine-specific defaults.

Not needed to train, export or reproduce the papers' figures; their tests run
with `make test-dev`, not `make test`. Run as `python -m tools.dev.<name>`.
"""
