"""The machine's limits never reach the model nor its score (issue 41, finding 2), through real episodes.

Before: six concurrent ``stateful: true`` episodes on a pool with room for four sessions; two were told "close
sessions no longer needed, or raise pool_memory_mb ..." as their tool response, counted as their tool error. Now
the calls wait for room and run; a failure of the system (a queue deadline, a pool that died) ends the episode
``env_error``, unscored, with nothing of it in the model's turns, and trainers leave it out.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from rstar_env.rollout.metrics import summarize
from rstar_env.sandbox import SandboxError
from rstar_env.sandbox.local import LocalSandbox
from rstar_env.testing import answer, aplay, make_env, python_call
from rstar_env.trajectory import Trajectory
from rstar_plugins.tools.python import PythonTool

REFUSAL_WORDS = ("pool_memory_mb", "queue_timeout_s", "sandbox died", "no room", "refused")


def _box(**options: object) -> LocalSandbox:
    box = LocalSandbox(timeout_s=4.0, spares=1, preload=(), warmup=None, **options)  # type: ignore[arg-type]
    try:
        box.start()
    except SandboxError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and the local sandbox cannot start: {exc}")
        pytest.skip(f"local sandbox unavailable on this machine: {exc}")
    return box


@pytest.fixture
def tight_box() -> Iterator[LocalSandbox]:
    """memory_mb=256 of pool_memory_mb=512: before, (512 - 256) // 256 = 1 session at a time."""
    box = _box(memory_mb=256, pool_memory_mb=512, max_concurrency=8, queue_timeout_s=60)
    yield box
    box.close()


def _model_text(trajectory: Trajectory) -> str:
    """Everything the model read: tool responses and feedback."""
    return "\n".join([c.result.text for c in trajectory.tool_calls] + [t.feedback or "" for t in trajectory.turns])


def _episodes(box: LocalSandbox, scripts: list[list[str]], gold: str = "43") -> list[Trajectory]:
    tool = PythonTool(stateful=True, sandbox=box)
    envs = [make_env(tools=[tool], reward="math", max_turns=len(script) + 1) for script in scripts]

    async def all_of_them() -> list[Trajectory]:
        return await asyncio.gather(
            *(aplay(env, script, problem="p", answer=gold) for env, script in zip(envs, scripts, strict=True))
        )

    try:
        return asyncio.run(all_of_them())
    finally:
        for env in envs:
            env.close()


@pytest.mark.parametrize(
    ("memory_mb", "pool_memory_mb", "episodes"),
    [(256, 512, 6), (2048, 12288, 16)],
    ids=["6-episodes-where-1-session-fit", "16-episodes-at-the-defaults-of-24-GiB"],
)
def test_stateful_episodes_beyond_what_the_pool_could_reserve_all_run_their_calls(
    memory_mb: int, pool_memory_mb: int, episodes: int
) -> None:
    """Before: (pool_memory_mb - memory_mb) // memory_mb sessions at once (1, and 5), the others told to close
    sessions or raise pool_memory_mb, counted as their tool error."""
    box = _box(memory_mb=memory_mb, pool_memory_mb=pool_memory_mb, max_concurrency=8, queue_timeout_s=120)
    script = [python_call("x = 6 * 7"), python_call("x += 1\nprint(x)"), answer(43)]
    try:
        trajectories = _episodes(box, [script] * episodes)
    finally:
        box.close()
    for trajectory in trajectories:
        assert (trajectory.end_reason, trajectory.reward) == ("answer", 1.0), trajectory.error
        assert trajectory.tool_error_counts() == {}
        assert trajectory.tool_calls[-1].result.text == "43"
        assert not any(word in _model_text(trajectory) for word in REFUSAL_WORDS)
    assert box._gate.turned_away == 0


def test_a_queue_deadline_ends_the_episode_env_error_unscored_and_untold() -> None:
    box = _box(memory_mb=256, pool_memory_mb=512, max_concurrency=4, queue_timeout_s=1.0)
    try:
        # Two sessions hold what leaves no room for a third (200 + 200 + 256 > 512 once both rest).
        for name in ("hog-1", "hog-2"):
            held = asyncio.run(box.execute("held = b'\\x01' * (180 << 20)", session=name))
            assert held.ok, held
        [trajectory] = _episodes(box, [[python_call("print(6 * 7)")]], gold="42")  # it ends at that call
    finally:
        box.close()
    assert trajectory.end_reason == "env_error" and trajectory.failed and trajectory.reward_result is None
    assert "ToolUnavailable" in (trajectory.error or "") and "queue_timeout_s" in (trajectory.error or "")
    assert trajectory.tool_calls == [] and trajectory.tool_error_counts() == {}  # the model read nothing of it
    summary = summarize([trajectory])
    assert summary["env_errors"] == 1 and summary.get("tool_error_ratio", 0.0) == 0.0


def test_a_killed_pool_ends_the_episode_env_error(tight_box: LocalSandbox) -> None:
    box = tight_box

    def kill_pool(observation: str) -> str:
        zygote = box.pool.zygote_pid()
        assert zygote is not None and "42" in observation
        os.kill(zygote, signal.SIGKILL)  # the session dies between its calls, with its pool
        return python_call("print(x)")

    [trajectory] = _episodes(box, [[python_call("x = 42\nprint(x)"), kill_pool]], gold="42")  # ends at its call
    assert trajectory.end_reason == "env_error" and trajectory.reward_result is None, trajectory.error
    assert [c.result.text for c in trajectory.tool_calls] == ["42"]
    assert trajectory.tool_error_counts() == {}
    assert not any(word in _model_text(trajectory) for word in REFUSAL_WORDS)


def test_a_crash_of_the_models_own_making_still_counts(tight_box: LocalSandbox) -> None:
    script = [python_call("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"), answer(43)]
    [trajectory] = _episodes(tight_box, [script])
    assert trajectory.end_reason == "answer" and trajectory.tool_error_counts() == {"crash": 1}
