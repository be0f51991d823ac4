"""lab/allreduce_sim.py: exact execution on small tori pins the cost model."""
import functools
import json

import numpy as np
import pytest

from lab import allreduce_sim as sim

GRIDS = [(2, 2), (2, 4), (4, 4), (3, 5)]
ALPHA_S, BYTES_PER_S, ITEMSIZE = 1e-6, 1e11, 4
LINK = sim.LinkModel(ALPHA_S, BYTES_PER_S, bidirectional=True)
CASES = [(a, rows, cols, bidirectional) for a in sim.ALGORITHMS
         for rows, cols in GRIDS for bidirectional in (False, True)]
CASE_ARGS = "algorithm,rows,cols,bidirectional"


@functools.lru_cache(maxsize=None)
def _run(algorithm, rows, cols, bidirectional):
  """Random integer vectors (exact sums) all-reduced message by message."""
  num_values = 4 * rows * cols * 3
  rng = np.random.default_rng(rows * cols)
  values = rng.integers(-10**6, 10**6, size=(rows * cols, num_values))
  schedule = sim.build_schedule(algorithm, rows, cols, num_values,
                                bidirectional)
  return values, sim.execute(schedule, rows, cols, values)


@pytest.mark.parametrize(CASE_ARGS, CASES)
def test_every_chip_ends_with_the_exact_global_sum(algorithm, rows, cols,
                                                   bidirectional):
  values, execution = _run(algorithm, rows, cols, bidirectional)
  expected = np.broadcast_to(values.sum(axis=0), values.shape)
  np.testing.assert_array_equal(execution.values, expected)


@pytest.mark.parametrize(CASE_ARGS, CASES)
def test_executed_steps_and_time_equal_the_model(algorithm, rows, cols,
                                                 bidirectional):
  values, execution = _run(algorithm, rows, cols, bidirectional)
  link = sim.LinkModel(ALPHA_S, BYTES_PER_S, bidirectional)
  executed = sim.executed_cost(execution, ITEMSIZE, link)
  modelled = sim.model_cost(algorithm, rows, cols,
                            values.shape[1] * ITEMSIZE, link)
  assert executed.rounds == modelled.rounds
  assert executed.latency_s == pytest.approx(modelled.latency_s, rel=1e-12)
  assert executed.bandwidth_s == pytest.approx(modelled.bandwidth_s,
                                               rel=1e-12)


@pytest.mark.parametrize(CASE_ARGS, CASES)
def test_executed_bytes_on_every_link_direction_equal_the_model(
    algorithm, rows, cols, bidirectional):
  values, execution = _run(algorithm, rows, cols, bidirectional)
  executed = sorted(n * ITEMSIZE for n in execution.link_elements.values())
  loads = sim.model_link_loads(algorithm, rows, cols,
                               values.shape[1] * ITEMSIZE, bidirectional)
  modelled = sorted(b for b, count in loads.items() for _ in range(count))
  assert executed == pytest.approx(modelled, rel=1e-12)


@pytest.mark.parametrize("algorithm,links_per_chip",
                         [("ring_1d", 2), ("grid_2d", 4), ("ying_2d", 4)])
def test_bidirectional_run_uses_this_many_link_directions_per_chip(
    algorithm, links_per_chip):
  _, execution = _run(algorithm, 4, 4, True)
  used = [key for key, n in execution.link_elements.items() if n]
  assert len(used) == links_per_chip * 16


@pytest.mark.parametrize("rows,cols",
                         [(2, 2), (2, 4), (3, 5), (5, 2), (7, 7), (64, 64)])
def test_hamiltonian_ring_visits_every_chip_once_over_torus_links(rows, cols):
  ring = sim.hamiltonian_ring(rows, cols)
  assert sorted(ring.chips) == list(range(rows * cols))
  for i, (chip, port) in enumerate(zip(ring.chips, ring.ports)):
    following = ring.chips[(i + 1) % len(ring.chips)]
    assert sim.neighbour(rows, cols, chip, port) == following


