"""The env server's session routes, ``/ws`` and ``/mcp``, speaking OpenEnv's wire protocol on the server's one
session table (:class:`~rstar_env.serve.sessions.Sessions`).

OpenEnv's ``HTTPEnvServer`` keeps its own session table, which counts only its own routes, times only some of
them and is reached only through private members. These routes take its place (they are registered first, so they
answer ``/ws`` and ``/mcp``); OpenEnv's stateless routes (``/health``, ``/schema``, ``/metadata``) stay its own.

``/ws`` messages are ``{"type": "reset" | "step" | "state" | "close", "data": ...}``; replies are OpenEnv's
``{"type": "observation" | "state" | "error", "data": ...}``. A message that cannot be used (not JSON, nested too
deep, not an object, an invalid action, a failing reset) gets an ``error`` reply naming the cause, and the session
goes on. ``/mcp`` answers OpenEnv's JSON-RPC session methods (``openenv/session/create`` / ``close``): such a
session holds a slot under the same cap and limits, and belongs to the client that created it; this env has no
MCP tools, so ``tools/list`` and ``tools/call`` are answered with an error that says how to drive episodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from rstar_env.serve.guard import client_of
from rstar_env.serve.sessions import CapacityError, Session, Sessions

MAX_DEPTH = 64
"""Deepest nesting of a message's JSON: deeper is refused before it is parsed (the parser would recurse)."""


def _error(message: str, code: str, **extra: Any) -> str:
    return json.dumps({"type": "error", "data": {"message": message, "code": code, **extra}}, default=str)


def too_deep(raw: str, limit: int = MAX_DEPTH) -> bool:
    """Whether ``raw``'s brackets nest deeper than ``limit`` (a scan: strings may contain brackets, which only
    over-count, and a real message nests a few levels)."""
    depth = 0
    for char in raw:
        if char in "[{":
            depth += 1
            if depth > limit:
                return True
        elif char in "]}":
            depth -= 1
    return False


def parse(raw: str | bytes | None) -> tuple[dict[str, Any] | None, str | None]:
    """A ``/ws`` message as a dict, or ``None`` and the error reply to send."""
    if raw is None:
        return None, _error("an empty message: send a JSON object", "INVALID_JSON")
    if isinstance(raw, bytes):
        try:
            raw = raw.decode()
        except UnicodeDecodeError:
            return None, _error("a binary message that is not UTF-8: send JSON text", "INVALID_JSON")
    if too_deep(raw):
        return None, _error(f"the message nests deeper than {MAX_DEPTH} levels", "INVALID_JSON")
    try:
        message = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as exc:
        return None, _error(f"Invalid JSON: {exc}", "INVALID_JSON")
    if not isinstance(message, dict):
        return None, _error(
            f'a message is a JSON object {{"type": ..., "data": ...}}, got a JSON {type(message).__name__}',
            "VALIDATION_ERROR",
        )
    return message, None


async def handle(env: Any, message: dict[str, Any], action_cls: Any) -> tuple[str | None, bool]:
    """The reply to one parsed ``/ws`` message, and whether the session ends (a ``close``)."""
    kind, data = message.get("type", ""), message.get("data", {})
    if kind == "close":
        return None, True
    if kind not in ("reset", "step", "state", "mcp"):
        return _error(f"Unknown message type: {kind}", "UNKNOWN_TYPE"), False
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return _error(f"'data' is a JSON object, got a JSON {type(data).__name__}", "VALIDATION_ERROR"), False
    try:
        if kind == "state":
            return json.dumps({"type": "state", "data": env.state.model_dump()}, default=str), False
        if kind == "mcp":
            return json.dumps({"type": "mcp", "data": _no_mcp(data.get("id"))}), False
        if kind == "reset":
            observation = await env.reset_async(**data)
        else:
            try:
                action = action_cls.model_validate(data)
            except ValidationError as exc:
                errors = exc.errors(include_url=False, include_context=False, include_input=False)
                return _error("Invalid message", "VALIDATION_ERROR", errors=errors), False
            observation = await env.step_async(action)
    except (ValueError, TypeError, RuntimeError, KeyError) as exc:  # what a reset or step refuses: say so, go on
        return _error(str(exc) or type(exc).__name__, "EXECUTION_ERROR"), False
    return json.dumps({"type": "observation", "data": response(observation)}, default=str), False


def response(observation: Any) -> dict[str, Any]:
    """An observation as OpenEnv's clients read it: ``{"observation", "reward", "done"}``."""
    return {
        "observation": observation.model_dump(exclude={"reward", "done", "metadata"}),
        "reward": observation.reward,
        "done": observation.done,
    }


def _rpc_error(request_id: Any, code: int, message: str, **data: Any) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def _no_mcp(request_id: Any) -> dict[str, Any]:
    return _rpc_error(
        request_id, -32601, "this env has no MCP tools: run episodes over /ws (reset, step) or HTTP /reset and /step"
    )


