"""Hostile code against the ``local`` sandbox: whatever the code does, the call returns within its timeout
(plus slack) with the right status, nothing it started survives, and the next call works."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rstar_env.sandbox import ExecResult, SandboxError
from rstar_env.sandbox.local import LocalSandbox

TIMEOUT_S = 1.0
SLACK_S = 1.0
SECRET_NAME, SECRET_VALUE = "RSTAR_TEST_FAKE_SECRET", "hunter2-" + uuid.uuid4().hex


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[LocalSandbox]:
    os.environ[SECRET_NAME] = SECRET_VALUE  # must not reach sandboxed code
    # RSTAR_TEST_SANDBOX_ISOLATION=unshare|none runs the suite against a weaker isolation layer.
    isolation = os.environ.get("RSTAR_TEST_SANDBOX_ISOLATION", "auto")
    box = LocalSandbox(
        timeout_s=TIMEOUT_S, max_concurrency=2, spares=2, memory_mb=1024, max_processes=32, isolation=isolation
    )
    try:
        box.start()
    except SandboxError as exc:
        pytest.skip(f"local sandbox unavailable: {exc}")
    yield box
    box.close()
    os.environ.pop(SECRET_NAME, None)


def execute(box: LocalSandbox, code: str, **kwargs: Any) -> ExecResult:
    result = run(box.execute(code, **kwargs))
    assert result.duration_s < kwargs.get("timeout_s", TIMEOUT_S) + SLACK_S, result
    return result


def assert_healthy(box: LocalSandbox) -> None:
    result = execute(box, "print(6 * 7)")
    assert (result.status, result.stdout) == ("ok", "42\n"), result


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains ``marker`` (the daemons below exec a marked ``sleep``)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != b"Z":
            found.append(int(name))
    return found


def is_running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def marker() -> str:
    return f"{time.time_ns() % 10**9}.{uuid.uuid4().int % 10**6}"  # a valid, unique `sleep` argument


# Double fork + setsid: the classic daemon, re-parented away from the worker and out of its process group.
DAEMON = """
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execvp("sleep", ["sleep", "{marker}"])
    os._exit(0)
os.wait()
"""


# --------------------------------------------------------------------------------------------------- runaway code


@pytest.mark.parametrize(
    "code",
    [
        "while True:\n    pass",
        "import time\ntime.sleep(100)",
        "x = 10 ** 10 ** 8",
        "import threading, time\nfor _ in range(4):\n    threading.Thread(target=lambda: time.sleep(100)).start()",
    ],
    ids=["python-loop", "sleep-in-c", "bigint-in-c", "non-daemon-threads"],
)
def test_runaway_code_times_out(sandbox: LocalSandbox, code: str) -> None:
    result = execute(sandbox, code)
    expected = "ok" if "threading" in code else "timeout"  # the main thread ends; its threads die with the worker
    assert result.status == expected, result
    assert_healthy(sandbox)


def test_memory_bomb(sandbox: LocalSandbox) -> None:
    at_once = execute(sandbox, "x = bytearray(50 * 2**30)")
    assert (at_once.status, at_once.error) == ("error", "MemoryError")
    gradual = execute(sandbox, "chunks = []\nwhile True:\n    chunks.append(bytearray(200 * 2**20))")
    # MemoryError at the address-space limit, unless a slow (shared) machine is still faulting pages in.
    assert gradual.status in ("error", "crashed", "timeout"), gradual
    if gradual.status == "error":
        assert gradual.error == "MemoryError"
    assert_healthy(sandbox)


def test_fork_bomb_is_bounded_and_cleaned_up(sandbox: LocalSandbox) -> None:
    before = len(sandbox.pool.processes())
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = execute(sandbox, code)
    assert result.status in ("timeout", "crashed"), result
    assert_healthy(sandbox)
    deadline = time.monotonic() + 5
    while len(sandbox.pool.processes()) > before + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(sandbox.pool.processes()) <= before + 1  # the zygote may be mid-way through a spare


def test_nproc_limit_applies(sandbox: LocalSandbox) -> None:
    if not sandbox.info.get("private_uids") and os.geteuid() == 0:
        pytest.skip("running as root without private uids: the kernel does not apply RLIMIT_NPROC to root")
    code = (
        "import os, time\npids = []\ntry:\n    for _ in range(200):\n        pid = os.fork()\n"
        "        if pid == 0:\n            time.sleep(30)\n            os._exit(0)\n        pids.append(pid)\n"
        "except OSError as exc:\n    print('refused after', len(pids), type(exc).__name__)"
    )
    result = execute(sandbox, code)
    assert result.status == "ok" and result.stdout.startswith("refused after"), result
    assert int(result.stdout.split()[2]) < 32


@pytest.mark.parametrize(
    "ending",
    ["", "while True:\n    pass", "import ctypes\nctypes.string_at(0)"],
    ids=["call-returns", "call-times-out", "worker-segfaults"],
)
def test_daemons_do_not_outlive_the_call(sandbox: LocalSandbox, ending: str) -> None:
    tag = marker()
    result = execute(sandbox, DAEMON.format(marker=tag) + ending)
    assert result.status == {"": "ok", "w": "timeout", "i": "crashed"}[ending[:1]], result
    assert processes_with(tag) == []
    assert_healthy(sandbox)


def test_daemons_do_not_outlive_a_session_call(sandbox: LocalSandbox) -> None:
    tag = marker()
    started = execute(sandbox, DAEMON.format(marker=tag) + "\nkept = 1", session="daemon")
    assert started.ok, started
    assert processes_with(tag) == []
    assert execute(sandbox, "print(kept)", session="daemon").stdout == "1\n"  # the session itself lives on
    run(sandbox.close_session("daemon"))


def test_subprocess_survivors_in_a_plain_process_group_are_killed(sandbox: LocalSandbox) -> None:
    tag = marker()
    code = f"import subprocess\nsubprocess.Popen(['sleep', '{tag}'])\nprint('left running')"
    assert execute(sandbox, code).stdout == "left running\n"
    assert processes_with(tag) == []


# ----------------------------------------------------------------------------------------------- signals and crashes


IGNORE_SIGNALS_AND_SPIN = """
import signal
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
while True:
    pass