@pytest.mark.parametrize("rows,cols", [(2, 4), (8, 8), (32, 32), (16, 64)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_ring_1d_takes_2_n_minus_1_steps_and_2_n_minus_1_over_n_bytes_over_b(
    rows, cols, bidirectional):
  n, payload = rows * cols, 1e8
  link = sim.LinkModel(ALPHA_S, BYTES_PER_S, bidirectional)
  cost = sim.model_cost("ring_1d", rows, cols, payload, link)
  per_direction = payload / (2 if bidirectional else 1)
  assert cost.rounds == 2 * (n - 1)
  assert cost.latency_s == pytest.approx(2 * (n - 1) * ALPHA_S)
  assert cost.bandwidth_s == pytest.approx(
      2 * (n - 1) / n * per_direction / BYTES_PER_S)


@pytest.mark.parametrize("side", [2, 4, 8, 16, 32, 64])
def test_bandwidth_only_2d_torus_is_exactly_2x_the_1d_ring_on_square_tori(
    side):
  link = sim.LinkModel(0.0, BYTES_PER_S, bidirectional=True)
  ring = sim.model_cost("ring_1d", side, side, 1e8, link).total_s
  torus = sim.model_cost("ying_2d", side, side, 1e8, link).total_s
  assert ring / torus == pytest.approx(2.0, rel=1e-12)


@pytest.mark.parametrize(CASE_ARGS, CASES)
def test_no_execution_beats_its_busiest_link_direction(algorithm, rows, cols,
                                                       bidirectional):
  _, execution = _run(algorithm, rows, cols, bidirectional)
  link = sim.LinkModel(0.0, BYTES_PER_S, bidirectional)
  busiest_s = max(execution.link_elements.values()) * ITEMSIZE / BYTES_PER_S
  executed = sim.executed_cost(execution, ITEMSIZE, link)
  assert executed.total_s >= busiest_s * (1 - 1e-12)


@pytest.mark.parametrize("rows,cols", [(2, 4), (3, 5), (32, 32), (16, 64)])
def test_bandwidth_only_2d_torus_runs_at_its_busiest_link_bound(rows, cols):
  link = sim.LinkModel(0.0, BYTES_PER_S, bidirectional=True)
  loads = sim.model_link_loads("ying_2d", rows, cols, 1e8, True)
  cost = sim.model_cost("ying_2d", rows, cols, 1e8, link)
  assert cost.total_s == pytest.approx(max(loads) / BYTES_PER_S, rel=1e-12)


@pytest.mark.parametrize("rows,cols", [(4, 4), (16, 64), (64, 64)])
def test_2d_grid_keeps_the_1d_ring_bandwidth_and_only_cuts_steps(rows, cols):
  ring = sim.model_cost("ring_1d", rows, cols, 1e8, LINK)
  grid = sim.model_cost("grid_2d", rows, cols, 1e8, LINK)
  assert grid.bandwidth_s == pytest.approx(ring.bandwidth_s, rel=1e-12)
  assert grid.rounds == 2 * (rows - 1) + 2 * (cols - 1) < ring.rounds


@pytest.mark.parametrize("side", [4, 8, 16, 32, 64])
def test_on_square_tori_2d_torus_beats_2d_grid_beats_1d_ring(side):
  times = {a: sim.model_cost(a, side, side, 1e8, LINK).total_s
           for a in sim.ALGORITHMS}
  assert times["ying_2d"] < times["grid_2d"] < times["ring_1d"]


@pytest.mark.parametrize("algorithm", sim.ALGORITHMS)
def test_modelled_time_strictly_grows_with_chips_and_payload(algorithm):
  by_chips = [sim.model_cost(algorithm, s, s, 1e8, LINK).total_s
              for s in (2, 4, 8, 16, 32, 64)]
  by_payload = [sim.model_cost(algorithm, 8, 8, p, LINK).total_s
                for p in (1e6, 1e7, 1e8)]
  assert all(a < b for a, b in zip(by_chips, by_chips[1:]))
  assert all(a < b for a, b in zip(by_payload, by_payload[1:]))


def _one_message_lane(src, dst, port, start):
  return [[sim.Message(src, dst, port, start, start + 1, reduce=True)]]


def test_executor_rejects_a_message_that_does_not_follow_a_torus_link():
  diagonal = [[_one_message_lane(src=0, dst=5, port="+x", start=0)]]
  with pytest.raises(ValueError, match="does not follow a link"):
    sim.execute(diagonal, 4, 4, np.zeros((16, 4), dtype=np.int64))


def test_executor_rejects_concurrent_lanes_sharing_a_link_direction():
  shared = [[_one_message_lane(src=0, dst=1, port="+x", start=0),
             _one_message_lane(src=0, dst=1, port="+x", start=1)]]
  with pytest.raises(ValueError, match="share link"):
    sim.execute(shared, 4, 4, np.zeros((16, 4), dtype=np.int64))


def test_schedule_rejects_a_payload_that_does_not_split_into_equal_chunks():
  with pytest.raises(ValueError, match="multiple of 64"):
    sim.build_schedule("ying_2d", 4, 4, 100, bidirectional=True)


def test_cli_writes_markdown_json_and_png(tmp_path, capsys):
  argv = ["--output_dir", str(tmp_path), "--shapes", "2x4,4x4,16x64"]
  assert sim.main(argv) == 0
  markdown = (tmp_path / "allreduce_sim.md").read_text()
  report = json.loads((tmp_path / "allreduce_sim.json").read_text())
  png = (tmp_path / "allreduce_sim.png").read_bytes()
  assert "| 16x64 | 1024 |" in markdown
  assert "speed-up at 32x32 (1024 chips)" in markdown
  assert markdown in capsys.readouterr().out
  assert len(report["results"]) == 3 * 2 * len(sim.ALGORITHMS)
  assert report["speedup_over_ring_1d_at_32x32"]["fp32"]["ying_2d"] > 1
  assert png.startswith(b"\x89PNG")


def test_resnet50_has_the_bn_channels_the_statistics_model_counts():
  from resnet_tpu.config import TrainConfig  # pylint: disable=g-import-not-at-top
  from resnet_tpu.model.resnet import build_model  # pylint: disable=g-import-not-at-top
  cfg = TrainConfig.tiny("unused", resnet_depth=50, image_size=32)
  model = build_model(cfg.model, cfg.distribution)
  moving = [v for v in model.non_trainable_variables
            if v.path.endswith(("moving_mean", "moving_variance"))]
  assert len(moving) == 2 * 53
  assert sum(v.shape[0] for v in moving) == 2 * sim.RESNET50_BN_CHANNELS


def test_statistics_traffic_follows_each_option():
  values = 2 * sim.RESNET50_BN_CHANNELS * 4
  # A chip sends N - 1 copies under the broadcast: ~218 MB at 1,024 chips.
  assert sim.statistics_bytes_per_step("only_first_replica", 1024) == (
      1023 * values)
  assert sim.statistics_bytes_per_step("mean_per_step", 2) == values
  assert sim.statistics_bytes_per_step("local_mean_per_loop", 2, 100) == (
      values / 100)
