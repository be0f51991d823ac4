"""The training loop, engine-neutral: cadence, records, stops, checkpoints.

loop.py runs a run's host loops, evals and saves and stops it on SIGTERM,
NaN/Inf, stalls or a lost peer, written once for both engines; engine.py is
what it asks of an engine (engines/). loss.py is the one loss and accuracy
of both engines' steps; loop_report.py, metrics_log.py, cadence.py and
preemption.py are what the loop reports, writes, schedules and stops on;
checkpoints/ holds the checkpoint files of both engines and the writes that
must not fail silently.
"""
