"""The main job, shortened: DQN with prioritized replay learns CartPole, a resumed run
continues the step count, the networks, the evaluation history and the replay buffer, and the
comparison runs the same seed with uniform replay, evaluating at the requested interval and
stopping at the requested step, into one plot."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("gymnasium")
pytest.importorskip("matplotlib")

DEMO = Path(__file__).resolve().parents[1] / "examples" / "demo.py"
SEED = 0
FIRST_STEPS = 10_240  # 40 rounds of 256 steps
MORE_STEPS = 2_560


@pytest.fixture(scope="module")
def demo():
    spec = importlib.util.spec_from_file_location("tdreplay_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def runs(demo, tmp_path_factory):
    """A first run, a snapshot of its buffer, then a second run resumed from its checkpoint."""
    out = tmp_path_factory.mktemp("demo")
    common = ["--seed", str(SEED), "--out", str(out), "--eval-interval", "2500",
              "--sampler", "prioritized"]
    [first] = demo.main(["--steps", str(FIRST_STEPS), *common])["runs"]
    rb = first["run"].replay_buffer
    saved_rows = rb[: len(rb)].clone()
    [first_summary] = json.loads((out / "summary.json").read_text())["runs"]
    [second] = demo.main(["--steps", str(MORE_STEPS), "--resume", *common])["runs"]
    return out, first, first_summary, saved_rows, second


def test_dqn_learns_cartpole(runs, demo):
    _, first, _, _, second = runs
    returns = [r for _, r in second["history"]]
    # a random policy averages ~20 per episode and the untrained greedy network ~10
    dqn = importlib.import_module("dqn_cartpole")  # the demo's helper module, beside it
    untrained = dqn.evaluate(dqn.make_qnet(hidden=256), episodes=5, seed=123)
    assert untrained < 40
    # calibrated on seeds 0-2 and several schedules: by 10k steps every run had evaluations of
    # 120+ (most 150-300, some 500) and no evaluation after 5k steps fell below 80
    assert max(returns) >= 120, returns
    assert second["final_eval_return"] >= 60, returns
    # the loss used the importance weights of the prioritized sampler
    assert first["sampler"] == "prioritized"


def test_resume_continues_steps_history_and_buffer(runs):
    out, first, first_summary, saved_rows, second = runs
    assert first["steps"] == FIRST_STEPS
    assert second["resumed_at"] == FIRST_STEPS
    assert second["steps"] == FIRST_STEPS + MORE_STEPS
    assert second["optim_steps"] > first["optim_steps"]
    assert second["buffer_write_count"] == FIRST_STEPS + MORE_STEPS
    rb = second["run"].replay_buffer
    assert len(rb) == FIRST_STEPS + MORE_STEPS  # the buffer (50k) has not wrapped
    # the rows written before the checkpoint are still there, unchanged
    restored = rb[: FIRST_STEPS]
    for key in ("observation", "action", ("next", "observation"), ("next", "reward"),
                ("next", "terminated")):
        assert torch.equal(restored[key], saved_rows[key]), key
    # the evaluation history continues the first run's
    first_history = [tuple(h) for h in first_summary["history"]]
    assert [tuple(h) for h in second["history"][: len(first_history)]] == first_history
    assert second["history"][-1][0] == FIRST_STEPS + MORE_STEPS


def test_outputs_are_written(runs):
    out, *_ = runs
    assert (out / "returns.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / f"prioritized-seed{SEED}" / "checkpoint" / "tdreplay-checkpoint.json").is_file()
    [summary] = json.loads((out / "summary.json").read_text())["runs"]
    assert summary["resumed_at"] == FIRST_STEPS and summary["steps"] == FIRST_STEPS + MORE_STEPS


@pytest.fixture(scope="module")
def comparison(demo, tmp_path_factory):
    """Both replay kinds, two seeds, a step count and an interval that are not multiples of
    the collector's 256-frame batches."""
    out = tmp_path_factory.mktemp("compare")
    result = demo.main(["--compare", "--seeds", "1", "2", "--steps", "1300", "--eval-interval",
                        "500", "--eval-episodes", "2", "--out", str(out), "--progress", "lines"])
    return out, result


def test_compare_runs_every_seed_with_both_replay_kinds(comparison):
    out, result = comparison
    runs = result["runs"]
    assert [(r["sampler"], r["seed"]) for r in runs] == [
        ("prioritized", 1), ("uniform", 1), ("prioritized", 2), ("uniform", 2)]
    for r in runs:
        # evaluations at the requested interval and at the requested end, not at batch ends
        assert [frames for frames, _ in r["history"]] == [500, 1000, 1300]
        assert r["steps"] == r["buffer_write_count"] == 1300
        rb = r["run"].replay_buffer
        assert len(rb) == 1300
        # the replay kind is the one named
        assert ("priority_weight" in rb.sample().keys()) == (r["sampler"] == "prioritized")
    # same seed, same random frames: the first 1000 steps (random actions) are identical
    p1, u1 = runs[0]["run"].replay_buffer, runs[1]["run"].replay_buffer
    assert torch.equal(p1[:1000]["observation"], u1[:1000]["observation"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["samplers"] == ["prioritized", "uniform"] and summary["seeds"] == [1, 2]
    assert len(summary["runs"]) == 4


def test_compare_plot_has_one_curve_per_replay_kind(comparison, demo, tmp_path, monkeypatch):
    out, result = comparison
    assert (out / "returns.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.pyplot as plt

    figures = []
    monkeypatch.setattr(plt, "close", figures.append)  # keep the figure to look inside
    demo.plot([{k: v for k, v in r.items() if k != "run"} for r in result["runs"]],
              tmp_path / "p.png", "t")
    [ax] = figures[0].axes
    labels = [line.get_label() for line in ax.get_lines()]
    assert "prioritized replay (mean of seeds 1, 2)" in labels
    assert "uniform replay (mean of seeds 1, 2)" in labels
    # the mean curve of each kind has a point per evaluation
    mean = [line for line in ax.get_lines() if line.get_label().startswith("uniform replay")]
    assert list(mean[0].get_xdata()) == [500, 1000, 1300]
    monkeypatch.undo()
    plt.close(figures[0])


def test_progress_lines_report_each_tenth(demo):
    class FakeTrainer:
        total_frames = 1000
        collected_frames = 0

    lines: list[str] = []
    progress = demo.ProgressLines(FakeTrainer(), "run 1/1", start=0, write=lines.append)
    for frames in range(0, 1001, 50):
        FakeTrainer.collected_frames = frames
        progress()
    assert len(lines) == 10
    assert lines[0].startswith("[run 1/1] 100/1,000 steps (10%)")
    assert lines[-1].startswith("[run 1/1] 1,000/1,000 steps (100%)")


def test_arguments(demo):
    args = demo.parse_args(["--progress", "none"])
    assert args.samplers == ["prioritized", "uniform"] and args.seeds == [0, 1, 2]
    assert demo.parse_args(["--sampler", "uniform"]).samplers == ["uniform"]
    assert demo.parse_args(["--sampler", "uniform", "--compare"]).samplers == [
        "prioritized", "uniform"]
    with pytest.raises(SystemExit):
        demo.parse_args(["--seeds", "1", "1"])