"""
CLOSE_EVERY_FD = """
import os
for fd in range(3, 256):
    try:
        os.close(fd)
    except OSError:
        pass
"""


@pytest.mark.parametrize(
    ("code", "status"),
    [
        (IGNORE_SIGNALS_AND_SPIN, "timeout"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGSTOP)", "timeout"),
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "crashed"),
        ("import ctypes\nctypes.string_at(0)", "crashed"),
        ("import os\nos.killpg(0, 9)", "crashed"),
        ("import os\nos._exit(3)", "crashed"),
        (CLOSE_EVERY_FD, "ok"),
    ],
    ids=["ignores-term", "stops-itself", "kills-itself", "segfault", "kills-its-group", "hard-exit", "closes-fds"],
)
def test_signal_games_and_crashes(sandbox: LocalSandbox, code: str, status: str) -> None:
    result = execute(sandbox, code)
    assert result.status == status, result
    assert_healthy(sandbox)


def test_forged_result_on_the_channel_is_not_trusted(sandbox: LocalSandbox) -> None:
    code = (
        "import json, os, socket, struct\n"
        "body = json.dumps({'op': 'result', 'token': 'guess', 'status': 'ok', 'error': None}).encode()\n"
        "for fd in range(3, 64):\n    try:\n        s = socket.socket(fileno=os.dup(fd))\n"
        "        s.send(struct.pack('>I', len(body)) + body)\n    except OSError:\n        pass\n"
        "raise RuntimeError('real outcome')"
    )
    result = execute(sandbox, code)
    assert result.status in ("error", "crashed") and result.status != "ok", result
    assert_healthy(sandbox)


def test_killing_the_parent_zygote_from_inside(sandbox: LocalSandbox) -> None:
    result = execute(sandbox, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('still here')")
    assert result.status in ("ok", "error", "crashed"), result  # refused (EPERM, PID 1) or the pool dies
    assert_healthy(sandbox)


def test_pool_heals_after_the_zygote_is_killed(sandbox: LocalSandbox) -> None:
    assert execute(sandbox, "state = 1", session="doomed").ok
    zygote = sandbox.pool.zygote_pid()
    assert zygote is not None
    os.kill(zygote, 9)
    deadline = time.monotonic() + 5
    while is_running(zygote) and time.monotonic() < deadline:
        time.sleep(0.01)  # the kill is asynchronous; its workers die with it
    lost = execute(sandbox, "print(state)", session="doomed")
    assert lost.status == "crashed", lost
    assert_healthy(sandbox)
    fresh = execute(sandbox, "state = 2\nprint(state)", session="doomed")
    assert (fresh.status, fresh.stdout) == ("ok", "2\n")
    run(sandbox.close_session("doomed"))
    assert sandbox.pool.restarts >= 1


# --------------------------------------------------------------------------------------------------- escapes


def test_network_is_unreachable(sandbox: LocalSandbox) -> None:
    if sandbox.isolation is None or sandbox.isolation.network:
        pytest.skip("no network namespace on this machine")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        code = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=0.5)\nprint('connected')"
        result = execute(sandbox, code)
    assert result.status == "error" and "connected" not in result.stdout, result
    assert result.error is not None and result.error.split(":")[0] in (
        "ConnectionRefusedError",
        "OSError",
        "TimeoutError",
        "socket.gaierror",
    )


def test_writes_outside_the_working_directory_fail(sandbox: LocalSandbox, tmp_path: Path) -> None:
    readonly = sandbox.isolation is not None and sandbox.isolation.readonly_root
    if not readonly and not sandbox.info.get("private_uids"):
        pytest.skip("neither a read-only root (bubblewrap) nor a private uid: the code may write as the user")
    for target in [Path(__file__).parent / f"escape-{uuid.uuid4().hex}", tmp_path / "escape"]:
        result = execute(sandbox, f"open({str(target)!r}, 'w').write('owned')")
        assert result.status == "error" and not target.exists(), (target, result)
        # Not there at all (outside the allowlist) or not writable.
        assert result.error is not None and result.error.split(":")[0] in (
            "PermissionError",
            "OSError",
            "FileNotFoundError",
        )
    # /tmp is writable, but it is the worker's own: nothing reaches the host's.
    host_tmp = Path("/tmp") / f"rstar-escape-{uuid.uuid4().hex}"
    execute(sandbox, f"open({str(host_tmp)!r}, 'w').write('owned')")
    assert not host_tmp.exists()
    inside = execute(sandbox, "import os\nopen('mine.txt', 'w').write('ok')\nprint(sorted(os.listdir('.')))")
    assert (inside.status, inside.stdout) == ("ok", "['mine.txt']\n")


def test_working_directory_is_private_and_removed(sandbox: LocalSandbox) -> None:
    first = execute(sandbox, "import os\nopen('left.txt', 'w').write('x')\nprint(os.getcwd())")
    second = execute(sandbox, "import os\nprint(os.getcwd(), os.listdir('.'))")
    where = first.stdout.strip()
    assert first.ok and second.ok and where not in second.stdout and "left.txt" not in second.stdout
    time.sleep(0.2)
    assert not Path(where).exists()


def test_files_left_in_shared_memory_are_removed(sandbox: LocalSandbox) -> None:
    if not sandbox.info.get("private_uids"):
        pytest.skip("without a private uid per worker, leftovers cannot be attributed to a worker")
    name = f"/dev/shm/rstar-test-{uuid.uuid4().hex}"
    assert execute(sandbox, f"open({name!r}, 'w').write('left behind')").ok
    deadline = time.monotonic() + 3
    while (seen := execute(sandbox, f"import os\nprint(os.path.exists({name!r}))").stdout) != "False\n":
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)


def test_parent_environment_is_not_inherited(sandbox: LocalSandbox) -> None:
    code = f"""