def add_session_routes(
    app: FastAPI, sessions: Sessions, factory: Callable[[], Any], action_cls: Any, close_env: Callable[[Any], Any]
) -> None:
    """Mount ``/ws`` and ``/mcp`` (HTTP and WebSocket) on ``app``; see the module docstring."""

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            session = sessions.open("ws", client_of(websocket.scope), reaped=False)  # timed by the Guard
        except CapacityError as exc:
            await websocket.send_text(
                _error(str(exc), "CAPACITY_REACHED", active_sessions=exc.open_now, max_sessions=exc.max_sessions)
            )
            await websocket.close()
            return
        try:
            env = await asyncio.to_thread(factory)
            bind = getattr(env, "bind_client", None)
            if bind is not None:  # its tool calls queue under this client in the sandbox
                bind(session.owner)
            session.obj, session.close = env, lambda: close_env(env)
            while True:
                received = await websocket.receive()
                if received["type"] == "websocket.disconnect":
                    break
                text = received.get("text")
                message, refused = parse(text if text is not None else received.get("bytes"))
                if message is None:
                    await websocket.send_text(refused or "")
                    continue
                with sessions.using(session):
                    try:
                        reply, stop = await handle(env, message, action_cls)
                    except Exception as exc:  # a fault of ours: the client hears it and the session goes on
                        reply, stop = _error(f"{type(exc).__name__}: {exc}", "EXECUTION_ERROR"), False
                if stop:
                    break
                await websocket.send_text(reply or "")
        except WebSocketDisconnect:
            pass
        finally:
            await sessions.end(session)
            with contextlib.suppress(Exception):  # already closed by the client or the Guard
                await websocket.close()

    async def rpc(body: Any, owner: str, websocket_session: Session | None = None) -> dict[str, Any]:
        request_id = body.get("id") if isinstance(body, dict) else None

        def error(code: int, message: str, **data: Any) -> dict[str, Any]:
            return _rpc_error(request_id, code, message, **data)

        if not isinstance(body, dict) or not isinstance(body.get("method"), str):
            return error(-32600, 'a JSON-RPC request is an object with a "method"')
        params = body.get("params") or {}
        if not isinstance(params, dict):
            return error(-32602, "params must be an object")
        method = body["method"]
        if method == "openenv/session/create":
            if websocket_session is not None:
                return {"jsonrpc": "2.0", "id": request_id, "result": {"session_id": websocket_session.id}}
            try:
                session = sessions.open("mcp", owner)
            except CapacityError as exc:
                return error(-32000, str(exc), active_sessions=exc.open_now, max_sessions=exc.max_sessions)
            return {"jsonrpc": "2.0", "id": request_id, "result": {"session_id": session.id}}
        target = params.get("session_id")
        found = sessions.get(target, owner, "mcp") if isinstance(target, str) else None
        if method == "openenv/session/close":
            if found is None:
                return error(-32602, f"Unknown session_id: {target}")
            await sessions.end(found)
            return {"jsonrpc": "2.0", "id": request_id, "result": {"session_id": target, "closed": True}}
        if target is not None and found is None:
            return error(-32602, f"Unknown session_id: {target}")
        if found is not None:
            with sessions.using(found):
                pass  # a request on it counts as activity
        if method in ("tools/list", "tools/call"):
            return _no_mcp(request_id)
        return error(-32601, f"Method not found: {method}")

    @app.post("/mcp")
    async def mcp(request: Request) -> dict[str, Any]:
        raw = await request.body()
        text = raw.decode(errors="replace")
        if too_deep(text):
            return _rpc_error(None, -32700, f"the request nests deeper than {MAX_DEPTH} levels")
        try:
            body = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            return _rpc_error(None, -32700, "Parse error")
        return await rpc(body, client_of(request.scope))

    @app.websocket("/mcp")
    async def mcp_ws(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            session = sessions.open("mcp", client_of(websocket.scope), reaped=False)  # timed by the Guard
        except CapacityError as exc:
            await websocket.send_text(json.dumps(_rpc_error(None, -32000, str(exc))))
            await websocket.close()
            return
        try:
            while True:
                received = await websocket.receive()
                if received["type"] == "websocket.disconnect":
                    break
                raw = received.get("text")
                if raw is None:
                    raw = (received.get("bytes") or b"").decode(errors="replace")
                if raw is None or too_deep(raw):
                    reply: dict[str, Any] = _rpc_error(None, -32700, "Parse error")
                else:
                    try:
                        reply = await rpc(json.loads(raw), session.owner, session)
                    except (json.JSONDecodeError, RecursionError):
                        reply = _rpc_error(None, -32700, "Parse error")
                with sessions.using(session):
                    await websocket.send_text(json.dumps(reply, default=str))
        except WebSocketDisconnect:
            pass
        finally:
            await sessions.end(session)
            with contextlib.suppress(Exception):
                await websocket.close()


__all__ = ["MAX_DEPTH", "add_session_routes", "handle", "parse", "response", "too_deep"]
