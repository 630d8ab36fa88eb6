"""The compare report's held-out section: per-seed RoC - GRPO differences of each arm's ``eval.json``, their
t-interval, and how many seeds would settle a difference the interval does not yet clear."""

from __future__ import annotations

import json
import math

import pytest

from rstar_trainers.local.compare import (
    arm_dir,
    held_out_differences,
    markdown_table,
    seeds_to_settle,
    t_interval,
    t_quantile,
)


def _write_eval(root, arm, seed, pass1, errors):
    path = arm_dir(root, arm, seed)
    path.mkdir(parents=True)
    report = {"pass@1": pass1, "tool_error_ratio": errors, "tool_calls_per_trajectory": 1.0}
    (path / "eval.json").write_text(json.dumps(report))


def test_held_out_differences_pair_the_arms_seed_by_seed(tmp_path):
    figures = {0: (0.50, 0.60), 1: (0.40, 0.45), 2: (0.70, 0.65)}  # seed: (grpo, roc) pass@1
    for seed, (grpo, roc) in figures.items():
        _write_eval(tmp_path, "grpo", seed, grpo, 0.3)
        _write_eval(tmp_path, "roc", seed, roc, 0.2)
    _write_eval(tmp_path, "grpo", 3, 0.9, 0.1)  # its RoC arm has not finished: no pair, left out of the interval

    held = held_out_differences(tmp_path, [0, 1, 2, 3])

    pass1 = held["pass@1"]
    assert pass1["per_seed"] == pytest.approx({"0": 0.10, "1": 0.05, "2": -0.05})
    assert (pass1["mean"], *pass1["ci95"]) == pytest.approx(t_interval([0.10, 0.05, -0.05]))
    assert pass1["per_arm"]["grpo"]["3"] == 0.9 and "3" not in pass1["per_arm"]["roc"]
    assert held["tool_error_ratio"]["per_seed"] == pytest.approx({"0": -0.1, "1": -0.1, "2": -0.1})
    assert held["answer_format_share"]["per_seed"] == {}  # not in these reports: no difference invented
    table = markdown_table({"seeds": [0, 1, 2, 3], "arms": {}, "held_out": held})
    assert "| pass@1 | 0.5333 | 0.5667 | +0.1000 | +0.0500 | -0.0500 | - | +0.0333 |" in table


def test_no_held_out_reports_means_no_section(tmp_path):
    assert held_out_differences(tmp_path, [0, 1]) is None


def test_seeds_to_settle_is_the_first_count_whose_interval_clears_zero():
    diffs = [0.10, -0.02, 0.06, 0.01, 0.05]
    n = seeds_to_settle(diffs)
    mean, spread = sum(diffs) / 5, (sum((d - sum(diffs) / 5) ** 2 for d in diffs) / 4) ** 0.5
    assert n is not None and n > 5

    def half(k):
        return t_quantile(0.975, k - 1) * spread / math.sqrt(k)

    assert half(n) < mean <= half(n - 1)
    assert seeds_to_settle([0.2, 0.21, 0.19]) is None  # already clear of zero
    assert seeds_to_settle([0.1, -0.1]) is None  # no difference to settle
    assert seeds_to_settle([0.3]) is None  # one seed: no spread to go on


def test_an_arm_stopped_by_ctrl_c_stops_the_comparison_before_its_process_takes_another(monkeypatch):
    """An arm process that Ctrl-C stopped says the comparison stops before it is free again: the parent's own
    Ctrl-C may be handled later, and the pool hands a queued arm to a free process at once (an arm of the next seed
    once started so after Ctrl-C, under load)."""
    import queue
    import threading

    import rstar_trainers.local.compare as compare
    import rstar_trainers.local.trainer as trainer_module

    class InterruptedTrainer:
        def __init__(self, *args, **kwargs):
            pass

        def train(self, on_step):
            compare._on_interrupt(2, None)  # Ctrl-C while it trains: raises KeyboardInterrupt

        def close(self):
            pass

    monkeypatch.setattr(trainer_module, "LocalTrainer", InterruptedTrainer)
    monkeypatch.setattr(compare.signal, "signal", lambda *args: None)  # this process keeps its own handlers
    messages, stopping = queue.Queue(), threading.Event()
    monkeypatch.setattr(compare, "_messages", messages)
    monkeypatch.setattr(compare, "_stopping", stopping)
    monkeypatch.setattr(compare, "RunConfig", type("Run", (), {"model_validate": staticmethod(lambda data: data)}))
    monkeypatch.setattr(
        compare, "LocalTrainerConfig", type("Settings", (), {"model_validate": staticmethod(lambda data: data)})
    )
    with pytest.raises(KeyboardInterrupt):
        compare._train_arm("grpo", 0, {}, {}, threads=1)
    assert stopping.is_set()
    assert [m[0] for m in list(messages.queue)] == ["started", "ended"]
