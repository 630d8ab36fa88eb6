"""The process runtime (``rstar_env.runtime``): one owner of the background loop, the plugin threads, the loop
watchdog and the shared sandboxes, with rstar-env's one fork hook; and a watchdog that warns only about what a user
can act on (a plugin that blocks the loop, named once)."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, ClassVar

import pytest

import rstar_env
from rstar_env import aio, watchdog
from rstar_env.plugin import EpisodeContext, ToolResult, function_schema, register, unregister
from rstar_env.runtime import runtime
from rstar_env.testing import answer, make_env, play, tool_call

from .._forked import in_forked_child


def _fork_hooks(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "register_at_fork":
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


def test_rstar_env_and_its_plugins_have_one_fork_hook_the_runtimes_besides_the_sandbox_workers() -> None:
    import rstar_plugins

    hooks = _fork_hooks(Path(rstar_env.__file__).parent) + _fork_hooks(Path(rstar_plugins.__file__).parent)
    # The other hook is not the library's: the sandbox worker, a separate program that loads its modules without
    # rstar_env (so without the runtime), blocks its PID-1 signal handlers around a fork of user code.
    files = sorted(hook.rsplit(":", 1)[0] for hook in hooks)
    assert files == ["rstar_env/runtime/__init__.py", "rstar_env/sandbox/_pidns.py"], hooks
    assert _fork_hooks(Path(__file__).parent) == []  # the finder sees nothing where there is nothing


_LOAD_WITHOUT_RSTAR_ENV = """\
import importlib, importlib.abc, json, sys, types

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "rstar_env":
            raise ImportError(f"rstar_env is not importable here ({name})")

