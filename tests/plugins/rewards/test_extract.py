"""Where the ``math`` reward finds the answer: several boxes, answer blocks, the rStar reference's last box; linear
time whatever the response holds, off the event loop, and "answer too long" as a score, not an env error."""

from __future__ import annotations

import asyncio
import threading

import gymnasium as gym
import pytest

import rstar_env  # noqa: F401  (registers the env)
from rstar_env.format import answer_blocks, boxed_spans, extract_answer, last_boxed
from rstar_plugins.rewards import MathReward
from rstar_plugins.rewards import extract as extract_module
from rstar_plugins.rewards.extract import locate


# -- locating the answer ---------------------------------------------------------------------------------------------
def test_several_boxes_in_the_block_are_one_answer() -> None:
    found = locate("<answer>The roots are $\\boxed{1}$, $\\boxed{2}$ and $\\boxed{3}$.</answer>")
    assert found is not None and found.shown == "1, 2, 3" and found.single is None
    assert found.boxes == "\\boxed{1}, \\boxed{2}, \\boxed{3}"


def test_boxes_before_the_block_are_not_the_answer() -> None:
    found = locate("Try \\boxed{7}. No: \\boxed{8}.\n<answer>The answer is \\boxed{9}.</answer>")
    assert found is not None and (found.single, found.shown) == ("9", "9")


def test_a_box_with_other_numbers_around_it_is_left_to_math_verify() -> None:
    found = locate("<answer>First \\boxed{3}, so the final answer is $10,455$.</answer>")
    assert found is not None and found.single is None and "10,455" in found.text


def test_separated_boxes_are_not_one_answer() -> None:
    found = locate("Step one gives \\boxed{4}. Much later, after more work, we get \\boxed{5}.")
    assert found is not None and (found.single, found.shown) == ("5", "5")


def test_no_block_falls_back_to_the_final_run_of_boxes() -> None:
    found = locate("so x = \\boxed{-1} or \\boxed{2}")
    assert found is not None and found.shown == "-1, 2"
    assert locate("so x = \\boxed{-1} or \\boxed{2}", fallback=False) is None


def test_last_box_rule_of_the_reference() -> None:
    found = locate("<answer>\\boxed{1}, \\boxed{2}</answer>", answer_block=False, boxes="last")
    assert found is not None and (found.single, found.text) == ("2", "\\boxed{2}")


def test_nested_and_spaced_boxes() -> None:
    assert last_boxed("\\boxed{\\frac{1}{\\boxed{2}}}") == "2"  # the last box to start, as before
    assert last_boxed("so \\boxed 5$ done") == "5"
    assert [content for _, _, content in boxed_spans("\\fbox{a} \\boxed {b}")] == ["a", "b"]


def test_answer_blocks_match_the_lazy_regex() -> None:
    import re

    texts = [
        "<answer>a</answer><answer>b</answer>",
        "<answer><answer>x</answer>",
        "<answer>no close",
        "</answer><answer>y</answer>z</answer>",
        "",
    ]
    for text in texts:
        assert answer_blocks(text) == re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)


# -- linear time -----------------------------------------------------------------------------------------------------
def _work(count_work, text: str) -> int:
    _, located = count_work(locate, text)
    _, extracted = count_work(extract_answer, text)
    return located + extracted


@pytest.mark.parametrize("unit", ["\\boxed{", "<answer>\\boxed{", "{" * 3 + "\\fbox ", "<answer>"])
def test_extraction_is_linear(unit: str, count_work) -> None:
    small, big = _work(count_work, unit * 2_000), _work(count_work, unit * 16_000)
    # 8x the text: linear work grows 8x at most (less where a fixed part does not grow), quadratic work 64x.
    assert big <= 9 * small, (small, big)


def test_ten_thousand_unclosed_boxes_are_a_score_of_zero_without_the_verifier() -> None:
    with MathReward(workers=1) as reward:
        for response in (
            "\\boxed{" * 10_000,
            "<answer>" + "\\boxed{" * 10_000 + "</answer>",
            "<answer>\\boxed{" * 10_000,
        ):
            result = reward.score_sync(response, "42")
            # Decided by extraction (linear, above): never sent to math_verify, where it would end as "timeout".
            assert result.reward == 0.0 and result.reason in ("no_answer", "answer too long"), result


def test_an_answer_too_long_to_score_is_a_score_of_zero() -> None:
    with MathReward(workers=1, max_answer_chars=1000) as reward:
        result = reward.score_sync("<answer>" + "x + " * 1000 + "1</answer>", "42")
        assert (result.reward, result.extracted, result.reason) == (0.0, None, "answer too long")
        # A long block with a box is read through its box.
        long_block = "<answer>" + "We check every case. " * 100 + "So it is \\boxed{42}.</answer>"
        assert reward.score_sync(long_block, "42").reward == 1.0


