"""The JAX engine's .npz checkpoint store (engines/jax/npz_checkpoints.py), on
small states: what TensorFlow's store gives a run, this one gives too."""
import numpy as np
import pytest

from resnet_tpu import files
from resnet_tpu.config import ConfigError
from resnet_tpu.config import TrainConfig
from resnet_tpu.train.checkpoints import paths
from resnet_tpu.engines.jax.npz_checkpoints import NpzCheckpoints
from resnet_tpu.engines.jax.state import TrainState
from resnet_tpu.train.checkpoints import storage


def _state(step: int, seed: int = 0, width: int = 3) -> TrainState:
  rng = np.random.default_rng(seed)
  return TrainState(
      [rng.normal(size=[width, 2]).astype(np.float32),
       rng.normal(size=[2]).astype(np.float32)],
      [rng.normal(size=[2]).astype(np.float32)],
      [np.asarray(step, np.int64), rng.normal(size=[width, 2])])


def _store(tmp_path, keep: int = 5, width: int = 3) -> NpzCheckpoints:
  cfg = TrainConfig.from_flat(model_dir=str(tmp_path), keep_checkpoints=keep)
  return NpzCheckpoints(cfg, _state(0, width=width), step_index=0)


def _equal(a: TrainState, b: TrainState) -> bool:
  return all(x.dtype == y.dtype and np.array_equal(x, y)
             for group_a, group_b in zip(a, b)
             for x, y in zip(group_a, group_b))


def test_a_restored_state_is_the_saved_one_bit_for_bit(tmp_path):
  store = _store(tmp_path)
  assert store.restore() == (None, None, 0)  # a fresh run
  saved = _state(7, seed=1)
  path = store.save(saved, input_batches=9)
  assert path == f"{tmp_path}/ckpt-7.npz" == store.latest()
  restored_path, restored, input_batches = _store(tmp_path).restore()
  assert restored_path == path and input_batches == 9
  assert _equal(restored, saved)


def test_the_newest_keep_checkpoints_are_kept(tmp_path):
  store = _store(tmp_path, keep=2)
  for step in (1, 2, 3, 4):
    store.save(_state(step), input_batches=step)
  assert files.glob(f"{tmp_path}/ckpt-*") == [f"{tmp_path}/ckpt-3.npz",
                                               f"{tmp_path}/ckpt-4.npz"]


def test_a_save_cut_short_leaves_the_previous_checkpoint_the_latest(
    tmp_path, monkeypatch):
  store = _store(tmp_path)
  store.save(_state(1), input_batches=1)

  real_open = files.open_file

  class FullDisk:
    """A file that takes half of what is written, then fills the disk."""

    def __init__(self, path, mode="r"):
      self._file = real_open(path, mode)

    def __enter__(self):
      return self

    def __exit__(self, *error):
      self._file.close()

    def write(self, data):
      self._file.write(data[:len(data) // 2])
      raise OSError(28, "No space left on device")

  monkeypatch.setattr(files, "open_file", FullDisk)
  with pytest.raises(storage.StorageError, match="No space left on device. "
                     f"The last good checkpoint is {tmp_path}/ckpt-1.npz"):
    store.save(_state(2), input_batches=2)
  monkeypatch.undo()
  assert store.latest() == f"{tmp_path}/ckpt-1.npz"  # not the part
  path, _, input_batches = _store(tmp_path).restore()
  assert (path, input_batches) == (f"{tmp_path}/ckpt-1.npz", 1)


def _damage(path, saved: TrainState) -> None:
  """Flips a byte of `saved`'s first array in its file at `path`: that
  member's CRC-32 fails."""
  data = bytearray(path.read_bytes())
  data[bytes(data).index(saved.trainable[0].tobytes()) + 5] ^= 0xFF
  path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_is_set_aside_and_the_one_before_restored(
    tmp_path):
  store = _store(tmp_path)
  for step in (1, 2):
    store.save(_state(step, seed=step), input_batches=step)
  latest = tmp_path / "ckpt-2.npz"
  _damage(latest, _state(2, seed=2))
  path, state, _ = store.restore()
  assert path == f"{tmp_path}/ckpt-1.npz"
  assert _equal(state, _state(1, seed=1))
  assert (tmp_path / "damaged" / "ckpt-2.npz" / "ckpt-2.npz").is_file()
  assert not latest.exists()


def test_every_checkpoint_damaged_is_a_config_error(tmp_path):
  store = _store(tmp_path)
  store.save(_state(1), input_batches=1)
  (tmp_path / "ckpt-1.npz").write_bytes(b"not a zip")
  with pytest.raises(ConfigError, match="every checkpoint is damaged"):
    store.restore()


def test_another_networks_checkpoint_is_a_config_error(tmp_path):
  _store(tmp_path, width=3).save(_state(1, width=3), input_batches=1)
  with pytest.raises(ConfigError, match="cannot restore .*ckpt-1.npz into "
                     "this run .* its arrays differ"):
    _store(tmp_path, width=4).restore()
  assert (tmp_path / "ckpt-1.npz").exists()  # not taken for damage


def test_a_checkpoint_damaged_again_is_set_aside_beside_the_first(tmp_path):
  store = _store(tmp_path)
  store.save(_state(1), input_batches=1)
  for seed in (2, 3):  # ckpt-2 written, damaged, restored past, rewritten
    store.save(_state(2, seed=seed), input_batches=2)
    _damage(tmp_path / "ckpt-2.npz", _state(2, seed=seed))
    assert store.restore()[0] == f"{tmp_path}/ckpt-1.npz"
  first = tmp_path / "damaged" / "ckpt-2.npz" / "ckpt-2.npz"
  second = tmp_path / "damaged" / "ckpt-2.npz.2" / "ckpt-2.npz"
  assert first.is_file() and second.is_file()
  assert first.read_bytes() != second.read_bytes()  # neither overwritten


class _Unavailable(OSError):
  """What tf.io.gfile raises for a bucket's 503 (tf.errors.UNAVAILABLE)."""
  error_code = 14


def _read_fails(monkeypatch, times: int) -> list[str]:
  """read_npz raises _Unavailable `times` times, then reads; returns the
  paths it was called with."""
  calls, real = [], paths.read_npz

  def read(path):
    calls.append(path)
    if len(calls) <= times:
      raise _Unavailable("503 Service Unavailable")
    return real(path)

  monkeypatch.setattr(paths, "read_npz", read)
  return calls


def _listing(tmp_path) -> list[str]:
  return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))


def test_a_transient_read_error_is_retried_and_moves_nothing(
    tmp_path, monkeypatch):
  _store(tmp_path).save(_state(1), input_batches=1)
  before = _listing(tmp_path)
  calls = _read_fails(monkeypatch, 1)
  store = _store(tmp_path)
  store.retry_delays_s = (0.0,)
  path, state, _ = store.restore()
  assert path == f"{tmp_path}/ckpt-1.npz" and _equal(state, _state(1))
  assert calls == [path, path]
  assert _listing(tmp_path) == before


def test_a_persistent_transient_error_stops_naming_it_and_moves_nothing(
    tmp_path, monkeypatch):
  _store(tmp_path).save(_state(1), input_batches=1)
  before = _listing(tmp_path)
  _read_fails(monkeypatch, 100)
  store = _store(tmp_path)
  store.retry_delays_s = (0.0, 0.0)
  with pytest.raises(storage.CheckpointUnavailable,
                     match=r"ckpt-1.npz: _Unavailable: 503 Service "
                     r"Unavailable \(tried 3 times\).*nothing was moved"):
    store.restore()
  assert _listing(tmp_path) == before
