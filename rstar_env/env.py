"""``MathToolEnv``: one math problem per episode, solved by a policy that may call tools between its turns.

    >>> import gymnasium as gym, rstar_env                                      # doctest: +SKIP
    >>> env = gym.make("rstar_env/MathTool-v0", tools=["python"], reward="math", max_turns=5)
    >>> obs, info = env.reset(options={"problem": "What is 6 * 7?", "answer": "42"})
    >>> obs, reward, terminated, truncated, info = env.step(
    ...     '<tool_call>\\n{"name": "python", "arguments": {"code": "6 * 7"}}\\n</tool_call>')
    >>> obs   # the feedback to append to the conversation: the tool response in chat-template markers
    >>> obs, reward, terminated, truncated, info = env.step("<answer>\\\\boxed{42}</answer>")
    >>> reward, terminated   # (1.0, True)

Observations are text to *append*: ``reset`` returns the whole prompt, ``step`` the feedback that follows the
action (empty when the episode ends), so a policy's context is ``prompt + action + obs + action + ...``.

Every episode ends: with an action that holds no tool call (its answer is scored: ``terminated``), at the turn
limit (the last action's answer, if any, is scored: ``truncated``), when the response outgrows the length budget,
or with an action longer than ``max_action_chars``, which is neither parsed nor run (reward 0: ``truncated``).
Nothing the policy writes raises: malformed calls (nested too deep or too long included), unknown tools and bad
arguments become tool responses that say what was wrong, counted as ``bad_call`` errors in the trajectory. Tool
output is data: chat markers in it are neutralised, and with a tokenizer its ids never hold a special token.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import pickle
import time
import traceback
import uuid
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar, SupportsFloat

import gymnasium
from pydantic import ValidationError

from rstar_env import aio, watchdog
from rstar_env.config import ConfigError, DatasetSpec, EnvConfig, PluginSpec, RunConfig, load_config
from rstar_env.data.records import check_row
from rstar_env.format import (
    DEFAULT_SYSTEM_PROMPT,
    ChatFormat,
    ParsedCall,
    get_chat_format,
    has_tool_call,
    parse_tool_calls,
    printable,
    render_system_prompt,
)
from rstar_env.plugins import check_tool, invoke, load_reward, load_tool
from rstar_env.reward import Reward, current_client
from rstar_env.spaces import TokenAction, UnicodeText
from rstar_env.special_tokens import SpecialTokens, encode_parts
from rstar_env.tool import EpisodeContext, Tool, ToolUnavailable, validate_arguments
from rstar_env.trajectory import SYSTEM_FAILURES, RewardResult, ToolCall, ToolResult, Trajectory, Turn

PluginLike = str | dict[str, Any] | PluginSpec | Tool | Reward

STEP_LIMIT_OPTION = "max_episode_steps"
"""The ``reset`` option that limits one episode's steps (scored as ``time_limit``)."""


class RewardError(RuntimeError):
    """The reward plugin failed to judge an answer (it raised): the episode ends as an ``env_error``, unscored."""


class RewardTimeout(RewardError):
    """The reward plugin did not finish within ``env.reward_timeout_s``: an ``env_error`` whose error starts with
    ``reward_timeout``."""