# -- off the event loop ----------------------------------------------------------------------------------------------
def test_extraction_never_runs_on_the_event_loop_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    real = extract_module.locate

    def spy(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr("rstar_plugins.rewards.math_reward.locate", spy)

    async def main() -> None:
        with MathReward(workers=1) as reward:
            await reward.score("<answer>\\boxed{42}</answer>", "42")
            await reward.score_batch([("<answer>\\boxed{41}</answer>", "42")])

    asyncio.run(main())
    assert len(threads) == 2 and threading.main_thread().name not in threads


def _env(reward: MathReward) -> gym.Env:
    return gym.make("rstar_env/MathTool-v0", tools=[], reward=reward, max_turns=2).unwrapped


def test_a_huge_action_does_not_stall_another_envs_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # Both envs run on the one background loop of this process. The huge action's extraction is held on purpose
    # until the small step has ended: if it ran on the loop, the small step could not end, and this test would
    # fail at the hang guard (30 s) instead of passing.
    real = extract_module.locate
    slow_started, small_done = threading.Event(), threading.Event()

    def slow_for_huge(response: str, **kwargs):
        if len(response) > 100_000:
            slow_started.set()
            small_done.wait(30)
        return real(response, **kwargs)

    monkeypatch.setattr("rstar_plugins.rewards.math_reward.locate", slow_for_huge)
    with MathReward(workers=1) as reward:
        huge_env, small_env = _env(reward), _env(reward)
        try:
            huge_env.reset(options={"problem": "p", "answer": "42"})
            small_env.reset(options={"problem": "p", "answer": "42"})
            huge = "<answer>" + "\\boxed{" * 50_000 + "</answer>"
            outcome: dict = {}
            worker = threading.Thread(target=lambda: outcome.update(step=huge_env.step(huge)))
            worker.start()
            assert slow_started.wait(30)
            _, reward_value, terminated, _, _ = small_env.step("<answer>\\boxed{42}</answer>")
            small_ended_first = "step" not in outcome  # the huge step was still held in its extraction
            small_done.set()
            worker.join(30)
            assert (reward_value, terminated) == (1.0, True)
            assert small_ended_first, "the small step waited behind the huge one"
            _, huge_reward, huge_terminated, _, info = outcome["step"]
            trajectory = info["trajectory"]
            assert (huge_reward, huge_terminated, trajectory.end_reason) == (0.0, True, "answer")
            assert trajectory.reward_result.reason == "answer too long"
        finally:
            small_done.set()
            huge_env.close()
            small_env.close()


# -- preset: rstar2 keeps the reference's last-box rule ----------------------------------------------------------------
# Golden: the rStar reference (rstar2_agent's reward: prime_math, then math_verify) reads the last \boxed{} of the
# whole response, wherever it stands and whatever precedes it; several boxes are not one answer there.
RSTAR2_GOLDEN = [
    ("<answer>\\boxed{1}, \\boxed{2}</answer>", "2", 1.0, "2"),
    ("<answer>\\boxed{1}, \\boxed{2}</answer>", "\\{1,2\\}", 0.0, "2"),
    ("I guess \\boxed{5}.\n<answer>So \\boxed{6}</answer> then again \\boxed{7}", "7", 1.0, "7"),
    ("<answer>The final answer is 6.</answer> Checked: \\boxed{6}", "6", 1.0, "6"),
    ("<answer>The final answer is 6.</answer>", "6", 0.0, None),  # no box, no answer
    ("\\boxed{\\frac{1}{\\boxed{2}}}", "2", 1.0, "2"),  # the last box to start, nested or not
]


def test_rstar2_preset_keeps_the_last_box_rule() -> None:
    env = gym.make("rstar_env/MathTool-v0", preset="rstar2").unwrapped
    try:
        reward = env.reward_fn
        assert (reward.answer_block, reward.boxes) == (False, "last")
        for response, gold, expected, extracted in RSTAR2_GOLDEN:
            result = reward.score_sync(response, gold)
            assert (result.reward, result.extracted) == (expected, extracted), response
    finally:
        env.close()


def test_the_default_reads_the_block_and_its_boxes_as_one_answer(math_reward: MathReward) -> None:
    assert math_reward.score_sync(RSTAR2_GOLDEN[1][0], "\\{1,2\\}").reward == 1.0  # conftest's default reward
    assert math_reward.score_sync(RSTAR2_GOLDEN[2][0], "6").reward == 1.0
