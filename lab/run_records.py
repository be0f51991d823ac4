"""Study run records kept on disk: a study resumes, and workers share one.

A record is stored as JSON under the SHA-1 of its run's key (the path, the
stock side's features and zoom, and every setting: study_runner.Runner's
_key) in one folder. A worker takes a run's lock (a file created
exclusively, holding its process id) before training it; another worker
passes a locked run by and comes back to it, and takes over a lock whose
process is gone. Records are written whole (a temporary file renamed).
"""
import hashlib
import json
import os


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class RecordStore:
  """The records and locks of one folder."""

  def __init__(self, folder: str):
    self.folder = folder
    os.makedirs(folder, exist_ok=True)

  def _path(self, key: str, suffix: str = ".json") -> str:
    name = hashlib.sha1(key.encode()).hexdigest()
    return os.path.join(self.folder, name + suffix)

  def get(self, key: str) -> dict | None:
    """The stored record of `key`, or None."""
    path = self._path(key)
    if not os.path.exists(path):
      return None
    with open(path) as f:
      return json.load(f)

  def put(self, key: str, record: dict) -> None:
    """Stores `record` under `key`."""
    path = self._path(key)
    with open(path + ".tmp", "w") as f:
      json.dump(dict(record, key=key), f)
    os.replace(path + ".tmp", path)

  def claim(self, key: str) -> bool:
    """Takes `key`'s lock; False while a live process holds it."""
    lock = self._path(key, ".lock")
    for _ in range(2):
      try:
        handle = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
      except FileExistsError:
        try:
          with open(lock) as f:
            holder = int(f.read() or 0)
        except (FileNotFoundError, ValueError):
          holder = 0
        if not holder or _alive(holder):  # empty: being written
          return False
        try:
          os.remove(lock)  # its process is gone: take it over
        except FileNotFoundError:
          pass
        continue
      with os.fdopen(handle, "w") as f:
        f.write(str(os.getpid()))
      return True
    return False

  def release(self, key: str) -> None:
    try:
      os.remove(self._path(key, ".lock"))
    except FileNotFoundError:
      pass