import glob, os
seen = str(dict(os.environ))
for path in glob.glob("/proc/*/environ"):  # nor through the environment of any process it can see
    try:
        seen += open(path, "rb").read().decode("latin-1")
    except OSError:
        pass
print(len(seen), {SECRET_VALUE!r} in seen)
"""
    result = execute(sandbox, code)
    assert result.ok and result.stdout.endswith("False\n"), result
    assert SECRET_VALUE not in result.stdout


def test_huge_output_is_cut_quickly_with_bounded_memory(sandbox: LocalSandbox) -> None:
    result = execute(sandbox, "import sys\nwhile True:\n    sys.stdout.write('x' * 10**6)")
    assert result.status == "output_limit" and len(result.stdout) <= sandbox.max_output_bytes
    assert result.duration_s < 0.5
    flood_err = execute(sandbox, "import os\nwhile True:\n    os.write(2, b'e' * 65536)")
    assert flood_err.status == "output_limit" and len(flood_err.stderr) <= sandbox.max_output_bytes
    assert_healthy(sandbox)


def test_many_concurrent_calls_queue_instead_of_forking(sandbox: LocalSandbox) -> None:
    peak = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, len(sandbox.pool.processes()))
            time.sleep(0.002)

    async def flood() -> list[ExecResult]:
        return await asyncio.gather(*(sandbox.execute(f"print({i})") for i in range(300)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = run(flood())
    finally:
        done.set()
        watcher.join()
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(300)]
    # At most max_concurrency workers run; the rest are idle spares, the zygote, its wrapper, exiting workers.
    assert peak <= sandbox.pool.resting_size() + sandbox.max_concurrency + 2, peak


def test_no_process_leaks_after_the_suite(sandbox: LocalSandbox) -> None:
    assert_healthy(sandbox)
    deadline = time.monotonic() + 5
    expected = sandbox.pool.resting_size()  # wrapper, zygote, idle spares
    while len(sandbox.pool.processes()) > expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(sandbox.pool.processes()) <= expected, sandbox.pool.processes()