class MathToolEnv(gymnasium.Env[str, str]):
    """A multi-turn math environment with tools, a reward plugin and a length budget.

    Args:
        tools: tool names, ``{name, options}`` dicts, or tool instances (shared, not closed by this env).
        reward: a reward plugin name, ``{name, options}``, or an instance.
        max_turns: assistant turns per episode.
        dataset: where ``reset()`` without options draws problems: a path (``str`` or ``Path``), a generated-set
            spec, a preset or hub name, a ``{source, ...}`` dict of dataset options, or the rows themselves (a list
            of dicts, a ``datasets.Dataset`` / ``IterableDataset``, a :class:`~rstar_env.data.Dataset`), which are
            read at once so a bad row fails here. See :func:`rstar_env.data.load_dataset`.
        config: a YAML path, dict or :class:`~rstar_env.config.RunConfig`; keyword arguments override it.
        tokenizer: counts tokens for ``length_unit: tokens`` and fills token ids in the trajectory.
        preset: a named bundle of settings laid under the others (``"rstar2"``: the reference implementation's
            episode, see :mod:`rstar_env.presets`).
        max_episode_steps: cut every episode after this many steps as ``time_limit``, scored like ``max_turns``.
            One episode's limit can also come with its reset, ``reset(options={..., "max_episode_steps": n})``,
            which is how :class:`rstar_env.wrappers.ScoredTimeLimit` and :class:`rstar_env.wrappers.EnvAPI` make the
            step they truncate a scored one. The limit of ``gym.make(..., max_episode_steps=n)`` is scored too:
            the env finds the ``TimeLimit`` that ``make`` put around it at its first reset.
        **env_options: any other :class:`~rstar_env.config.EnvConfig` field (``max_length``, ``chat_format``, ...).

    Copies (``pickle``, ``copy.deepcopy``) keep the config, the loaded dataset and the random state, so the same seed
    draws the same problem; tools and the reward plugin are rebuilt for the copy and start their sandboxes and workers
    on first use, never sharing the original's. A running episode is not copied: call ``reset()`` on the copy.
    An env that is dropped without ``close()`` releases its sandboxes and workers when it is garbage-collected.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "human"]}

    def __init__(
        self,
        *,
        tools: Sequence[PluginLike] | None = None,
        reward: PluginLike | None = None,
        max_turns: int | None = None,
        dataset: Any = None,
        config: str | dict[str, Any] | RunConfig | None = None,
        tokenizer: Any = None,
        render_mode: str | None = None,
        preset: str | None = None,
        max_episode_steps: int | None = None,
        **env_options: Any,
    ) -> None:
        if max_episode_steps is not None and (isinstance(max_episode_steps, bool) or max_episode_steps < 1):
            raise ValueError(f"max_episode_steps must be a positive int or None, got {max_episode_steps!r}")
        rows = None if _is_dataset_spec(dataset) else dataset  # the rows themselves, not where to find them
        if isinstance(dataset, os.PathLike):
            dataset = os.fspath(dataset)
        cfg = load_config(
            config,
            preset=preset,
            tools=None if tools is None else [t for t in tools if _is_spec(t)],
            reward=reward if _is_spec(reward) else None,
            dataset=None if rows is not None else dataset,
        )
        if max_turns is not None or env_options:
            overrides = {**env_options, **({"max_turns": max_turns} if max_turns is not None else {})}
            try:
                cfg.env = EnvConfig.model_validate({**cfg.env.model_dump(), **overrides})
            except ValidationError as exc:
                raise ConfigError(f"invalid MathToolEnv option: {exc}") from None
        self.config: RunConfig = cfg
        self.settings: EnvConfig = cfg.env
        self.render_mode = render_mode
        self.tokenizer = tokenizer
        self.chat_format: ChatFormat = get_chat_format(cfg.env.chat_format)

        self.max_episode_steps = max_episode_steps
        self._episode_step_limit: int | None = None  # from the current episode's reset options
        self._make_limit: int | None = None  # from gym.make's TimeLimit, looked up at the first reset
        self._make_limit_known = False

        self._owned: list[Any] = []  # plugins this env built, and so closes
        # The release of what the plugins hold must not depend on close(): a dropped env releases it when collected.
        self._finalizer = weakref.finalize(self, _release_plugins, self._owned)
        self.tools: dict[str, Tool] = {}
        # How each tool and the reward were given (a spec, or a borrowed instance), for copies of this env.
        self._tool_entries: list[Any] = []
        specs = iter(cfg.tools)  # validated, in the order given
        for entry in tools if tools is not None else cfg.tools:
            if _is_spec(entry):
                spec = next(specs)
                self._tool_entries.append(spec)
                entry = self._own(_built(load_tool(spec.name, **spec.options), spec))
            else:
                check_tool(entry)  # a built instance is checked as a built-by-name one is
                self._tool_entries.append(entry)
            if entry.name in self.tools:
                raise ValueError(f"two tools are named {entry.name!r}; tool names must be unique in one env")
            self.tools[entry.name] = entry
        self._reward_entry: Any = cfg.reward if _is_spec(reward) else reward
        self.reward_fn: Reward = (
            self._own(_built(load_reward(cfg.reward.name, **cfg.reward.options), cfg.reward))
            if _is_spec(reward)
            else reward
        )

        self.system_prompt = render_system_prompt(
            cfg.env.system_prompt or DEFAULT_SYSTEM_PROMPT, [t.schema for t in self.tools.values()]
        )
        self.action_space = UnicodeText(cfg.env.max_action_chars)
        self.observation_space = UnicodeText(cfg.env.max_action_chars + len(self.system_prompt))

        self._dataset: Any = None
        self._trajectory: Trajectory | None = None
        self._episode: EpisodeContext | None = None
        self.client: str | None = None
        """Whose episodes these are (a server sets its client's key): the tools' calls are queued under it, served in
        turn with other clients' (:class:`~rstar_env.tool.EpisodeContext`). None: the one default client."""
        self._unscored = False  # this episode's row had no answer (allowed by dataset.allow_unscored)
        self._used = 0  # response length so far, in the length unit
        self._started = 0.0
        self._closed = False
        if rows is not None:
            self._dataset = self._load_dataset(rows)
            label = self._dataset.name if self._dataset.name not in ("", "memory") else type(rows).__name__
            cfg.dataset.source = f"(in memory: {label})"

    # -- gymnasium API -------------------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode on ``options={"problem", "answer"[, "id"]}``, or on a problem drawn from the dataset;
        see :meth:`areset`."""
        return aio.run_sync(self.areset(seed=seed, options=options))

    def step(
        self, action: str, *, token_ids: Sequence[int] | None = None, logprobs: Sequence[float] | None = None
    ) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Take one assistant action; see :meth:`astep`."""
        return aio.run_sync(self.astep(action, token_ids=token_ids, logprobs=logprobs))

    def render(self) -> str | None:
        if self._trajectory is None:
            return None
        text = printable(self._trajectory.prompt + self._trajectory.response)  # tool output may hold escapes
        if self.render_mode == "human":
            print(text)
            return None
        return text

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if aio.on_background_loop():  # closed from a coroutine on the env's own loop: it cannot wait on itself
            aio.spawn_on_background(self.aclose())
            return
        aio.run_sync(self.aclose())

    # -- copies ----------------------------------------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        # What defines the env travels; what holds processes, threads or loops (plugins, the episode) is rebuilt.
        for entry in [*self._tool_entries, self._reward_entry]:
            if _is_spec(entry):
                continue
            try:
                pickle.dumps(entry)
            except Exception as exc:
                raise TypeError(
                    f"cannot copy this MathToolEnv: the {getattr(entry, 'name', '?')!r} plugin was given as an "
                    f"instance ({type(entry).__name__}), which cannot be pickled ({type(exc).__name__}: {exc}). "
                    "Pass plugins by name or as {name, options} dicts, so each copy builds its own."
                ) from exc
        return {
            "config": self.config,
            "tools": list(self._tool_entries),
            "reward": self._reward_entry,
            "tokenizer": self.tokenizer,
            "render_mode": self.render_mode,
            "max_episode_steps": self.max_episode_steps,
            "dataset": self._dataset,
            "np_random": self._np_random,
            "np_random_seed": self._np_random_seed,
            "spec": self.spec,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            tools=state["tools"],
            reward=state["reward"],
            config=state["config"],
            tokenizer=state["tokenizer"],
            render_mode=state["render_mode"],
            max_episode_steps=state["max_episode_steps"],
        )
        self._dataset = state["dataset"]
        self._np_random = state["np_random"]
        self._np_random_seed = state["np_random_seed"]
        self.spec = state["spec"]

    # -- async API -------------------------------------------------------------------------------------------------
    async def areset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode on ``options={"problem", "answer"[, "id"]}``, or on a problem drawn from the dataset
        when no problem is given. ``options["max_episode_steps"]`` limits this episode alone (see ``time_limit``)."""
        super().reset(seed=seed)
        await self._end_episode()
        row = dict(options or {})
        limit = row.pop(STEP_LIMIT_OPTION, None)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"reset option {STEP_LIMIT_OPTION!r} must be a positive int or None, got {limit!r}")
        self._episode_step_limit = limit
        if not self._make_limit_known:
            self._make_limit = _gym_make_step_limit(self)
            self._make_limit_known = True
        if row:
            check_row(row, "reset options")
        row = row or self._draw()
        problem, answer = row.get("problem"), row.get("answer")
        if problem is None or not str(problem).strip():
            raise ValueError(
                f"reset options need 'problem' and 'answer', with a non-empty problem (got keys {sorted(row)}); "
                "pass options={'problem': ..., 'answer': ...} or configure a dataset"
            )
        self._unscored = answer is None or (isinstance(answer, str) and not answer.strip())
        if self._unscored and not self.config.dataset.allow_unscored:
            raise ValueError(
                f"reset options have no answer to score against ('answer' is {answer!r}); pass "
                "options={'problem': ..., 'answer': ...}, or build the env with dataset={'allow_unscored': True} "
                "to run such episodes unscored (reward 0, info['unscored'] True)"
            )
        user = self.settings.user_template.replace("{problem}", str(problem))
        prompt = self.chat_format.render_prompt(self.system_prompt, user)
        self._trajectory = Trajectory(
            problem=str(problem),
            answer="" if self._unscored else str(answer),
            prompt=prompt,
            id=None if row.get("id") is None else str(row["id"]),
            prompt_token_ids=self._encode(prompt) if self.tokenizer is not None else None,
            metadata={"unscored": True} if self._unscored else {},
        )
        self._episode = EpisodeContext(
            episode_id=uuid.uuid4().hex,
            problem=self._trajectory.problem,
            answer=self._trajectory.answer,
            client=self.client,
        )
        self._used = 0
        self._started = time.perf_counter()
        return prompt, self._info()

    async def astep(
        self, action: str, *, token_ids: Sequence[int] | None = None, logprobs: Sequence[float] | None = None
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Take one assistant action.

        ``token_ids``/``logprobs``: what a token-level policy generated for ``action``; recorded in the turn and
        used for the length budget instead of re-tokenizing.

        A :class:`~rstar_env.spaces.TokenAction` carries its own ``token_ids``/``logprobs``: that is how they pass
        through gymnasium wrappers, whose ``step`` takes the action alone.

        Nothing in ``action`` makes this raise. A failure of the env itself, a tool plugin or the reward plugin ends
        this episode alone with ``end_reason == "env_error"``, unscored, the traceback in ``info["error"]``.
        """
        if isinstance(action, TokenAction):
            token_ids = _one_of(token_ids, action.token_ids, "token_ids")
            logprobs = _one_of(logprobs, action.logprobs, "logprobs")
            action = str(action)
        traj, episode = self._trajectory, self._episode
        if traj is not None and traj.done:
            raise gymnasium.error.ResetNeeded(f"the episode has ended ({traj.end_reason}); call reset()")
        if traj is None or episode is None:
            raise gymnasium.error.ResetNeeded("call reset() before step()")
        if not isinstance(action, str):
            raise TypeError(f"an action is the assistant's text (str), got {type(action).__name__}")
        try:
            result = await self._astep(action, token_ids, logprobs, traj, episode)
            limit = self.time_limit
            if not traj.done and limit is not None and len(traj.turns) >= limit:
                result = await self._finish("time_limit", await self._score(action))
            return result
        except ConfigError:  # the caller's setup is wrong for every episode: say so, not one env_error each
            raise
        except RewardTimeout as exc:
            traj.end_reason = None
            return await self.aabort("env_error", str(exc))
        except ToolUnavailable as exc:  # the sandbox failed, not the model: nothing of it reaches the model or score
            traj.end_reason = None
            return await self.aabort("env_error", f"ToolUnavailable: {exc}")
        except Exception:
            traj.end_reason = None  # the failure may have struck while the episode was being finished
            return await self.aabort("env_error", traceback.format_exc())

    async def aabort(self, reason: str, error: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """End the episode as a failure of the system: ``reason`` is ``"env_error"`` or ``"policy_error"``.

        The episode is recorded with ``error`` and no score (``reward_result`` is ``None``): statistics, trainers
        and resumed evaluations leave it out, or run it again. Returns a final step (``truncated=True``).
        """
        if reason not in SYSTEM_FAILURES:
            raise ValueError(f"an aborted episode ends in one of {SYSTEM_FAILURES}, not {reason!r}")
        traj = self._trajectory
        if traj is None or traj.done:
            raise gymnasium.error.ResetNeeded("no episode is running; call reset()")
        traj.error = error
        return await self._finish(reason, None)

    def abort(self, reason: str, error: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """End the episode as a failure of the system; see :meth:`aabort`."""
        return aio.run_sync(self.aabort(reason, error))

    async def _astep(
        self,
        action: str,
        token_ids: Sequence[int] | None,
        logprobs: Sequence[float] | None,
        traj: Trajectory,
        episode: EpisodeContext,
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        episode.turn = len(traj.turns)
        turn = Turn(
            action=action,
            action_token_ids=list(token_ids) if token_ids is not None else None,
            action_logprobs=list(logprobs) if logprobs is not None else None,
        )
        if len(action) > self.settings.max_action_chars:
            # Neither parsed nor run (nor tokenized: it may be huge); scored like the length budget, reward 0.
            turn.action_tokens = len(token_ids) if token_ids is not None else None
            traj.turns.append(turn)
            return await self._finish("action_too_long", None)
        turn.action_tokens = len(token_ids) if token_ids is not None else self._count_tokens(action)
        traj.turns.append(turn)
        self._used += self._length(action, turn.action_tokens)

        if self._over_budget():
            return await self._finish("length", await self._score_truncated())
        if not has_tool_call(action):
            return await self._finish("answer", await self._score(action))
        if not self.settings.tools_on_last_turn and len(traj.turns) >= self.settings.max_turns:
            return await self._finish("max_turns", await self._score(action))

        limit = self.settings.max_tool_calls_per_turn
        calls = parse_tool_calls(action, limit)
        if self.settings.extra_tool_calls == "ignore":
            calls = calls[:limit]
        for parsed in calls:
            turn.tool_calls.append(await self._run_call(parsed, episode))
        # Tool output is data: its markers are neutralised, and only the template's markers become special tokens.
        specials = SpecialTokens.of(self.tokenizer).strings if self.tokenizer is not None else ()
        parts = self.chat_format.feedback_parts(action, [c.result.text for c in turn.tool_calls], specials)
        feedback = "".join(part.text for part in parts)
        turn.feedback = feedback
        if self.tokenizer is not None:
            turn.feedback_token_ids = encode_parts(self.tokenizer, parts)
            turn.feedback_tokens = len(turn.feedback_token_ids)
        self._used += self._length(feedback, turn.feedback_tokens)

        if self._over_budget():
            return await self._finish("length", await self._score_truncated())
        if len(traj.turns) >= self.settings.max_turns:
            return await self._finish("max_turns", await self._score(action))
        return feedback, 0.0, False, False, self._info()

    async def aclose(self) -> None:
        await self._end_episode()
        owned = list(self._owned)
        self._owned.clear()
        self._finalizer.detach()
        await _close_plugins(owned)

    @property
    def time_limit(self) -> int | None:
        """Steps after which the current episode ends as ``time_limit``: the smallest of the env's
        ``max_episode_steps``, the one its reset options gave, and that of the ``TimeLimit`` that
        ``gym.make(..., max_episode_steps=n)`` put around it; ``None`` for none."""
        limits = [n for n in (self.max_episode_steps, self._episode_step_limit, self._make_limit) if n is not None]
        return min(limits) if limits else None

    @property
    def budget_left(self) -> int | None:
        """What the length budget leaves for the response, in its unit; ``None`` with no budget."""
        budget = self.settings.max_length
        return None if budget is None else max(budget - self._used, 0)

    @property
    def trajectory(self) -> Trajectory | None:
        """The live trajectory of the current episode (``info["trajectory"]`` is a snapshot of it)."""
        return self._trajectory

    def tool_time_limit(self, tool: Tool) -> float:
        """Seconds one call of ``tool`` may take: ``env.tool_timeout_s``, or less when the tool asks for less with a
        ``call_timeout_s`` attribute (a tool can only lower the env's bound, never raise it)."""
        limit = self.settings.tool_timeout_s
        own = getattr(tool, "call_timeout_s", None)
        if isinstance(own, int | float) and not isinstance(own, bool) and own > 0:
            limit = min(limit, float(own))
        return limit

    @property
    def settings_key(self) -> dict[str, str]:
        """What produced this env's scores, recorded in each trajectory's ``metadata["settings"]``: the reward's
        name and a hash of its options, and a hash of the env settings and tools. A resumed evaluation reruns
        records whose key differs from the current one."""
        tools = [_fingerprint(entry) for entry in self._tool_entries]  # not cached: settings may be reassigned
        return {
            "reward": str(getattr(self.reward_fn, "name", "?")),
            "reward_options": _digest(_fingerprint(self._reward_entry)),
            "env": _digest({"env": self.settings.model_dump(mode="json"), "tools": tools}),
        }

    # -- internals -------------------------------------------------------------------------------------------------
    def _own(self, plugin: Any) -> Any:
        self._owned.append(plugin)
        return plugin

    def _load_dataset(self, source: Any) -> Any:
        from rstar_env.data import load_dataset

        spec = self.config.dataset
        dataset = load_dataset(source, **spec.model_dump(exclude={"source"}))
        if len(dataset) == 0:
            raise ValueError(f"dataset {spec.source!r} has no problems")
        return dataset

    def _draw(self) -> dict[str, Any]:
        if self._dataset is None:
            self._dataset = self._load_dataset(self.config.dataset.source)
        row = self._dataset[int(self.np_random.integers(len(self._dataset)))]
        return row.to_dict() if hasattr(row, "to_dict") else dict(row)

    async def _run_call(self, parsed: ParsedCall, episode: EpisodeContext) -> ToolCall:
        def bad(message: str) -> ToolCall:
            return ToolCall(parsed.raw, parsed.name, parsed.arguments, ToolResult(f"Error: {message}", "bad_call"))

        if parsed.error is not None:
            return bad(parsed.error)
        tool = self.tools.get(parsed.name or "")
        if tool is None:
            return bad(f"unknown tool {parsed.name!r}; available tools: {', '.join(self.tools) or 'none'}")
        problem = validate_arguments(tool.schema, parsed.arguments or {})
        if problem is not None:
            return bad(f"{parsed.name}: {problem}")
        start = time.perf_counter()
        limit = self.tool_time_limit(tool)
        try:
            result = await _bounded(
                invoke(tool.call, parsed.arguments or {}, episode), limit, f"tool {tool.name!r} call"
            )
            if not isinstance(result, ToolResult):
                raise TypeError(f"{type(tool).__name__}.call returned {type(result).__name__}, not ToolResult")
        except _TimedOut:
            result = ToolResult(
                f"Error: the {parsed.name} tool did not answer within {limit:g} s and was stopped.", "timeout"
            )
        except ToolUnavailable:
            raise  # the system failed the call, not the model: the episode ends env_error (astep), unscored
        except Exception as exc:  # a buggy plugin must not end the episode: it is a crashed tool call
            result = ToolResult(f"Error: the {parsed.name} tool failed ({type(exc).__name__}: {exc})", "crash")
        if not result.duration_s:
            result.duration_s = time.perf_counter() - start
        return ToolCall(parsed.raw, parsed.name, parsed.arguments, result)

    async def _score_truncated(self) -> RewardResult | None:
        """A response cut by the length budget: reward 0 (``None``), or scored as it stands."""
        traj = self._trajectory
        assert traj is not None
        return await self._score(traj.turns[-1].action) if self.settings.score_truncated else None

    async def _score(self, action: str) -> RewardResult:
        traj = self._trajectory
        assert traj is not None
        if self._unscored:  # no answer to judge against (allowed by dataset.allow_unscored)
            return RewardResult(0.0, None, "unscored")
        if self.settings.scored_text == "all_actions":
            action = "\n".join(turn.action for turn in traj.turns)
        limit = self.settings.reward_timeout_s
        scoring_for = current_client.set(self.client)  # the reward's shared workers serve clients in turn
        try:
            result = await _bounded(
                invoke(self.reward_fn.score, action, traj.answer), limit, f"reward {self.reward_fn.name!r} score"
            )
        except _TimedOut:
            raise RewardTimeout(
                f"reward_timeout: the {self.reward_fn.name!r} reward plugin did not finish within {limit:g} s "
                "(env.reward_timeout_s); the episode is not scored"
            ) from None
        except Exception as exc:  # a reward plugin that fails has not judged the answer: no score, an env_error
            raise RewardError(f"the {self.reward_fn.name!r} reward plugin raised {type(exc).__name__}: {exc}") from exc
        finally:
            current_client.reset(scoring_for)
        if not isinstance(result, RewardResult):
            raise RewardError(
                f"the {self.reward_fn.name!r} reward plugin returned {type(result).__name__}, "
                "not rstar_env.trajectory.RewardResult"
            )
        return result

    async def _finish(self, reason: str, result: RewardResult | None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        traj = self._trajectory
        assert traj is not None
        traj.end_reason = reason  # type: ignore[assignment]
        if traj.failed:
            traj.reward_result, traj.reward = None, 0.0  # not a score: nothing was judged
        else:
            traj.reward_result = result if result is not None else RewardResult(0.0, None, reason)
            traj.reward = float(traj.reward_result.reward)
        traj.duration_s = time.perf_counter() - self._started
        traj.metadata["settings"] = self.settings_key
        info = self._info()
        await self._end_episode()
        return "", traj.reward, reason == "answer", reason != "answer", info

    async def _end_episode(self) -> None:
        """Release every tool's per-episode state (stateful interpreters, ...): its optional ``close(episode)``."""
        episode, self._episode = self._episode, None
        if episode is None:
            return
        for tool in self.tools.values():
            close = getattr(tool, "close", None)
            if close is None:
                continue
            try:
                await _bounded(invoke(close, episode), self.tool_time_limit(tool), f"tool {tool.name!r} close")
            except Exception as exc:  # closing must go on for the other tools
                gymnasium.logger.warn(f"tool {tool.name!r} failed to close episode {episode.episode_id}: {exc}")

    def _info(self) -> dict[str, Any]:
        traj = self._trajectory
        assert traj is not None
        info = {"trajectory": traj.copy(), "turn": len(traj.turns), "end_reason": traj.end_reason}
        if self._unscored:
            info["unscored"] = True
        if traj.error is not None:
            info["error"] = traj.error
        return info

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _count_tokens(self, text: str) -> int | None:
        return len(self._encode(text)) if self.tokenizer is not None else None

    def _length(self, text: str, tokens: int | None) -> int:
        if self.settings.length_unit == "chars":
            return len(text)
        if tokens is None:
            raise ConfigError(
                "length_unit is 'tokens' but no token count is known: give MathToolEnv a tokenizer "
                "or pass token_ids to step()"
            )
        return tokens

    def _over_budget(self) -> bool:
        budget = self.settings.max_length
        return budget is not None and self._used > budget

    def __repr__(self) -> str:
        tools, reward = list(self.tools), self.reward_fn.name
        return f"MathToolEnv(tools={tools}, reward={reward!r}, max_turns={self.settings.max_turns})"


async def _close_plugins(plugins: list[Any]) -> None:
    # A plugin that holds resources (a sandbox pool, a reward's workers) releases them in `aclose()`.
    for plugin in plugins:
        closer = getattr(plugin, "aclose", None)
        if closer is not None:
            await closer()


def _release_plugins(owned: list[Any]) -> None:
    """Finalizer of a garbage-collected (or, at exit, still open) env: close the plugins it built."""
    plugins = list(owned)
    owned.clear()
    if not plugins:
        return
    if getattr(weakref.finalize, "_shutdown", False) and not aio.on_background_loop():
        aio.run_sync(_close_plugins(plugins))  # at interpreter exit: wait, the loop thread dies next
    else:
        # Collection can strike in any thread, even one holding a lock the closing needs: never wait here.
        aio.spawn_on_background(_close_plugins(plugins))


class _TimedOut(Exception):
    """A plugin call outlived its time limit."""


async def _bounded(coro: Any, limit: float, name: str) -> Any:
    """Await ``coro`` for at most ``limit`` seconds, else raise :class:`_TimedOut`.

    The call runs as a task named ``name`` (what the loop watchdog reports when it blocks the loop) that is
    cancelled, not awaited, past the limit: a plugin that ignores cancellation cannot hold the episode. A plain
    (``def``) plugin method runs in a thread (:func:`~rstar_env.plugins.invoke`), so its limit holds; one that
    blocks the event loop (``time.sleep`` in ``async def``) cannot be interrupted, but the result it returns late is
    still treated as a timeout, never as a valid one.
    """
    loop = asyncio.get_running_loop()
    watchdog.watch(loop)
    start = time.perf_counter()
    task = loop.create_task(coro, name=name)
    # The name is "<kind> '<plugin>' <method>": a stall this task causes is that plugin's to fix.
    watchdog.attribute(task, name.rpartition(" ")[0] or name)
    try:
        done, _ = await asyncio.wait({task}, timeout=limit)
    except asyncio.CancelledError:  # the step itself was cancelled: so is the call it was waiting for
        task.cancel()
        task.add_done_callback(_swallow)
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_swallow)
        raise _TimedOut
    if time.perf_counter() - start > limit:
        task.add_done_callback(_swallow)
        raise _TimedOut
    return task.result()


def _swallow(task: Any) -> None:
    if not task.cancelled():
        task.exception()  # retrieved, so asyncio does not log "exception was never retrieved"


_BUILT_FROM: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
"""The spec each plugin instance an env built came from, so an env that borrows it (a vector env's sub-envs) has
the same settings key as the env that built it."""


def _built(instance: Any, spec: PluginSpec) -> Any:
    with contextlib.suppress(TypeError):  # not weak-referenceable or not hashable: fingerprinted as an instance
        _BUILT_FROM[instance] = _fingerprint(spec)
    return instance


def _fingerprint(entry: Any) -> Any:
    """A plugin as given (a spec, or an instance), as JSON: its name and options (an instance not built from a
    spec: its class and public attributes of plain types)."""
    if isinstance(entry, PluginSpec):
        return {"name": entry.name, "options": entry.options}
    with contextlib.suppress(TypeError):
        if entry in _BUILT_FROM:
            return _BUILT_FROM[entry]
    plain = (
        {
            k: v
            for k, v in sorted(vars(entry).items())
            if not k.startswith("_") and isinstance(v, str | int | float | bool | type(None))
        }
        if hasattr(entry, "__dict__")
        else {}
    )
    return {
        "name": getattr(entry, "name", "?"),
        "class": f"{type(entry).__module__}.{type(entry).__qualname__}",
        "options": plain,
    }


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def _one_of(given: Any, carried: Any, name: str) -> Any:
    if given is None:
        return carried
    if carried is not None and list(given) != list(carried):
        raise ValueError(f"{name} were passed both to step() and inside the TokenAction, and differ; pass them once")
    return given


def _is_dataset_spec(value: Any) -> bool:
    """Where to find problems (``None``, a path, a name, dataset options), rather than the problems themselves."""
    return value is None or isinstance(value, str | os.PathLike | dict | DatasetSpec)


def _is_spec(value: Any) -> bool:
    """A plugin named (``"python"``, ``{name, options}``, a PluginSpec, or None for the default), not an instance."""
    return value is None or isinstance(value, str | dict | PluginSpec)


def _gym_make_step_limit(env: MathToolEnv) -> int | None:
    """The limit of the gymnasium ``TimeLimit`` wrapping ``env``, when ``gym.make`` built it; else ``None``.

    ``gym.make(..., max_episode_steps=n)`` gives ``n`` to the ``TimeLimit`` it puts outside the env and records it
    in that wrapper's ``spec`` only: the env's own ``spec`` says ``None``, and no call tells the env. So the env
    looks for the wrappers that hold it, once (an env ``make`` did not build, with no ``spec``, has none to find).
    """
    if env.spec is None:
        return None
    from gymnasium.wrappers import TimeLimit

    limits: list[int] = []
    inner: Any = env
    for _ in range(32):  # a wrapper stack is a chain: each wrapper holds the next one in as ``env``
        outer = next(_wrappers_holding(inner), None)
        if outer is None:
            break
        limit = outer.spec.max_episode_steps if isinstance(outer, TimeLimit) and outer.spec is not None else None
        if limit is not None:
            limits.append(int(limit))
        inner = outer
    return min(limits) if limits else None


def _wrappers_holding(inner: Any) -> Iterator[gymnasium.Wrapper]:
    import gc

    for ref in gc.get_referrers(inner):
        if isinstance(ref, gymnasium.Wrapper) and ref.env is inner:
            yield ref
        elif isinstance(ref, dict) and ref.get("env") is inner:  # a wrapper whose __dict__ was materialized (a copy)
            for owner in gc.get_referrers(ref):
                if isinstance(owner, gymnasium.Wrapper) and getattr(owner, "__dict__", None) is ref:
                    yield owner
