"""The epoch clock: global steps to epochs and global batches, TF-free.

Mikami et al. 2018 change the global batch during training ("batch-size
control"): a batch-size schedule of (start_epoch, global_batch) phases maps
each global step to its epoch and its global batch. Plain Python, so the
config (config/parts.py) builds a clock before TensorFlow loads; the tensor
forms used inside a step are in optim/schedules.py.
"""
import dataclasses
import math

BatchSizeSchedule = tuple[tuple[int, int], ...]


def parse_batch_size_schedule(text: str) -> BatchSizeSchedule:
  """Parses "0:16384,30:32768" into ((0, 16384), (30, 32768)).

  Each item is start_epoch:global_batch (Mikami et al. 2018 batch-size
  control); the first phase starts at epoch 0 and epochs increase.
  """
  pairs = []
  for item in text.split(","):
    fields = item.strip().split(":")
    try:
      epoch, batch = (int(f) for f in fields)
    except ValueError:
      raise ValueError(
          f"--batch_size_schedule: expected comma-separated "
          f"start_epoch:global_batch integers like '0:16384,30:32768', "
          f"got item {item!r} in {text!r}") from None
    pairs.append((epoch, batch))
  schedule = tuple(pairs)
  validate_batch_size_schedule(schedule)
  return schedule


def validate_batch_size_schedule(schedule: BatchSizeSchedule) -> None:
  """Raises ValueError unless phases start at 0, increase and are > 0."""
  if not schedule or schedule[0][0] != 0:
    raise ValueError(
        f"--batch_size_schedule: the first phase must start at epoch 0, got "
        f"{schedule!r}")
  epochs = [epoch for epoch, _ in schedule]
  if any(b <= a for a, b in zip(epochs, epochs[1:])):
    raise ValueError(
        f"--batch_size_schedule: start epochs must strictly increase, got "
        f"{schedule!r}")
  if any(batch <= 0 for _, batch in schedule):
    raise ValueError(
        f"--batch_size_schedule: global batch sizes must be positive, got "
        f"{schedule!r}")


@dataclasses.dataclass(frozen=True)
class EpochClock:
  """Maps a global step to the epoch and the global batch of that step.

  Phase i runs at batch B_i from epoch e_i for ceil((e_{i+1} - e_i) * N / B_i)
  steps (N = images per epoch); inside it, epoch = e_i + (step - s_i) * B_i / N
  where s_i is the phase's first step.
  """
  images_per_epoch: int
  batch_size_schedule: BatchSizeSchedule

  def __post_init__(self):
    if self.images_per_epoch <= 0:
      raise ValueError(
          f"images_per_epoch must be positive, got {self.images_per_epoch}")
    validate_batch_size_schedule(self.batch_size_schedule)

  def phase_start_steps(self) -> tuple[int, ...]:
    """The first global step of each batch-size phase."""
    starts = [0]
    for (epoch, batch), (next_epoch, _) in zip(self.batch_size_schedule,
                                               self.batch_size_schedule[1:]):
      images = (next_epoch - epoch) * self.images_per_epoch
      starts.append(starts[-1] + math.ceil(images / batch))
    return tuple(starts)

  def _phase_at_step(self, step: int) -> int:
    return max(i for i, start in enumerate(self.phase_start_steps())
               if step >= start)

  def global_batch_at_step(self, step: int) -> int:
    """The global batch the input pipeline must deliver at `step`."""
    return self.batch_size_schedule[self._phase_at_step(step)][1]

  def steps_for_epochs(self, epochs: float) -> int:
    """The number of steps after which `epochs` epochs have been seen."""
    starts = self.phase_start_steps()
    phase = max(i for i, (epoch, _) in enumerate(self.batch_size_schedule)
                if epochs >= epoch)
    start_epoch, batch = self.batch_size_schedule[phase]
    images = (epochs - start_epoch) * self.images_per_epoch
    return starts[phase] + math.ceil(images / batch)

  def epoch_of_step(self, step: int) -> float:
    """Fractional epoch at `step`, in plain Python: no TensorFlow op runs,
    so pre-flight code may call it before a multi-worker strategy starts."""
    result = 0.0
    for start, (epoch, batch) in zip(self.phase_start_steps(),
                                     self.batch_size_schedule):
      if step >= start:
        result = epoch + (step - start) * batch / self.images_per_epoch
    return result
