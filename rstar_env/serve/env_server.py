"""``rstar-env serve env``: the env as an OpenEnv environment server.

Wire format (the OpenEnv protocol: ``{"type": "reset" | "step" | "state" | "close", "data": ...}`` over ``/ws``):

- reset ``data``: ``{"problem": str, "answer": str[, "id": str]}``, or nothing (or only ``seed``) to draw from the
  configured dataset (the same ``seed`` draws the same problem as ``MathToolEnv.reset(seed=...)``);
- step ``data`` (:class:`MathToolAction`): ``{"text": str}``, one assistant turn with hermes tool calls inside, or
  ``{"token_ids": [...]}`` (decoded with the server's ``--model`` tokenizer; ``text`` may come too);
- the observation (:class:`MathToolObservation`): ``text`` (the prompt after reset, the feedback to append after a
  step), ``token_ids`` (the same text as the model's template renders it, when the server has a tokenizer: a client
  that appends these ids never re-tokenizes), ``info`` (``turn``, ``end_reason``, ``tool_calls`` with each call's
  outcome, ``reward_reason`` and, at the end, the whole ``trajectory``), ``reward`` and ``done``.

One WebSocket session holds one env (one episode at a time); every session borrows the server's tools and reward
plugin (:class:`~rstar_env.serve.resources.Resources`), so all share one warm sandbox pool. A closed or dropped
session closes its env, which ends its episode and its stateful sandbox session. Episodes step on the server's own
event loop: sandboxes and plugins bind to no loop (:mod:`rstar_env.aio`), and a hop to rstar-env's background loop
would cost two thread switches per step for nothing.

OpenEnv's own HTTP ``/reset`` and ``/step`` build a fresh env per request, which cannot hold a multi-turn episode.
Here they keep one by id: ``/reset`` returns ``info.episode_id`` and ``/step`` takes it back (``{"action": ...,
"episode_id": ...}``); a ``/step`` without a known id is answered 409 with a message that names ``/ws``.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from typing import Annotated, Any

import numpy as np

import rstar_env.serve._openenv  # noqa: F401  (first: openenv without its Gradio web UI)

# isort: split
from fastapi import Body, FastAPI, HTTPException, Request
from openenv.core.env_server import Action, Environment, Observation, State
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.types import ConcurrencyConfig, EnvironmentMetadata, ServerCapacityStatus
from pydantic import Field, ValidationError, model_validator

from rstar_env import ENV_ID, __version__
from rstar_env.env import MathToolEnv
from rstar_env.serve.guard import client_of
from rstar_env.serve.resources import Resources
from rstar_env.serve.sessions import CapacityError, Session, Sessions
from rstar_env.serve.ws import add_session_routes, response

RESET_KEYS = frozenset({"problem", "answer", "id", "max_episode_steps"})
"""What a reset may carry besides ``seed`` and ``episode_id``."""


class MathToolAction(Action):
    """One assistant turn: its ``text``, or its ``token_ids`` (decoded by the server's tokenizer), or both (the
    ids are then recorded as what the policy generated, and ``text`` is what is parsed)."""

    text: str | None = Field(default=None, description="The assistant's turn, hermes <tool_call> blocks inside.")
    token_ids: list[int] | None = Field(default=None, description="The turn's token ids, as the policy generated.")
    logprobs: list[float] | None = Field(default=None, description="The sampling log-probs of token_ids.")

    @model_validator(mode="after")
    def _one_given(self) -> MathToolAction:
        if self.text is None and self.token_ids is None:
            raise ValueError('an action is {"text": str} or {"token_ids": [int, ...]}; neither was given')
        if self.logprobs is not None and (self.token_ids is None or len(self.logprobs) != len(self.token_ids)):
            raise ValueError("logprobs come with token_ids, one per token")
        return self


class MathToolObservation(Observation):
    """What the env says back; see the module docstring."""

    text: str = Field(default="", description="Prompt (after reset) or feedback (after a step) to append.")
    token_ids: list[int] | None = Field(default=None, description="text's ids in the model's template, if known.")
    info: dict[str, Any] = Field(default_factory=dict, description="turn, end_reason, tool_calls, episode_id, ...")


class MathToolState(State):
    """The session's episode: its id, steps, problem id, turn and how it ended (``None`` while it runs)."""

    problem_id: str | None = None
    end_reason: str | None = None
    done: bool = False