sys.meta_path.insert(0, Refuse())
directory, modules = sys.argv[1], sys.argv[2:]
pkg = types.ModuleType("_rstar_sandbox"); pkg.__path__ = [directory]; sys.modules["_rstar_sandbox"] = pkg
loaded = [importlib.import_module("_rstar_sandbox." + m).__name__ for m in modules]
print(json.dumps({"loaded": loaded, "rstar_env": sorted(m for m in sys.modules if m.split(".")[0] == "rstar_env")}))
"""


def test_the_sandbox_modules_load_without_rstar_env() -> None:
    """The zygote and its workers (the fork hook in ``_pidns`` among them) load the sandbox modules as a package of
    their own, with no ``rstar_env``: loaded that way with ``rstar_env`` unimportable, every one of them imports."""
    from rstar_env.sandbox._spawn import PACKAGE_DIR, SANDBOX_MODULES

    command = [sys.executable, "-I", "-c", _LOAD_WITHOUT_RSTAR_ENV, PACKAGE_DIR, *SANDBOX_MODULES]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert "_pidns" in SANDBOX_MODULES
    assert json.loads(done.stdout) == {"loaded": [f"_rstar_sandbox.{m}" for m in SANDBOX_MODULES], "rstar_env": []}


class _Probe:
    def __init__(self) -> None:
        self.forked = False

    def after_fork(self) -> None:
        self.forked = True


def test_a_forked_child_starts_its_own_runtime_and_calls_the_fork_callbacks() -> None:
    rt = runtime()
    parent_loop, parent_threads = rt.loop(), rt.plugin_threads()
    assert aio.run_sync(asyncio.sleep(0, "up")) == "up"  # the parent's loop thread runs when it forks
    kept, dropped = _Probe(), _Probe()
    rt.on_fork(kept.after_fork)
    rt.on_fork(dropped.after_fork)
    del dropped  # held weakly: a dead object's callback is not called

    def child() -> dict[str, Any]:
        return {
            "run_sync": aio.run_sync(asyncio.sleep(0, "child")),  # a copied loop would hang here
            "new_loop": rt.loop() is not parent_loop,
            "new_threads": rt.plugin_threads() is not parent_threads,
            "callback": kept.forked,
            "same_runtime": runtime() is rt,
        }

    assert in_forked_child(child) == {
        "run_sync": "child",
        "new_loop": True,
        "new_threads": True,
        "callback": True,
        "same_runtime": True,
    }
    assert not kept.forked and rt.loop() is parent_loop  # the parent is untouched


def test_a_private_loop_refuses_in_a_forked_child_and_goes_on_in_the_parent() -> None:
    private = runtime().private_loop("rstar-test-private")
    try:
        assert private.submit(asyncio.sleep(0, 1)).result(timeout=10) == 1

        def child() -> str:
            try:
                private.loop()
            except RuntimeError as exc:
                return str(exc)
            return "no error"

        refusal = in_forked_child(child)
        assert "not in this forked child" in refusal and "rstar-test-private" in refusal, refusal
        assert private.submit(asyncio.sleep(0, 2)).result(timeout=10) == 2
    finally:
        private.stop()
    with pytest.raises(RuntimeError, match="stopped"):
        private.submit(asyncio.sleep(0))


class _FakeSandbox:
    def __init__(self) -> None:
        self.closed = 0

    async def aclose(self) -> None:
        self.closed += 1


def test_shared_sandboxes_are_counted_and_the_last_release_closes() -> None:
    shared = runtime().sandboxes
    made: list[_FakeSandbox] = []

    def create() -> _FakeSandbox:
        made.append(_FakeSandbox())
        return made[-1]

    first, second = shared.acquire("k", create), shared.acquire("k", create)
    assert first is second and len(made) == 1 and shared.held() == {"k": 2}
    aio.run_sync(shared.release("k"))
    assert first.closed == 0 and shared.held() == {"k": 1}
    aio.run_sync(shared.release("k"))
    assert first.closed == 1 and shared.held() == {}
    aio.run_sync(shared.release("k"))  # unknown now: a no-op
    assert shared.acquire("k", create) is not first  # a new one after the last release
    assert shared.close_all() == {"k": 1} and made[-1].closed == 1 and shared.held() == {}


async def _current_thread() -> threading.Thread:
    return threading.current_thread()


def test_reset_closes_what_the_runtime_holds_and_the_next_use_starts_afresh() -> None:
    rt = runtime()
    box = rt.sandboxes.acquire("reset-test", _FakeSandbox)
    loop, threads = rt.loop(), rt.plugin_threads()
    loop_thread = aio.run_sync(_current_thread())
    rt.reset()
    assert box.closed == 1 and rt.sandboxes.held() == {}
    loop_thread.join(timeout=10)
    assert not loop_thread.is_alive() and loop.is_closed()  # the old loop stopped and closed
    assert aio.run_sync(asyncio.sleep(0, "again")) == "again"
    assert rt.loop() is not loop and rt.plugin_threads() is not threads


def test_reset_refuses_to_run_on_the_background_loop() -> None:
    async def from_the_loop() -> None:
        runtime().reset()

    with pytest.raises(RuntimeError, match="cannot run on it"):
        aio.run_sync(from_the_loop())
    assert aio.run_sync(asyncio.sleep(0, 1)) == 1  # and it left the loop running


class StallMaker:
    """What a plugin must not do: block the event loop inside async def."""

    name: ClassVar[str] = "stall_maker"
    schema: ClassVar[dict[str, Any]] = function_schema("stall_maker", "blocks", {}, [])

    async def call(self, arguments: dict[str, Any], episode: EpisodeContext) -> ToolResult:
        time.sleep(0.6)
        return ToolResult("done")


@pytest.fixture
def quick_watchdog():
    """A watchdog with a 0.2 s threshold and no memory of earlier stalls."""
    runtime().watchdog.reset()
    watchdog.configure(0.2)
    yield
    watchdog.configure(2.0)
    runtime().watchdog.reset()


def _records(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "rstar_env.watchdog" and r.levelno == level]


def test_a_plugin_that_blocks_the_loop_is_named_in_one_warning(quick_watchdog, echo_plugins, caplog) -> None:
    register(StallMaker)
    env = make_env(tools=["stall_maker"], reward="exact_test")
    try:
        with caplog.at_level(logging.DEBUG, logger="rstar_env.watchdog"):
            play(env, [tool_call("stall_maker"), tool_call("stall_maker"), answer(42)], problem="6*7?", answer="42")
            time.sleep(0.3)  # the loop beats again: the second stall's total is recorded
    finally:
        env.close()
        unregister(StallMaker)
    warnings = _records(caplog, logging.WARNING)
    assert len(warnings) == 1, warnings
    assert "the tool 'stall_maker' plugin blocks the rstar-env event loop" in warnings[0]
    assert "asyncio.to_thread" in warnings[0]  # what to do about it
    stalls = [i for i in watchdog.incidents() if i.plugin == "tool 'stall_maker'" and i.ongoing]
    assert len(stalls) == 2 and all(i.task == "tool 'stall_maker' call" for i in stalls), watchdog.incidents()
    assert any("again" in m for m in _records(caplog, logging.DEBUG))  # the second one: debug only


def test_a_stall_no_plugin_call_holds_is_not_a_warning(quick_watchdog, caplog) -> None:
    async def watch_the_background_loop() -> None:
        watchdog.watch()

    async def someone_elses_task() -> None:
        time.sleep(0.6)

    loop = runtime().loop()
    with caplog.at_level(logging.DEBUG, logger="rstar_env.watchdog"):
        aio.run_sync(watch_the_background_loop())
        loop.call_soon_threadsafe(time.sleep, 0.6)  # code outside any task (what load or GC looks like)
        time.sleep(0.9)
        aio.run_sync(someone_elses_task())  # a task, but not a plugin call
        time.sleep(0.3)
    assert _records(caplog, logging.WARNING) == []
    stalls = [i for i in watchdog.incidents() if i.ongoing]
    assert {i.task for i in stalls} >= {"code outside any task"} and len(stalls) >= 2, stalls
    assert all(i.plugin is None for i in stalls), stalls
    assert any("not a plugin call" in m for m in _records(caplog, logging.DEBUG))
