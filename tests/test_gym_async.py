"""``gym.make_vec(..., "async")`` under every start method: no hang, and the same observations as the sync vector
env (shared memory included); the observation space's shared-memory layout keeps any Unicode text."""

from __future__ import annotations

import copy
import multiprocessing as mp

import gymnasium
import pytest
from gymnasium.error import CustomSpaceError
from gymnasium.vector.utils.shared_memory import create_shared_memory, read_from_shared_memory, write_to_shared_memory

from rstar_env import ENV_ID, TokenAction
from rstar_env.spaces import SharedTextBatch, UnicodeText
from rstar_env.testing import python_call

from ._pools import LIGHT_PYTHON

# Built-in plugins only: a spawned worker imports rstar_env afresh and sees no plugin registered at run time. Each
# worker starts its own sandbox pool: a light one (the vector env is under test, not the pool's imports).
OPTIONS = {"tools": [LIGHT_PYTHON], "reward": "math", "max_turns": 3, "dataset": "arithmetic:n=100"}
CODE = "print('π ≈', 355 / 113, '中文\\x00end')"


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_async_make_vec_matches_sync_under_every_start_method(context):
    sync = gymnasium.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync", **OPTIONS)
    # The default shared_memory=True: observations travel through UnicodeText's shared-memory layout.
    vec = gymnasium.make_vec(ENV_ID, num_envs=2, vectorization_mode="async", vector_kwargs={"context": context},
                             **OPTIONS)  # fmt: skip
    try:
        vec.reset_async(seed=11)
        obs, _ = vec.reset_wait(timeout=60)  # a hang (a dead loop thread in a forked worker) fails here
        expected, _ = sync.reset(seed=11)
        assert obs == expected and type(obs) is tuple and "What is" in obs[0]
        actions = tuple(TokenAction(python_call(CODE), token_ids=[5, 6, i]) for i in range(2))
        vec.step_async(actions)
        obs, _, terminated, truncated, infos = vec.step_wait(timeout=60)
        expected, *_ = sync.step(actions)
        assert obs == expected
        assert "π ≈ 3.14159" in obs[0] and "中文\x00end" in obs[0]
        assert [t.turns[0].action_token_ids for t in infos["trajectory"]] == [[5, 6, 0], [5, 6, 1]]
        assert not terminated.any() and not truncated.any()
    except BaseException:
        vec.close(terminate=True)  # a hung worker would also hang a polite close
        raise
    else:
        vec.close()
    finally:
        sync.close()


def test_async_without_shared_memory_gives_the_same_observations():
    vec = gymnasium.make_vec(ENV_ID, num_envs=2, vectorization_mode="async",
                             vector_kwargs={"shared_memory": False}, **{**OPTIONS, "tools": []})  # fmt: skip
    sync = gymnasium.make_vec(ENV_ID, num_envs=2, vectorization_mode="sync", **{**OPTIONS, "tools": []})
    try:
        assert vec.reset(seed=5)[0] == sync.reset(seed=5)[0]
    finally:
        vec.close()
        sync.close()


def test_shared_text_is_lossless_live_and_bounded():
    space = UnicodeText(12)
    block = create_shared_memory(space, n=3, ctx=mp.get_context("spawn"))
    view = read_from_shared_memory(space, block, n=3)
    assert isinstance(view, SharedTextBatch)
    texts = ["", "a\x00b\n", "π≈中文😀 ok"]
    for i, text in enumerate(texts):
        write_to_shared_memory(space, i, text, block)
    assert view == tuple(texts) and view[2] == texts[2]
    copied = copy.deepcopy(view)  # what AsyncVectorEnv(copy=True) returns: a tuple, not the live view
    write_to_shared_memory(space, 0, "later", block)
    assert type(copied) is tuple and copied[0] == "" and view[0] == "later"  # the view is live
    with pytest.raises(CustomSpaceError, match=r"does not fit the observation space.*shared_memory=False"):
        write_to_shared_memory(space, 1, "x" * 13, block)
    assert view[1] == texts[1]  # nothing half-written