class MathToolEnvironment(Environment[MathToolAction, MathToolObservation, MathToolState]):
    """One session's env: a :class:`~rstar_env.env.MathToolEnv` on the server's shared plugins."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, resources: Resources) -> None:
        super().__init__()
        self.resources = resources
        cfg = resources.config
        self.env = MathToolEnv(
            tools=resources.tools, reward=resources.reward, config=cfg, tokenizer=resources.tokenizer
        )
        self._rng: np.random.Generator | None = None
        self._state = MathToolState()

    # -- OpenEnv API -------------------------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> MathToolObservation:
        from rstar_env import aio

        return aio.run_sync(self.reset_async(seed=seed, episode_id=episode_id, **kwargs))

    async def reset_async(
        self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any
    ) -> MathToolObservation:
        unknown = set(kwargs) - RESET_KEYS
        if unknown:
            raise ValueError(
                f"unknown reset field(s) {sorted(unknown)}: a reset takes problem, answer, id, seed, "
                "episode_id and max_episode_steps"
            )
        options = {key: value for key, value in kwargs.items() if value is not None}
        if "problem" not in options:
            options = {**self._draw(seed), **options}
        prompt, _ = await self.env.areset(seed=seed, options=options)
        traj = self.env.trajectory
        assert traj is not None
        self._state = MathToolState(episode_id=episode_id or uuid.uuid4().hex, step_count=0, problem_id=traj.id)
        return MathToolObservation(
            text=prompt,
            token_ids=traj.prompt_token_ids,
            done=False,
            reward=None,
            info={"episode_id": self._state.episode_id, "turn": 0, "end_reason": None, "problem_id": traj.id},
        )

    def step(self, action: MathToolAction, timeout_s: float | None = None, **kwargs: Any) -> MathToolObservation:
        from rstar_env import aio

        return aio.run_sync(self.step_async(action))

    async def step_async(
        self, action: MathToolAction, timeout_s: float | None = None, **kwargs: Any
    ) -> MathToolObservation:
        text = action.text
        if text is None:
            tokenizer = self.resources.tokenizer
            if tokenizer is None:
                raise ValueError(
                    'a {"token_ids": [...]} action needs the server to know the model\'s tokenizer: '
                    'start it with --model, or send {"text": ...}'
                )
            text = tokenizer.decode(action.token_ids, skip_special_tokens=False)
        feedback, reward, terminated, truncated, info = await self.env.astep(
            text, token_ids=action.token_ids, logprobs=action.logprobs
        )
        traj = info["trajectory"]
        turn = traj.turns[-1]
        done = bool(terminated or truncated)
        self._state.step_count += 1
        self._state.end_reason, self._state.done = traj.end_reason, done
        out: dict[str, Any] = {
            "episode_id": self._state.episode_id,
            "turn": info["turn"],
            "end_reason": traj.end_reason,
            "terminated": bool(terminated),
            "truncated": bool(truncated),
            "tool_calls": [
                {"name": call.name, "error": call.result.error, "duration_s": call.result.duration_s}
                for call in turn.tool_calls
            ],
        }
        if done:
            result = traj.reward_result
            out.update(
                reward_reason=None if result is None else result.reason,
                extracted=None if result is None else result.extracted,
                error=traj.error,
                trajectory=traj.to_dict(),
            )
        return MathToolObservation(
            text=feedback,
            token_ids=None if done else turn.feedback_token_ids,
            done=done,
            reward=float(reward),
            info=out,
        )

    @property
    def state(self) -> MathToolState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        tools = ", ".join(self.env.tools) or "none"
        return EnvironmentMetadata(
            name=ENV_ID,
            version=__version__,
            description=f"rstar-env: math problems solved with tools ({tools}), scored by the "
            f"{self.env.reward_fn.name!r} reward plugin",
        )

    def bind_client(self, client: str) -> None:
        """Queue this session's tool calls under ``client`` (the sandbox serves clients in turn)."""
        self.env.client = client

    def close(self) -> None:
        """End the episode (and its stateful sandbox session); the shared plugins stay open."""
        self.env.close()

    # -- internals ---------------------------------------------------------------------------------------------------
    def _draw(self, seed: int | None) -> dict[str, Any]:
        """A row of the configured dataset, drawn the way ``MathToolEnv.reset(seed=...)`` draws one."""
        dataset = self.resources.dataset
        if dataset is None or len(dataset) == 0:
            raise ValueError("this server has no dataset to draw from: send reset with problem and answer")
        if seed is not None or self._rng is None:
            self._rng = np.random.default_rng(seed)
        row = dataset[int(self._rng.integers(len(dataset)))]
        return row.to_dict() if hasattr(row, "to_dict") else dict(row)


