"""``rstar-env episode``: one episode played by hand or by a script, as the model would see it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from rstar_env._cli_util import console, fail


def _read_turn(prompt: str) -> str | None:
    """One assistant turn from the terminal: lines until a line holding only '.', or None at end of input."""
    console.print(f"[bold cyan]{prompt}[/] [dim](end with a line holding only '.'; Ctrl-D quits)[/]")
    lines: list[str] = []
    for line in sys.stdin:
        if line.rstrip("\n") == ".":
            return "\n".join(lines)
        lines.append(line.rstrip("\n"))
    return "\n".join(lines) if lines else None


@click.command()
@click.option("--config", "config", type=click.Path(dir_okay=False), help="Run config (YAML).")
@click.option("--problem", help="The problem (default: drawn from the config's dataset).")
@click.option("--answer", "gold", help="The gold answer for --problem.")
@click.option("--script", type=click.Path(exists=True, dir_okay=False), help="A JSON list of actions to play.")
@click.option("--seed", type=int, default=None, help="Seed for drawing the problem.")
@click.option("--out", type=click.Path(dir_okay=False), help="Write the final Trajectory as JSON here.")
def episode(
    config: str | None, problem: str | None, gold: str | None, script: str | None, seed: int | None, out: str | None
) -> None:
    """Play one episode: you type the assistant turns (or --script plays them), the env answers.

    Handy for debugging tools and reward plugins: you see exactly what the model would see.
    """
    from rstar_env.config import ConfigError
    from rstar_env.env import MathToolEnv
    from rstar_env.format import printable
    from rstar_env.plugins import PluginError

    if (problem is None) != (gold is None):
        fail("--problem and --answer go together")
    actions: list[str] | None = None
    if script:
        actions = json.loads(Path(script).read_text(encoding="utf-8"))
        if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
            fail(f"{script}: expected a JSON list of strings (the assistant actions)")
    try:
        env = MathToolEnv(config=config)
    except (ConfigError, PluginError) as exc:
        fail(str(exc))
    try:
        options = {"problem": problem, "answer": gold} if problem is not None else None
        obs, info = env.reset(seed=seed, options=options)
        console.rule("prompt")
        console.print(printable(obs), markup=False, highlight=False)
        turn = 0
        while True:
            turn += 1
            if actions is not None:
                if turn > len(actions):
                    fail(f"the script has {len(actions)} actions; the episode has not ended")
                action: str | None = actions[turn - 1]
                console.rule(f"assistant (turn {turn})")
                console.print(printable(action), markup=False, highlight=False)
            else:
                action = _read_turn(f"assistant turn {turn}>")
            if action is None:
                console.print("[yellow]input ended; episode abandoned[/]")
                return
            obs, reward, terminated, truncated, info = env.step(action)
            if terminated or truncated:
                break
            console.rule("environment")
            console.print(printable(obs), markup=False, highlight=False)
        traj = info["trajectory"]
        console.rule("episode over")
        console.print(
            f"end: [bold]{traj.end_reason}[/]  reward: [bold]{reward}[/]  extracted: {traj.final_answer!r}  "
            f"gold: {traj.answer!r}  tool calls: {traj.num_tool_calls}  tool errors: {traj.tool_error_counts()}"
        )
        if out:
            Path(out).write_text(json.dumps(traj.to_dict(), indent=2, ensure_ascii=False), encoding="utf-8")
            console.print(f"trajectory written to {out}")
    finally:
        env.close()


command = episode
