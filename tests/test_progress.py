"""What a training run shows: progress lines in logs (not a terminal), the per-step tables, the end summary."""

from __future__ import annotations

import io
import time
import types

import pytest
from rich.console import Console

from rstar_trainers.local.progress import (
    RL_COLUMNS,
    RL_LEGEND,
    SFT_COLUMNS,
    RunProgress,
    StepTable,
    held_out_line,
    summary_lines,
    table_header,
    table_row,
)


def log_console() -> tuple[Console, io.StringIO]:
    buffer = io.StringIO()
    return Console(file=buffer, force_terminal=False, width=100), buffer


def test_plain_progress_is_throttled_and_ends_each_phase():
    console, buffer = log_console()
    with RunProgress(console, every_s=3600) as progress:
        assert progress.plain
        for done in range(0, 25):
            progress.update("rollout", done, 24, "step 1: rollouts")
        progress.print("a table row")
    lines = buffer.getvalue().splitlines()
    # the start, the end and nothing in between (every_s not reached); the row as printed
    assert lines == [
        "step 1: rollouts: 0/24 (0%)  elapsed 0 s",
        "step 1: rollouts: 24/24 (100%)  elapsed 0 s",
        "a table row",
    ]


def test_plain_progress_heartbeat_when_a_phase_is_silent():
    console, buffer = log_console()
    with RunProgress(console, heartbeat_s=0.2) as progress:
        progress.update("update", 0, 1, "step 3: updating the weights")
        deadline = time.monotonic() + 10  # a hang guard: the thread wakes every heartbeat_s (at most 5 s)
        while "still working" not in buffer.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
    beats = [line for line in buffer.getvalue().splitlines() if "still working" in line]
    assert beats and beats[0].startswith("step 3: updating the weights: 0/1 (0%)")


def test_heartbeat_names_a_phase_still_running_when_the_last_one_finished():
    """Parallel arms (`compare --jobs 2`): one arm's phase ends while the other's goes on; the beat names that one."""
    console, buffer = log_console()
    with RunProgress(console, heartbeat_s=0.2) as progress:
        progress.update("grpo/2 update", 0, 1, "grpo/2 step 4: updating the weights")
        progress.update("roc/2 update", 0, 1, "roc/2 step 4: updating the weights")
        progress.update("roc/2 update", 1, 1, "roc/2 step 4: updating the weights")
        time.sleep(1.0)
    beats = [line for line in buffer.getvalue().splitlines() if "still working" in line]
    assert beats and all(b.startswith("grpo/2 step 4: updating the weights: 0/1 (") for b in beats), beats


def test_terminal_progress_prints_rows_above_the_bars():
    buffer = io.StringIO()
    console = Console(file=buffer, force_terminal=True, width=100)
    with RunProgress(console) as progress:
        assert not progress.plain
        progress.update("rollout", 3, 8, "step 1: rollouts")
        progress.print("row one")
    assert "row one" in buffer.getvalue()


def test_a_step_table_prints_its_header_with_its_first_row_and_once(monkeypatch):
    """The header used to go out at the trainer's start, with model loading and held-out lines before any row."""
    # The test's own clock, moved by hand: the held-out phase lasts 3.4 s of it, whatever this machine's speed.
    clock = types.SimpleNamespace(now=1000.0)
    monkeypatch.setattr("rstar_env.progress.time", types.SimpleNamespace(monotonic=lambda: clock.now))
    console, buffer = log_console()
    with RunProgress(console, every_s=3600) as progress:
        table = StepTable(progress, RL_COLUMNS, legend=RL_LEGEND)
        progress.print("loading the model")
        progress.update("eval", 0, 4, "held-out episodes")
        clock.now += 3.4
        progress.update("eval", 4, 4, "held-out episodes")
        assert buffer.getvalue().count(table_header(RL_COLUMNS)[0]) == 0
        table.add({"step": 1, "reward": 0.5})
        table.add({"step": 2, "reward": 0.75})
    lines = buffer.getvalue().splitlines()
    start = lines.index(table_header(RL_COLUMNS)[0])
    assert lines[start : start + 3] == [*table_header(RL_COLUMNS), RL_LEGEND]
    assert lines[start + 3] == table_row(RL_COLUMNS, {"step": 1, "reward": 0.5})
    assert lines[start + 4].split()[:2] == ["2", "0.750"] and len(lines) == start + 5
    assert lines[:3] == [
        "loading the model",
        "held-out episodes: 0/4 (0%)  elapsed 0 s",
        "held-out episodes: 4/4 (100%)  elapsed 3 s",
    ]