class HttpEpisodes:
    """Episodes driven over plain HTTP, kept by id between ``/reset`` and ``/step``: each one a session of the
    server's table (:class:`~rstar_env.serve.sessions.Sessions`: the one cap, the idle and lifetime limits), closed
    when it ends, when a limit ends it, or at shutdown. Its id is the server's (128 random bits) and only the client
    that made it reaches it: a client cannot name another client's episode, nor choose an id another client uses."""

    def __init__(self, factory: Any, sessions: Sessions) -> None:
        self.factory = factory
        self.sessions = sessions

    async def reset(self, data: dict[str, Any], owner: str) -> dict[str, Any]:
        given = data.pop("episode_id", None)
        if given is not None:  # resetting an open episode of this client's: the same id, a new problem
            session = self._find(given, owner, "/reset")
            if session.busy:
                raise HTTPException(409, f"episode {given!r} is still running a step; send one request at a time")
        else:
            try:
                session = self.sessions.open("http", owner)  # the slot is taken now, before any await
            except CapacityError as exc:
                raise HTTPException(503, f"{exc}; finish HTTP episodes you started, or use /ws") from None
            try:
                env = await asyncio.to_thread(self.factory)
            except BaseException:
                await self.sessions.end(session)
                raise
            env.bind_client(owner)
            session.obj, session.close = env, functools.partial(_close, env)
        try:
            with self.sessions.using(session):
                obs = await session.obj.reset_async(episode_id=session.id, **data)
        except Exception:
            await self.sessions.end(session)
            raise
        return response(obs)

    async def step(self, episode_id: Any, action: dict[str, Any], owner: str) -> dict[str, Any]:
        session = self._find(episode_id, owner, "/step")
        try:
            parsed = MathToolAction.model_validate(action)
        except ValidationError as exc:
            raise HTTPException(422, exc.errors(include_url=False, include_context=False)) from None
        if session.busy:
            raise HTTPException(409, f"episode {episode_id!r} is still running a step; send one step at a time")
        try:
            with self.sessions.using(session):
                obs = await session.obj.step_async(parsed)
        except ValueError as exc:  # a token-id action on a text-only server
            raise HTTPException(422, str(exc)) from None
        if obs.done:
            await self.sessions.end(session)
        return response(obs)

    def state(self, episode_id: str | None, owner: str) -> dict[str, Any]:
        session = self.sessions.get(episode_id, owner, "http")
        if session is None:
            raise HTTPException(
                409,
                "GET /state needs ?episode_id= of an open HTTP episode of yours; a /ws session asks "
                'with a {"type": "state"} message',
            )
        return session.obj.state.model_dump()  # type: ignore[no-any-return]

    def _find(self, episode_id: Any, owner: str, route: str) -> Session:
        session = self.sessions.get(episode_id if isinstance(episode_id, str) else None, owner, "http")
        if session is None or session.obj is None:
            what = "no episode_id" if not episode_id else f"no open episode {episode_id!r} of yours"
            raise HTTPException(
                409,
                f"HTTP {route} got {what}. Multi-turn episodes run over the WebSocket /ws "
                "(OpenEnv's EnvClient / GenericEnvClient); over HTTP, /reset without an episode_id starts one, "
                "and each /step sends the episode_id that /reset returned (observation.info.episode_id): ids are "
                "the server's. Episodes are closed when they end or sit idle (--idle-timeout-s).",
            )
        return session


