"""OpenRLHF agent function: ``--train.agent_func_path`` points at this file.

OpenRLHF's vLLM engine actor (``RolloutRayActor``) loads this file by path, instantiates :class:`AgentExecutor` with
no arguments, and for every rollout awaits ``AgentExecutor.execute(prompt, label, sampling_params, max_length,
hf_tokenizer, llm_engine)`` on the engine's event loop. :class:`AgentExecutor` is a ``MultiTurnAgentExecutor``:
OpenRLHF's own multi-turn loop does the token bookkeeping (action ids straight from vLLM, feedback tokenized on its
own, ``action_ranges`` marking only the generated ids, so tool output is masked out of the loss), and each episode
gets an :class:`AgentInstance` that wraps our :class:`~rstar_env.env.MathToolEnv` through its async API:

- ``reset``: the dataset row's prompt is the *problem* and its label the *answer*; the env renders the prompt
  (system prompt with the tool schemas, in the chat format's markers) and that becomes the observation.
- ``step``: the env parses the action, runs the tool calls, and returns the feedback already wrapped in the chat
  template's markers (end of turn, tool message, next assistant header); ``rewards``/``scores`` are tensors,
  ``done`` when the env ends the episode, ``extra_logs`` the tool-call statistics.

Where OpenRLHF's executor needs help, :class:`AgentExecutor` wraps the engine it is given: every turn it lowers
``max_tokens`` to the per-turn cap and to what the env's length budget leaves (+1, so that running over is
observable and the env ends the episode with reward 0), and adds ``</tool_call>`` and the end-of-turn marker as
stop strings (kept in the output, so the env sees complete calls). It also records each turn's token ids and
log-probs and hands them to the env, so the trajectory holds the ids vLLM produced, and it always returns complete
``extra_logs`` (OpenRLHF turns each key into a per-sample ``info`` tensor: a missing key would misalign a batch).

Nothing blocks the engine's event loop: the env (tools, sandbox, reward plugin) runs on a dedicated event loop in a
daemon thread of the engine process, and the engine's loop only awaits a future. A plugin that blocks (a sync
reward plugin, a slow sandbox call) stalls that thread, never vLLM's generation.

Configuration comes from the run YAML, never from editing this file: ``$RSTAR_ENV_CONFIG`` (the launcher sets it
for every Ray worker), else ``rstar_env.yaml`` next to this file. The ``env``, ``tools`` and ``reward`` sections
configure the env; ``trainer.max_new_tokens_per_turn``, ``trainer.stop`` and ``trainer.max_response_tokens`` the
turn caps. The file uses absolute imports only, because OpenRLHF loads it as a bare module named
``agent_module``.
"""

from __future__ import annotations

import asyncio
import contextvars
import copy
import threading
from collections.abc import Coroutine
from typing import Any, ClassVar, TypeVar

import torch
from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

from rstar_env import aio
from rstar_env.config import RunConfig
from rstar_env.env import MathToolEnv
from rstar_env.format import TOOL_CALL_CLOSE, get_chat_format
from rstar_env.outcomes import TOOL_ERROR_KINDS
from rstar_env.plugins import load_reward, load_tool
from rstar_env.trajectory import Trajectory
from rstar_trainers.openrlhf.config import OpenRLHFRLConfig, trainer_config
from rstar_trainers.openrlhf.policy_version import (
    TOKEN_VERSIONS_KEY,
    VERSION_MAX_KEY,
    VERSION_MIN_KEY,
    engine_version,
    version_runs,
)
from rstar_trainers.openrlhf.runtime import config_path, load_run_config
from rstar_trainers.openrlhf.trajectory_log import TRAJECTORY_KEY

T = TypeVar("T")

END_REASONS = ("answer", "max_turns", "length", "unfinished")


