"""``ray``: spread the tool's code over a Ray cluster, behind the sandbox protocol.

Install with ``pip install 'rstar-env[ray]'``; ``create_sandbox("ray")`` joins the running Ray cluster (or
starts a local one) and places sandbox actors on its nodes.

How calls map onto the cluster::

    execute(...) ─▶ router (this process) ─▶ batch of <= 64 calls ─▶ SandboxActor on node k ─▶ its LocalSandbox
                                  ◀──────── results streamed back one by one as each call finishes ◀─┘

* **Actors.** ``num_actors`` actors (default: one per alive node, placed with the SPREAD strategy), each
  holding a local warm sandbox pool (:mod:`rstar_env.sandbox.local`) of ``max_concurrency`` workers on its
  node. Each actor is an async actor: many batches are in flight at once, and its pool's queue is the
  back-pressure.
* **Routing.** A stateless call goes to the actor with the fewest calls in flight. A session is pinned to the
  actor that ran its first call (its interpreter lives there), and its calls are sent one at a time, in order.
* **Batching.** Calls made within ``batch_window_s`` (2 ms) of each other for the same actor travel in one
  dispatch of up to ``batch_size`` (64, as the rStar reference does): one Ray task instead of 64. Results
  stream back as each call finishes (a Ray streaming generator), so a slow call never holds back its batch.
* **Failures.** If an actor dies (its node is lost, it is killed, its process crashes), every call in flight on
  it returns ``crash``, each session pinned to it returns ``crash`` ("its state is lost") on its next call
  and then starts over elsewhere, and the pool starts a replacement actor. Nothing waits forever: a dispatch
  with no answer by its deadline (``timeout + call_grace_s``) returns ``crash``.
* ``aclose`` ends the sessions and kills the actors; a Ray instance this backend started stays up for the
  rest of the process (other code may be using it), and a cluster it joined is never shut down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from . import ExecResult, SandboxError, _remote_loop
from ._ray_actor import SandboxActor

logger = logging.getLogger("rstar_env.sandbox")

BATCH_SIZE = 64
"""Calls per dispatch at most (the rStar reference's batch size)."""


@dataclass(eq=False)
class _Actor:
    handle: Any
    index: int
    load: int = 0
    sessions: int = 0
    dead: bool = False
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(eq=False)
class _Pending:
    call: dict[str, Any]
    future: asyncio.Future[ExecResult]
    deadline_s: float


@dataclass(eq=False)
class _Session:
    lock: asyncio.Lock
    actor: _Actor | None = None


class RaySandbox(_remote_loop.LoopSandbox):
    """A pool of Ray actors, each with a local sandbox pool (see the module docstring).

    Options (all keyword):

    * ``address``: the Ray cluster to join when Ray is not initialised yet (default: ``RAY_ADDRESS``, or a new
      local instance); ``ray_init``: more keyword arguments for ``ray.init`` (e.g. ``num_cpus``).
    * ``num_actors``: sandbox actors (default: one per alive node); ``actor_options``: Ray options for each
      (default ``{"num_cpus": 1}``, placed with ``scheduling_strategy="SPREAD"``).
    * ``max_concurrency``: workers of each actor's local pool (default: the node's cores); ``timeout_s``,
      ``max_output_bytes`` and ``local_options``: the rest of the local pool's options.
    * ``batch_size`` (64): calls per dispatch at most; ``batch_window_s`` (0.002): how long a call waits for
      others to share its dispatch (calls made together, e.g. by ``asyncio.gather``, arrive within it);
      ``call_grace_s`` (60): how long past its timeout a call
      may wait in queues before it is given up as ``crash``; ``start_timeout_s`` (180): actor start-up bound.
    """

    def __init__(
        self,
        *,
        address: str | None = None,
        ray_init: dict[str, Any] | None = None,
        num_actors: int | None = None,
        actor_options: dict[str, Any] | None = None,
        max_concurrency: int | None = None,
        timeout_s: float = 4.0,
        max_output_bytes: int = 1 << 20,
        local_options: dict[str, Any] | None = None,
        batch_size: int = BATCH_SIZE,
        batch_window_s: float = 0.002,
        call_grace_s: float = 60.0,
        start_timeout_s: float = 180.0,
    ) -> None:
        super().__init__(timeout_s=timeout_s, max_output_bytes=max_output_bytes)
        try:
            import ray
        except ImportError as exc:
            raise SandboxError(
                f"the ray sandbox backend needs Ray ({exc}); install it with `pip install 'rstar-env[ray]'`"
            ) from exc
        self._ray = ray
        if num_actors is not None and num_actors < 1:
            raise ValueError("num_actors must be >= 1")
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.address = address
        self.ray_init = {"include_dashboard": False, "log_to_driver": False, **(ray_init or {})}
        self.num_actors = num_actors
        self.actor_options = {"num_cpus": 1, "scheduling_strategy": "SPREAD", **(actor_options or {})}
        self.local_options: dict[str, Any] = {
            **(local_options or {}),
            "timeout_s": self.timeout_s,
            "max_output_bytes": self.max_output_bytes,
        }
        if max_concurrency is not None:
            self.local_options["max_concurrency"] = int(max_concurrency)
        self.batch_size = int(batch_size)
        self.batch_window_s = float(batch_window_s)
        self.call_grace_s = float(call_grace_s)
        self.start_timeout_s = float(start_timeout_s)
        self.stats: dict[str, int] = {"dispatches": 0, "calls": 0, "actors_started": 0, "actors_replaced": 0}
        """Counters for monitoring and tests (calls / dispatches is the mean batch size)."""
        self._remote_cls: Any = None
        self._actors: list[_Actor] = []
        self._sessions: dict[str, _Session] = {}
        self._queue: list[tuple[_Actor, _Pending]] = []
        self._flush_scheduled = False
        self._background: set[asyncio.Task[Any]] = set()
        self._next_index = 0
        self._started_ray = False

    # ------------------------------------------------------------------------------------------- info

    @property
    def actors(self) -> list[Any]:
        """Handles of the live actors (for monitoring, and for tests that kill one)."""
        return [actor.handle for actor in self._actors if not actor.dead]

    # ------------------------------------------------------------------------------------------- lifecycle

    async def _start(self) -> None:
        ray = self._ray
        if not ray.is_initialized():
            options = dict(self.ray_init)
            if self.address is not None:
                options["address"] = self.address
            try:
                await asyncio.to_thread(_init_ray, ray, options)
            except Exception as exc:
                raise SandboxError(f"could not start or join Ray ({exc}); check `address` / RAY_ADDRESS") from exc
            self._started_ray = True
        self._remote_cls = ray.remote(SandboxActor)
        count = self.num_actors
        if count is None:
            count = max(1, sum(1 for node in ray.nodes() if node.get("Alive")))
        actors = await asyncio.gather(*(self._new_actor() for _ in range(count)), return_exceptions=True)
        for actor in actors:
            if isinstance(actor, BaseException):
                raise SandboxError(f"could not start a Ray sandbox actor: {actor}") from actor
            self._actors.append(actor)

    async def _new_actor(self) -> _Actor:
        handle = self._remote_cls.options(max_concurrency=1000, **self.actor_options).remote(self.local_options)
        try:
            info = await asyncio.wait_for(_await(handle.info.remote()), self.start_timeout_s)
        except BaseException:
            with contextlib.suppress(Exception):
                self._ray.kill(handle)
            raise
        actor = _Actor(handle, self._next_index, info=info)
        self._next_index += 1
        self.stats["actors_started"] += 1
        return actor

    async def _shutdown(self) -> None:
        for task in list(self._background):
            task.cancel()
        for _, pending in self._queue:
            if not pending.future.done():
                pending.future.set_exception(SandboxError("RaySandbox is closed"))
        self._queue.clear()
        actors, self._actors = self._actors, []
        self._sessions.clear()

        async def stop(actor: _Actor) -> None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_await(actor.handle.shutdown.remote()), 5.0)
            with contextlib.suppress(Exception):
                self._ray.kill(actor.handle)

        await asyncio.gather(*(stop(actor) for actor in actors if not actor.dead), return_exceptions=True)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _mark_dead(self, actor: _Actor, why: str) -> None:
        if actor.dead:
            return
        logger.warning("Ray sandbox actor %d died (%s); replacing it", actor.index, why)
        actor.dead = True
        with contextlib.suppress(ValueError):
            self._actors.remove(actor)
        self.stats["actors_replaced"] += 1
        self._spawn(self._replace())

    async def _replace(self) -> None:
        for attempt in range(5):
            try:
                actor = await self._new_actor()
            except Exception as exc:
                logger.warning("could not start a replacement Ray sandbox actor (%s); attempt %d", exc, attempt + 1)
                await asyncio.sleep(min(30.0, 2.0**attempt))
                continue
            if self._closed:
                with contextlib.suppress(Exception):
                    self._ray.kill(actor.handle)
                return
            self._actors.append(actor)
            return

    async def _any_actor(self) -> _Actor:
        """The least-loaded live actor; waits (bounded) while every actor is being replaced."""
        deadline = time.monotonic() + self.start_timeout_s
        while True:
            live = [actor for actor in self._actors if not actor.dead]
            if live:  # fewest calls in flight, then fewest sessions held (spreads sessions opened one by one)
                return min(live, key=lambda actor: (actor.load, actor.sessions))
            if time.monotonic() > deadline:
                raise SandboxError("no Ray sandbox actor is alive, and none could be started")
            await asyncio.sleep(0.1)

    # ------------------------------------------------------------------------------------------- calls

    async def _execute(self, code: str, stdin: str, session: str | None, timeout_s: float) -> ExecResult:
        call = {"code": code, "stdin": stdin, "session": session, "timeout_s": timeout_s}
        if session is None:
            return await self._submit(await self._any_actor(), call, timeout_s)
        state = self._sessions.get(session)
        if state is None:
            state = self._sessions[session] = _Session(asyncio.Lock())
        async with state.lock:  # a session's calls go one at a time, in order, to the actor that holds it
            start = time.monotonic()
            if state.actor is not None and state.actor.dead:
                self._unpin(state)
                return ExecResult(
                    "",
                    "",
                    "crash",
                    "the Ray actor that held this session died; its state is lost",
                    time.monotonic() - start,
                    system_failure=True,  # the actor hosts a sandboxed pool: the model's code cannot end it
                )
            if state.actor is None:
                state.actor = await self._any_actor()
                state.actor.sessions += 1
            result = await self._submit(state.actor, call, timeout_s)
            if state.actor.dead:  # this call reported the death: the next one starts over on another actor
                self._unpin(state)
            return result

    @staticmethod
    def _unpin(state: _Session) -> None:
        if state.actor is not None:
            state.actor.sessions -= 1
            state.actor = None

    async def _close_session(self, session: str) -> None:
        state = self._sessions.pop(session, None)
        if state is None:
            return
        async with state.lock:
            actor = state.actor
            self._unpin(state)
            if actor is not None and not actor.dead:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(_await(actor.handle.close_sessions.remote([session])), self.call_grace_s)

    async def _submit(self, actor: _Actor, call: dict[str, Any], timeout_s: float) -> ExecResult:
        """Queue a call for ``actor``; calls queued in the same loop tick leave together."""
        pending = _Pending(call, asyncio.get_running_loop().create_future(), timeout_s + self.call_grace_s)
        actor.load += 1
        self._queue.append((actor, pending))
        if len(self._queue) >= self.batch_size * max(1, len(self._actors)):
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(self.batch_window_s, self._flush)
        try:
            return await asyncio.shield(pending.future)
        finally:
            actor.load -= 1

    def _flush(self) -> None:
        self._flush_scheduled = False  # a timer still pending finds an empty queue: harmless
        queue, self._queue = self._queue, []
        if not queue:
            return
        by_actor: dict[_Actor, list[_Pending]] = {}
        for actor, pending in queue:
            by_actor.setdefault(actor, []).append(pending)
        for actor, items in by_actor.items():
            for offset in range(0, len(items), self.batch_size):
                self._spawn(self._dispatch(actor, items[offset : offset + self.batch_size]))

    async def _dispatch(self, actor: _Actor, items: list[_Pending]) -> None:
        """Send one batch and settle every call's future, whatever happens."""
        ray = self._ray
        start = time.monotonic()
        self.stats["dispatches"] += 1
        self.stats["calls"] += len(items)
        why = "no answer"
        try:
            if actor.dead:
                raise ray.exceptions.RayActorError()
            stream = actor.handle.run.options(num_returns="streaming").remote([item.call for item in items])
            deadline = max(item.deadline_s for item in items)
            async with asyncio.timeout(deadline):
                async for ref in stream:
                    index, result = await ref
                    future = items[index].future
                    if not future.done():
                        future.set_result(ExecResult(**result))
            return
        except ray.exceptions.RayActorError as exc:
            why = f"the Ray actor running this call died ({type(exc).__name__})"
            self._mark_dead(actor, type(exc).__name__)
        except TimeoutError:
            why = f"no answer from the Ray actor in {time.monotonic() - start:.0f} s"
        except Exception as exc:
            why = f"the Ray dispatch failed: {type(exc).__name__}: {exc}"
        finally:
            for item in items:
                if not item.future.done():
                    item.future.set_result(
                        ExecResult("", "", "crash", why, time.monotonic() - start, system_failure=True)
                    )


def _init_ray(ray: Any, options: dict[str, Any]) -> None:
    """``ray.init`` on a thread that lives as long as the process.

    A local Ray instance's processes (GCS, raylet) get a parent-death signal, and Linux sends it when the
    *thread* that started them exits: started from a sandbox's private loop or from an executor thread, Ray
    would die with that thread (when the sandbox closes). So the driver is started from a daemon thread that
    never ends.
    """
    done = threading.Event()
    failure: list[BaseException] = []

    def driver() -> None:
        try:
            if not ray.is_initialized():
                ray.init(**options)
        except BaseException as exc:
            failure.append(exc)
        finally:
            done.set()
        threading.Event().wait()  # keep this thread, and so the Ray processes it started, alive

    threading.Thread(target=driver, name="rstar-ray-driver", daemon=True).start()
    done.wait()
    if failure:
        raise failure[0]


async def _await(ref: Any) -> Any:
    """Await an ObjectRef on whichever loop runs this (refs are awaitable on any loop)."""
    return await ref
