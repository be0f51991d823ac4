"""Developer profilers: where a benchmark's time goes, op by op or by CPU
sample, and the A/B runs behind machine-specific defaults.

Not needed to train, export or reproduce the papers' figures; their tests run
with `make test-lab`, not `make test`. Run as `python -m lab.dev.<name>`.
"""