def test_tables_fit_100_columns_with_honest_headers():
    metrics = {
        "step": 12,
        "reward": 0.4375,
        "accuracy": 0.4375,
        "tool_calls_per_trajectory": 1.25,
        "tool_error_ratio": 0.1234,
        "tool_error_ratio_correct": float("nan"),
        "groups_kept": 3.0,
        "response_tokens": 187.5,
        "loss": -0.0123456,
        "grad_norm": 1.234,
        "time/step_s": 83.2,
    }
    for columns in (RL_COLUMNS, SFT_COLUMNS):
        header = table_header(columns)
        row = table_row(columns, metrics | {"lr": 2e-4, "train/trained_tokens": 5120.0})
        assert max(len(line) for line in [*header, row]) <= 100
        assert len(header[0]) >= len(row.rstrip()) - 1
    header = table_header(RL_COLUMNS)
    assert "accuracy" not in " ".join(header)  # it equals the reward under a 0/1 reward
    assert "call, correct" in header[1] and "correct" in RL_LEGEND
    assert table_row(RL_COLUMNS, metrics).split()[4] == "-"  # no correct trajectory: no ratio, not 0


def test_summary_says_where_things_are_and_before_after():
    lines = summary_lines(
        model="runs/q/model",
        run_dir="runs/q",
        eval_before={"pass@1": 0.25, "tool_call_share": 0.5},
        eval_after={"pass@1": 0.5, "tool_call_share": 0.75},
        eval_path="runs/q/eval.json",
        seconds=780,
        peak_gib=3.5,
        steps=8,
        sft_model="runs/q/sft/model",
    )
    text = "\n".join(lines)
    assert "runs/q/model" in text and "runs/q/sft/model" in text and "runs/q/eval.json" in text
    assert "  pass@1                       0.250   0.500" in text
    assert "total time 13.0 min" in text and "peak memory 3.50 GiB" in text
    assert max(len(line) for line in lines) <= 100
    worst = {
        "pass@1": 0.123456,
        "tool_call_share": 0.87654,
        "answer_format_share": 0.7777,
        "tool_calls_per_trajectory": 12.345,
        "tool_error_ratio": 0.14286,
        "episodes": 32.0,
    }
    assert len(held_out_line("held-out before RL", worst)) <= 100


def test_summary_gives_the_paired_held_out_gain_with_its_interval():
    from rstar_trainers.local.progress import paired_gain

    before = {"pass@1": 0.5, "rewards": [0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]}
    after = {"pass@1": 0.75, "rewards": [1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 1.0]}
    # differences 1,0,0,0,1,0,0,1: mean 0.375, sd 0.5175, t(0.975, 7) = 2.3646 -> half-width 0.4327
    expected = "  pass@1 change +0.375, 95% CI [-0.058, +0.808], paired over 8 held-out episodes"
    assert paired_gain(before, after) == expected
    lines = summary_lines(
        model=None,
        run_dir="r",
        eval_before=before,
        eval_after=after,
        eval_path=None,
        seconds=1,
        peak_gib=1,
        steps=1,
    )
    assert paired_gain(before, after) in lines
    assert paired_gain(before, {"rewards": [1.0]}) is None  # reports of other problems do not pair
    assert paired_gain({"pass@1": 0.5}, after) is None  # an older report without rewards