async def _close(env: MathToolEnvironment) -> None:
    await asyncio.to_thread(env.close)


def add_env_routes(app: FastAPI, resources: Resources, sessions: Sessions) -> HttpEpisodes:
    """Mount ``/ws`` and ``/mcp`` (:mod:`rstar_env.serve.ws`), the by-id HTTP ``/reset``, ``/step`` and ``/state``,
    ``/capacity``, and OpenEnv's stateless routes (``/health``, ``/schema``, ``/metadata``) on ``app``, every
    session in ``sessions``; returns the HTTP episodes."""
    factory = functools.partial(MathToolEnvironment, resources)
    episodes = HttpEpisodes(factory, sessions)
    # Registered before OpenEnv's routes of the same paths, so these answer (Starlette takes the first match).
    add_session_routes(app, sessions, factory, MathToolAction, _close)

    @app.post("/reset", tags=["Environment Control"], summary="Start an HTTP episode (kept by id)")
    async def http_reset(request: Request, body: Annotated[dict[str, Any] | None, Body()] = None) -> dict[str, Any]:
        try:
            return await episodes.reset(dict(body or {}), client_of(request.scope))
        except ValueError as exc:
            raise HTTPException(422, str(exc)) from None

    @app.post("/step", tags=["Environment Control"], summary="Step an HTTP episode by its id")
    async def http_step(request: Request, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        action = body.get("action")
        if not isinstance(action, dict):
            raise HTTPException(422, 'a /step body is {"action": {"text": ...}, "episode_id": ...}')
        return await episodes.step(body.get("episode_id"), action, client_of(request.scope))

    @app.get("/state", tags=["State Management"], summary="The state of an HTTP episode")
    async def http_state(request: Request, episode_id: str | None = None) -> dict[str, Any]:
        return episodes.state(episode_id, client_of(request.scope))

    @app.get("/capacity", tags=["Health"], summary="Sessions open and allowed")
    async def capacity(request: Request) -> dict[str, Any]:
        counts = sessions.counts()
        gates = {name: getattr(request.app.state, f"{name}_gate", None) for name in ("run_code", "verify")}
        active = sum(counts.values())
        return {
            **ServerCapacityStatus.from_counts(active, sessions.max_sessions).model_dump(),
            "available_slots": max(sessions.max_sessions - active, 0),
            "http_episodes": counts["http"],
            "by_kind": counts,
            "calls": {
                name: {"slots": gate.slots, "running": gate.busy, "queued": gate.queued()}
                for name, gate in gates.items()
                if gate is not None
            },
        }

    # OpenEnv's stateless routes; its /ws, /mcp, /reset and /step are shadowed by the ones above.
    server = HTTPEnvServer(
        factory,
        MathToolAction,
        MathToolObservation,
        concurrency_config=ConcurrencyConfig(max_concurrent_envs=sessions.max_sessions),
    )
    server.register_routes(app)
    return episodes


__all__ = [
    "HttpEpisodes",
    "MathToolAction",
    "MathToolEnvironment",
    "MathToolObservation",
    "MathToolState",
    "add_env_routes",
    "response",
]