def episode_logs(trajectory: Trajectory | None) -> dict[str, float]:
    """The per-episode statistics put in ``extra_logs``; always the same keys, all floats.

    ``num_tool_calls``, ``num_tool_errors``, ``num_answer_blocks`` and ``num_assistant_turns`` are what the RoC
    sampler reads (by these exact names); the rest feed the dashboards: error counts by kind
    (``tool_errors_timeout``, ...), ``tool_error_ratio``, ``tool_seconds``, and one-hot ``end_<reason>`` flags
    (``end_unfinished``: OpenRLHF's length budget stopped the loop before the env ended the episode).
    """
    logs: dict[str, float] = {
        "num_tool_calls": 0.0,
        "num_tool_errors": 0.0,
        "num_answer_blocks": 0.0,
        "num_assistant_turns": 0.0,
        "tool_error_ratio": 0.0,
        "tool_seconds": 0.0,
    }
    logs.update({f"tool_errors_{kind}": 0.0 for kind in TOOL_ERROR_KINDS})
    logs.update({f"end_{reason}": 0.0 for reason in END_REASONS})
    if trajectory is None:
        logs["end_unfinished"] = 1.0
        return logs
    calls = trajectory.num_tool_calls
    errors = trajectory.num_tool_errors
    logs.update(
        num_tool_calls=float(calls),
        num_tool_errors=float(errors),
        num_answer_blocks=float(trajectory.num_answer_blocks),
        num_assistant_turns=float(trajectory.num_assistant_turns),
        tool_error_ratio=errors / calls if calls else 0.0,
        tool_seconds=float(sum(call.result.duration_s for call in trajectory.tool_calls)),
    )
    for kind, count in trajectory.tool_error_counts().items():
        logs[f"tool_errors_{kind}"] = float(count)
    logs[f"end_{trajectory.end_reason or 'unfinished'}"] = 1.0
    return logs


