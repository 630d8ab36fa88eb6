"""`rstar-env plot`: only panels with data, labelled axes, loss and grad norm apart, held-out before/after."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

pytest.importorskip("matplotlib")

from rstar_env.cli import main
from rstar_trainers.local.plot import panels_with_data, plot_run


def write_metrics(run, rows):
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_an_sft_run_draws_only_its_panels(tmp_path):
    rows = [
        {"step": s, "stage": "sft", "loss": 2.0 / s, "grad_norm": 10.0 / s, "lr": 1e-4, "time/step_s": 3.0}
        for s in range(1, 5)
    ]
    write_metrics(tmp_path / "sft", [*rows, {"step": 4, "eval/pass@1": 0.5}])
    drawn = {panel.title: keys for panel, keys in panels_with_data(rows)}
    assert drawn == {
        "loss": ["loss"],
        "gradient norm": ["grad_norm"],
        "learning rate": ["lr"],
        "time per step": ["time/step_s"],
    }
    result = CliRunner().invoke(main, ["plot", str(tmp_path / "sft")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "sft" / "curves.png").stat().st_size > 5_000


def test_an_rl_run_with_held_out_reports(tmp_path):
    import matplotlib.pyplot as plt

    rows = [
        {
            "step": s,
            "reward": 0.25 * s,
            "accuracy": 0.25 * s,
            "tool_error_ratio": 0.1,
            "tool_error_ratio_correct": float("nan") if s == 1 else 0.05,
            "loss": 0.01,
            "grad_norm": 3.0,
            "time/generation_s": 5.0,
            "time/train_s": 1.0,
            "time/step_s": 7.0,
        }
        for s in range(1, 4)
    ]
    drawn = {panel.title: keys for panel, keys in panels_with_data(rows)}
    assert drawn["reward"] == ["reward"]  # accuracy is the same curve: not drawn twice
    assert drawn["time per step"] == ["time/generation_s", "time/train_s"]
    assert "entropy" not in drawn and "groups" not in drawn
    write_metrics(tmp_path / "rl", rows)
    (tmp_path / "rl" / "eval_start.json").write_text(json.dumps({"pass@1": 0.2, "tool_call_share": 0.5}))
    (tmp_path / "rl" / "eval.json").write_text(json.dumps({"pass@1": 0.6, "tool_call_share": 0.9}))
    figures = []
    original = plt.close
    plt.close = lambda fig=None: figures.append(fig)  # keep the figure to look at it
    try:
        plot_run(tmp_path / "rl")
    finally:
        plt.close = original
    axes = [ax for ax in figures[0].axes if ax.get_visible()]
    assert len(axes) == len(drawn) + 1
    assert all(ax.get_ylabel() for ax in axes)
    held_out = axes[-1]
    assert held_out.get_title() == "held-out: before vs after"
    assert [t.get_text() for t in held_out.get_legend().get_texts()] == ["before", "after"]
    assert next(ax for ax in axes if ax.get_title() == "loss").get_ylabel() == "loss"


def test_a_constant_learning_rate_reads_as_its_value(tmp_path):
    import matplotlib.pyplot as plt

    write_metrics(tmp_path / "sft", [{"step": s, "stage": "sft", "loss": 1.0 / s, "lr": 2e-5} for s in range(1, 5)])
    figures = []
    original = plt.close
    plt.close = lambda fig=None: figures.append(fig)  # keep the figure to look at it
    try:
        plot_run(tmp_path / "sft")
    finally:
        plt.close = original
    figures[0].canvas.draw()
    lr = next(ax for ax in figures[0].axes if ax.get_title() == "learning rate")
    assert lr.yaxis.get_offset_text().get_text() == ""  # no "1e-5" in the corner that the ticks are read against
    ticks = [(loc, label.get_text()) for loc, label in zip(lr.get_yticks(), lr.get_yticklabels(), strict=True)]
    assert "2e-05" in [text for _, text in ticks]
    assert all(float(text) == pytest.approx(loc, rel=1e-3) for loc, text in ticks)  # each label is its whole value
