"""lab/run_records.py: a study's runs kept on disk, found again by a second
start, and shared by workers without training a run twice."""
import os
import subprocess
import sys

from lab import study_data
from lab.confirm_plan import SCALE, choice_runs, recipe
from lab.run_records import RecordStore
from lab.study_runner import Runner


def test_a_record_is_found_again_by_its_key(tmp_path):
  store = RecordStore(str(tmp_path))
  assert store.get("a") is None
  store.put("a", {"top1": 0.5})
  assert RecordStore(str(tmp_path)).get("a") == {"top1": 0.5, "key": "a"}
  assert store.get("b") is None


def test_a_lock_is_held_while_its_process_lives_and_taken_over_after(
    tmp_path):
  store = RecordStore(str(tmp_path))
  assert store.claim("a") and not store.claim("a")  # held by this process
  store.release("a")
  child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True)
  gone = int(child.stdout)  # a process that has ended
  with open(store._path("b", ".lock"), "w") as f:
    f.write(str(gone))
  assert store.claim("b")


class _Counting(Runner):
  """A runner whose training is a record of the run's seed, counted."""

  trained: list[int]

  def _train(self, item, key, folder):
    self.trained.append(item.seed)
    return {"top1": item.seed / 10, "study": item.study, "seed": item.seed,
            "point": item.point,
            "test_examples": 1, "steps_per_sec": 1.0, "seconds": 1.0,
            "estimated_seconds": 0.0}


def _runner(tmp_path, records) -> _Counting:
  data = study_data.StudyData(str(tmp_path), 2560, 2000, 10, "x")
  runner = _Counting(data, SCALE, str(tmp_path), str(tmp_path), "cpu", "",
                     records=records)
  runner.trained = []
  return runner


def test_a_second_start_trains_only_what_the_first_did_not(tmp_path):
  runs = choice_runs(_runner(tmp_path, None).base, SCALE, [16.0], recipe())
  store = RecordStore(str(tmp_path / "records"))
  first = _runner(tmp_path, store)
  first.execute_all(runs[:2])
  second = _runner(tmp_path, store)
  records = second.execute_all(runs)
  assert first.trained == [0, 1] and second.trained == [0, 1]
  assert [r["seed"] for r in records] == [r.seed for r in runs]
  assert [r["point"] for r in records] == [r.point for r in runs]


def test_a_run_another_worker_trains_is_waited_for_not_trained(
    tmp_path, monkeypatch):
  runs = choice_runs(_runner(tmp_path, None).base, SCALE, [16.0], recipe())
  store = RecordStore(str(tmp_path / "records"))
  worker = _runner(tmp_path, store)
  other = _runner(tmp_path, None)
  key = worker._key(runs[0])
  with open(store._path(key, ".lock"), "w") as f:
    f.write(str(os.getppid()))  # held by a live process

  def finish_it(seconds):  # the other worker ends while this one waits
    store.put(key, other._train(runs[0], key, ""))
    store.release(key)

  monkeypatch.setattr("lab.study_runner.time.sleep", finish_it)
  records = worker.execute_all(runs)
  assert other.trained == [0]
  assert worker.trained == [r.seed for r in runs[1:]]
  assert records[0]["top1"] == 0.0 and len(records) == len(runs)