@pytest.mark.slow
def test_train_shows_progress_the_table_and_the_summary(tmp_path):
    """`rstar-env train` with the real model (1 RL step, held-out before and after), its output as a log shows it."""
    import json

    from click.testing import CliRunner

    from rstar_env.cli import main

    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"problem": f"What is {n} + {n}?", "answer": str(2 * n), "id": f"p{n}"}) + "\n"
            for n in range(1, 5)
        )
    )
    config = tmp_path / "c.yaml"
    config.write_text(
        json.dumps(
            {
                "env": {"max_turns": 1},
                "tools": [],
                "reward": {"name": "math", "options": {"last_number": True}},
                "dataset": str(rows),
                "trainer": {
                    "output_dir": str(tmp_path / "run"),
                    "steps": 1,
                    "prompts_per_step": 1,
                    "group_size": 2,
                    "oversample": 1,
                    "max_new_tokens": 6,
                    "max_response_tokens": 12,
                    "tensorboard": False,
                    "eval_dataset": str(rows),
                    "eval_at_start": True,
                    "keep_checkpoints": "none",
                },
            }
        )
    )
    result = CliRunner().invoke(main, ["train", "--config", str(config)])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "held-out episodes: 4/4" in out and "step 1: rollouts: 2/2" in out and "step 1: updating the weights" in out
    lines = out.splitlines()
    # A path is as long as it is; a third-party library's log line (deepspeed's accelerator notice) is not ours.
    # The loop watchdog's warning (a loaded machine can stall the shared loop) is a log line, not the table's.
    wide = [
        line
        for line in lines
        if len(line) > 100
        and str(tmp_path) not in line
        and not line.startswith("[")
        and "rstar-env event loop" not in line
    ]
    assert not wide, wide
    header = table_header(RL_COLUMNS)
    start = lines.index(header[0])  # the header goes out with the first row, not at the trainer's start
    assert lines[start + 1 : start + 3] == [header[1], RL_LEGEND] and lines[start + 3].split()[:1] == ["1"]
    assert f"model:            {tmp_path / 'run' / 'model'}" in out
    assert f"held-out report:  {tmp_path / 'run' / 'eval.json'}" in out
    assert "before" in out and "after" in out and "peak memory" in out and "total time" in out
    assert not list((tmp_path / "run" / "checkpoints").glob("step_*"))  # keep_checkpoints: none


def test_model_loading_hides_the_library_bars_and_restores_them():
    """transformers' GGUF bar (stderr, redrawn in place) would glue our heartbeat lines to its end (a CI log)."""
    import io

    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    from rstar_env.rollout.local import without_library_bars

    bar = gguf_utils.tqdm
    assert hf_logging.is_progress_bar_enabled()
    with without_library_bars():
        assert not hf_logging.is_progress_bar_enabled()
        stream = io.StringIO()
        for _ in gguf_utils.tqdm(range(3), desc="Converting", file=stream):
            pass
        assert stream.getvalue() == ""
    assert gguf_utils.tqdm is bar and hf_logging.is_progress_bar_enabled()


def test_saving_a_model_draws_no_library_bar(tmp_path, capfd, tiny_llama):
    """transformers' "Writing model shards" bar would break the lines of a run's progress the same way."""
    from transformers.utils import logging as hf_logging

    from rstar_trainers.local.checkpoint import save_pretrained

    model, tokenizer = tiny_llama
    capfd.readouterr()
    path = save_pretrained(model, tokenizer, tmp_path)
    captured = capfd.readouterr()
    assert (path / "config.json").exists() and (path / "model.safetensors").exists()
    assert "Writing model shards" not in captured.err + captured.out, captured.err
    assert hf_logging.is_progress_bar_enabled()


def test_what_an_engine_process_prints_goes_to_the_run_log_not_the_terminal(tmp_path, capfd):
    """vLLM's engine processes inherit this process's stdout and stderr as they start: _output_to points them at
    the run's log for that time only."""
    import subprocess
    import sys

    from rstar_env.rollout.vllm import _output_to

    log = tmp_path / "run" / "engine.log"
    with _output_to(log):
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; print('Loading safetensors checkpoint shards'); "
                "print('WARNING RotaryEmbedding: Failed to load weights', file=sys.stderr)",
            ],
            check=True,
        )
    print("after the block")
    out, err = capfd.readouterr()
    assert "Loading safetensors" not in out + err and "RotaryEmbedding" not in out + err
    assert "after the block" in out  # the terminal is back
    text = log.read_text()
    assert "Loading safetensors checkpoint shards" in text and "Failed to load weights" in text


def test_the_weight_sync_line_states_our_own_check():
    from rstar_trainers.local.progress import sync_line, sync_ok

    assert sync_ok(0.03, 2e-6) and sync_ok(1e-5, 1e-5)  # took; or nothing changed and it matches anyway
    assert not sync_ok(0.03, 0.03)  # the engine kept the old weights
    assert sync_line([]) is None
    assert sync_line([(0.03, 2e-6), (0.02, 4e-6)]) == (
        "weight sync: 2 checked, the vLLM engine runs the trained weights (probe log-probs within 4e-06 of the "
        "trained model's)"
    )
    assert sync_line([(0.03, 2e-6), (0.03, 0.03)]).startswith("weight sync: 1 of 2 did not take")
    assert sync_ok(0.2, 0.01, "bfloat16") and not sync_ok(0.2, 0.1, "bfloat16")
