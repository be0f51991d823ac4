"""Pre-declared criteria and the verdicts they give, as pure functions.

Each study names its criteria in lab/study_plan.py before any run: which
point is the control, which the treatment, and what the paper claims of
the treatment (Ying et al. 2018 §3.1 for a; Goyal et al. 2017, Ying §3 and
Akiba et al. 2017 for b; Mikami et al. 2018 for c). Seeds are paired: seed
k of the treatment starts from the same initialisation and data order as
seed k of the control. The pooled seed spread is the root mean of the two
points' seed variances; a gap counts only beyond twice that spread.
"""
import dataclasses
import math
import statistics

HELD = "held"
NOT_HELD = "not held"
UNDECIDED = "not decided at this size"
# The two kinds of claim: the treatment is better, or it loses nothing.
HIGHER = "higher"
WITHIN = "within"
# The baseline has converged when top-1 at 75 % of its steps is this close.
CONVERGED_POINTS = 1.0


@dataclasses.dataclass(frozen=True)
class Criterion:
  """What would hold or refute one claim, fixed before the runs.

  claim=HIGHER: held when the treatment's mean metric exceeds the
  control's by more than twice the pooled seed spread; not held when it
  falls short of it by that much; else not decided.
  claim=WITHIN: held when the gap +- twice the spread lies inside
  +-margin (in points of the metric x 100); not held when it lies
  wholly outside; else not decided.
  """
  name: str
  control: tuple[tuple[str, object], ...]
  treatment: tuple[tuple[str, object], ...]
  claim: str = HIGHER
  margin: float = 0.0  # points, WITHIN only
  metric: str = "top1"

  def describe(self) -> str:
    two = "twice the pooled seed spread"
    if self.claim == HIGHER:
      return (f"held if {_label(self.treatment)} beats {_label(self.control)}"
              f" on {self.metric} by more than {two}; not held if it trails "
              f"by more than {two}; else {UNDECIDED}.")
    return (f"held if {_label(self.treatment)} is within {self.margin:g} "
            f"points of {_label(self.control)} on {self.metric} with {two} "
            f"of margin; not held if it is outside by more than {two}; else "
            f"{UNDECIDED}.")


def _label(point: tuple) -> str:
  return ", ".join(f"{k}={v}" for k, v in point)


def pooled_spread(control: list[float], treatment: list[float]) -> float:
  """Root mean of the two seed variances (0 with one seed each)."""
  if len(control) < 2 or len(treatment) < 2:
    return 0.0
  return math.sqrt((statistics.variance(control)
                    + statistics.variance(treatment)) / 2)


def verdict(criterion: Criterion, control: list[float],
            treatment: list[float]) -> dict:
  """The criterion's verdict on per-seed values (fractions, seed-paired).

  One seed measures no spread, so it decides nothing.
  """
  if len(control) != len(treatment) or not control:
    raise ValueError("Paired seeds: control and treatment need the same, "
                     f"non-zero number of runs (got {len(control)} and "
                     f"{len(treatment)}).")
  gap = 100 * statistics.fmean(t - c for c, t in zip(control, treatment))
  spread = 100 * pooled_spread(control, treatment)
  if len(control) < 2:  # no spread measured, nothing decided
    outcome = UNDECIDED
  elif criterion.claim == HIGHER:
    outcome = (HELD if gap > 2 * spread else
               NOT_HELD if gap < -2 * spread else UNDECIDED)
  else:
    outcome = (HELD if abs(gap) + 2 * spread < criterion.margin else
               NOT_HELD if abs(gap) - 2 * spread > criterion.margin else
               UNDECIDED)
  return {"criterion": criterion.name, "rule": criterion.describe(),
          "gap_points": gap, "pooled_spread_points": spread,
          "verdict": outcome}


def convergence(evals: list[tuple[int, float]], total_steps: int) -> dict:
  """Top-1 at 75 % of the steps against the final top-1.

  evals: (step, top1) of the run's evaluations, the final one last.
  """
  final_step, final = evals[-1]
  step, at_75 = min(evals, key=lambda e: abs(e[0] - 0.75 * total_steps))
  gap = 100 * (final - at_75)
  return {"step_at_75": step, "top1_at_75": at_75, "final_step": final_step,
          "final_top1": final, "gain_points": gap,
          "converged": step < final_step and abs(gap) <= CONVERGED_POINTS}


def baseline_convergence(records: list[dict], points: list[tuple]
                         ) -> list[dict]:
  """The convergence check of each baseline point's runs, seed by seed."""
  return [dict(convergence(r["evals"], r["train_steps"]), point=r["point"],
               seed=seed)
          for point in points
          for seed, r in sorted(_by_seed(records, point, "top1").items())]


def _by_seed(records: list[dict], point: tuple, metric: str) -> dict:
  wanted = [list(p) for p in point]
  return {r["seed"]: r for r in records
          if [list(p) for p in r["point"]] == wanted and metric in r}


def decide(criteria: list[Criterion], records: list[dict]) -> list[dict]:
  """Each criterion's verdict on the study's runs, seeds paired, with the
  control's convergence check per seed (records: a `point`, `seed`, the
  metric, `evals` as (step, top1) pairs and `train_steps` each)."""
  out = []
  for criterion in criteria:
    control = _by_seed(records, criterion.control, criterion.metric)
    treatment = _by_seed(records, criterion.treatment, criterion.metric)
    seeds = sorted(set(control) & set(treatment))
    result = verdict(criterion,
                     [control[s][criterion.metric] for s in seeds],
                     [treatment[s][criterion.metric] for s in seeds])
    both = [r for s in seeds for r in (control[s], treatment[s])]
    top = max(r["largest_batch"] for r in both)
    both = [r for r in both if r["largest_batch"] == top]
    checks = [convergence(control[s]["evals"], control[s]["train_steps"])
              for s in seeds]
    result.update(
        seeds=seeds, control_convergence=checks,
        control_converged=all(c["converged"] for c in checks),
        largest_batch=top,
        steps_at_largest_batch=max(
            r["steps_at_largest_batch"] for r in both))
    out.append(result)
  return out