async def on_env_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` run on rstar-env's own loop thread; the caller's loop (vLLM's) only waits on a future."""
    return await aio.run_on_background(coro)


# -- process-wide settings and shared plugins ---------------------------------------------------------------------
class AgentRuntime:
    """What every episode of one process shares: the run config, the tool and reward plugin instances (one
    sandbox pool and one reward plugin per process, not one per episode), and the stop strings."""

    def __init__(self, run: RunConfig) -> None:
        settings = trainer_config(run)
        if not isinstance(settings, OpenRLHFRLConfig):
            raise TypeError("the OpenRLHF agent needs an RL config (trainer.stage: rl), not an SFT one")
        self.run = run
        self.settings = settings
        self.chat_format = get_chat_format(run.env.chat_format)
        stops = [TOOL_CALL_CLOSE, self.chat_format.turn_end.strip(), *settings.stop]
        self.stop: list[str] = [s for i, s in enumerate(stops) if s and s not in stops[:i]]
        self._tools: list[Any] | None = None
        self._reward: Any = None
        self._lock = threading.Lock()
        self._tokenizers: dict[int, Any] = {}

    _by_path: ClassVar[dict[str, AgentRuntime]] = {}  # one runtime per process and config path
    _by_path_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def from_environment(cls, next_to: str | None = None) -> AgentRuntime:
        """The runtime for ``$RSTAR_ENV_CONFIG`` (or ``rstar_env.yaml`` next to ``next_to``), one per process."""
        key = str(config_path(next_to))
        with cls._by_path_lock:
            if key not in cls._by_path:
                cls._by_path[key] = cls(load_run_config(next_to))
            return cls._by_path[key]

    def plugins(self) -> tuple[list[Any], Any]:
        with self._lock:
            if self._tools is None:
                self._tools = [load_tool(spec.name, **spec.options) for spec in self.run.tools]
                self._reward = load_reward(self.run.reward.name, **self.run.reward.options)
            return self._tools, self._reward

    def env_tokenizer(self, tokenizer: Any) -> Any:
        """A private copy of OpenRLHF's tokenizer for the env thread: a Rust tokenizer shared by two threads can
        fail with "Already borrowed"."""
        if tokenizer is None:
            return None
        with self._lock:
            if id(tokenizer) not in self._tokenizers:
                self._tokenizers[id(tokenizer)] = copy.deepcopy(tokenizer)
            return self._tokenizers[id(tokenizer)]

    def make_env(self, tokenizer: Any) -> MathToolEnv:
        tools, reward = self.plugins()
        # The length budget is the trainer's, in tokens (trainer_config rejects an env section that says otherwise).
        return MathToolEnv(
            tools=tools,
            reward=reward,
            config=self.run,
            tokenizer=self.env_tokenizer(tokenizer),
            max_length=self.settings.max_response_tokens,
            length_unit="tokens",
        )

    async def aclose(self) -> None:
        """Release the shared plugins (sandbox pools, reward workers)."""
        tools, reward = self._tools or [], self._reward
        self._tools, self._reward = None, None
        for plugin in [*tools, reward]:
            closer = getattr(plugin, "aclose", None)
            if closer is not None:
                await on_env_loop(closer())


# -- one episode ----------------------------------------------------------------------------------------------------
class _Episode:
    """One episode's shared state. A plain class, not a dataclass: OpenRLHF executes this file as a module that is
    not in ``sys.modules``, where ``@dataclass`` (which looks its module up there) fails."""

    def __init__(self, runtime: AgentRuntime, tokenizer: Any) -> None:
        self.runtime = runtime
        self.tokenizer = tokenizer
        self.instance: AgentInstance | None = None
        self.last_output: Any = None
        """The engine's last ``CompletionOutput`` (token ids, log-probs, finish reason) for this episode."""
        self.turn_versions: list[list[int]] = []
        """Per generated turn, the policy version of each of its tokens."""


_EPISODE: contextvars.ContextVar[_Episode | None] = contextvars.ContextVar("rstar_openrlhf_episode", default=None)


class _TurnEngine:
    """Wraps the engine for one episode: caps and stop strings per turn, and remembers what was generated.

    OpenRLHF hands ``generate`` a private deep copy of its sampling params, so changing it here is safe.
    """

    def __init__(self, engine: Any, episode: _Episode) -> None:
        self._engine = engine
        self._episode = episode

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any, multi_modal_data: Any = None) -> Any:
        episode = self._episode
        settings = episode.runtime.settings
        caps = [sampling_params.max_tokens, settings.max_new_tokens_per_turn]
        env = episode.instance.env if episode.instance is not None else None
        left = env.budget_left if env is not None else None
        if left is not None:
            caps.append(left + 1)  # one past the budget: the env sees the overrun and ends with reward 0
        sampling_params.max_tokens = max(1, min(c for c in caps if c is not None))
        stop = sampling_params.stop
        stop = [stop] if isinstance(stop, str) else list(stop or [])
        sampling_params.stop = stop + [s for s in episode.runtime.stop if s not in stop]
        sampling_params.include_stop_str_in_output = True  # the env must see "</tool_call>" to parse the call
        llm = getattr(self._engine, "llm", None)
        if llm is not None and not multi_modal_data:
            output, versions = await _streamed(llm, prompt_token_ids, sampling_params)
        else:  # an engine we cannot stream from: the turn's tokens get the version it ended with
            output = await self._engine.generate(prompt_token_ids, sampling_params, multi_modal_data=multi_modal_data)
            versions = [engine_version()] * len(output.outputs[0].token_ids)
        episode.last_output = output.outputs[0]
        episode.turn_versions.append(versions)
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)


async def _streamed(llm: Any, prompt_token_ids: list[int], sampling_params: Any) -> tuple[Any, list[int]]:
    """One turn from vLLM's ``AsyncLLM`` (what OpenRLHF's ``RolloutRayActor.generate`` does), streamed so that each
    token gets the policy version the engine held when it arrived: with partial rollouts a weight sync pauses the
    request mid-turn and it goes on with the new weights. (The version is set while generation is paused, and the
    chunks produced before the pause reach this loop during the broadcast, so the boundary is exact.)"""
    from vllm.inputs import TokensPrompt
    from vllm.utils import random_uuid

    versions: list[int] = []
    final = None
    async for output in llm.generate(TokensPrompt(prompt_token_ids=prompt_token_ids), sampling_params, random_uuid()):
        produced = len(output.outputs[0].token_ids)
        versions.extend([engine_version()] * (produced - len(versions)))
        final = output
    if final is None:
        raise RuntimeError("vLLM finished a request without any output")
    produced = len(final.outputs[0].token_ids)
    return final, (versions + [engine_version()] * produced)[:produced]


def _chosen_logprobs(output: Any) -> list[float] | None:
    entries = getattr(output, "logprobs", None)
    if not entries:
        return None
    values = []
    for token, entry in zip(output.token_ids, entries, strict=False):
        chosen = entry.get(token) if isinstance(entry, dict) else None
        if chosen is None:
            return None
        values.append(float(getattr(chosen, "logprob", chosen)))
    return values


class AgentInstance(AgentInstanceBase):
    """One episode of :class:`~rstar_env.env.MathToolEnv`, driven by OpenRLHF's multi-turn executor.

    ``reset({"observation": problem, "label": answer})`` returns ``{"observation": rendered prompt, "label"}``.
    ``step({"action_text", ...})`` returns ``{"rewards": tensor, "scores": tensor, "environment_feedback": str,
    "done": bool, "extra_logs": dict[str, float]}``. Built by OpenRLHF with no arguments inside
    :meth:`AgentExecutor.execute`, from which it takes the runtime and the tokenizer.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        episode = _EPISODE.get()
        self._episode = episode
        self.runtime = episode.runtime if episode is not None else AgentRuntime.from_environment(__file__)
        self.tokenizer = episode.tokenizer if episode is not None else None
        self.env: MathToolEnv | None = None
        if episode is not None:
            episode.instance = self

    @property
    def trajectory(self) -> Trajectory | None:
        return self.env.trajectory if self.env is not None else None

    async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        label = states.get("label")
        if label is None:
            raise ValueError("the prompt has no label: set --data.label_key to the answer field")
        # Off the caller's loop (vLLM's): the first env of a process copies the tokenizer and loads the plugins.
        self.env = await asyncio.to_thread(self.runtime.make_env, self.tokenizer)
        prompt, _ = await on_env_loop(self.env.areset(options={"problem": states["observation"], "answer": label}))
        return {"observation": prompt, "label": label}

    async def step(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        if self.env is None:
            raise RuntimeError("step() before reset()")
        action = states["action_text"]
        output = self._episode.last_output if self._episode is not None else None
        token_ids = list(output.token_ids) if output is not None else None
        logprobs = _chosen_logprobs(output) if output is not None else None
        if self._episode is not None:
            self._episode.last_output = None  # one generation feeds one step
        feedback, reward, terminated, truncated, info = await on_env_loop(
            self.env.astep(action, token_ids=token_ids, logprobs=logprobs)
        )
        reward_t = torch.tensor(float(reward))
        return {
            "rewards": reward_t,
            "scores": reward_t.clone(),
            "environment_feedback": feedback,
            "done": bool(terminated or truncated),
            "extra_logs": episode_logs(info["trajectory"]),
        }

    async def aclose(self) -> None:
        """End the episode: per-episode tool state (stateful interpreters) is released even when OpenRLHF's loop
        stopped on its own length budget without the env ending the episode."""
        if self.env is not None:
            await on_env_loop(self.env.aclose())


class AgentExecutor(MultiTurnAgentExecutor):
    """What OpenRLHF loads from ``--train.agent_func_path``: its multi-turn executor over :class:`AgentInstance`.

    ``AgentExecutor()`` reads the run config from the environment; ``AgentExecutor(run_config=...)`` takes one
    directly (tests, notebooks).
    """

    def __init__(self, run_config: RunConfig | None = None) -> None:
        super().__init__(AgentInstance)
        self.runtime = AgentRuntime(run_config) if run_config is not None else AgentRuntime.from_environment(__file__)

    async def execute(
        self,
        prompt: str,
        label: str,
        sampling_params: Any,
        max_length: int,
        hf_tokenizer: Any,
        llm_engine: Any,
        images: Any = None,
    ) -> dict[str, Any]:
        episode = _Episode(runtime=self.runtime, tokenizer=hf_tokenizer)
        token = _EPISODE.set(episode)  # AgentInstance() is built inside super().execute, in this same context
        try:
            result = await super().execute(
                prompt, label, sampling_params, max_length, hf_tokenizer, _TurnEngine(llm_engine, episode), images
            )
        finally:
            _EPISODE.reset(token)
            if episode.instance is not None:
                await episode.instance.aclose()
        instance = episode.instance
        trajectory = instance.trajectory if instance is not None else None
        result["extra_logs"] = episode_logs(trajectory)
        # Which policy version produced each generated token (several with partial rollouts); see policy_version.
        versions = [v for turn in episode.turn_versions for v in turn] or [engine_version()]
        result["extra_logs"][VERSION_MIN_KEY] = float(min(versions))
        result["extra_logs"][VERSION_MAX_KEY] = float(max(versions))
        result[TOKEN_VERSIONS_KEY] = [version_runs(turn) for turn in episode.turn_versions]
        # For trajectories.jsonl (the samples generator writes it on the trainer side; OpenRLHF ignores the key).
        result[TRAJECTORY_KEY] = trajectory.to_dict() if trajectory is not None else None
        return result
