"""Hostile code against the ``local`` sandbox: whatever the code does, the call returns within its timeout
(plus slack) with the right status, nothing it started survives, and the next call works."""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rstar_env.sandbox import ExecResult, SandboxError
from rstar_env.sandbox.local import LocalSandbox

from .._forked import in_forked_child

TIMEOUT_S = 1.0
SLACK_S = 20.0  # generous: catches a deadline that never fired, not a slow machine (statuses say which)
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
    start_or_skip(box)
    yield box
    box.close()
    os.environ.pop(SECRET_NAME, None)


def start_or_skip(box: LocalSandbox) -> None:
    """Start ``box``; a sandbox that cannot start fails the suite under CI, and skips it elsewhere, saying why."""
    try:
        box.start()
    except SandboxError as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true and the local sandbox cannot start: {exc}")
        pytest.skip(f"local sandbox unavailable on this machine (set CI=true to fail instead): {exc}")


def execute(box: LocalSandbox, code: str, **kwargs: Any) -> ExecResult:
    # A hang guard, not a time limit under test: a deadline that never fired runs into it.
    return run(asyncio.wait_for(box.execute(code, **kwargs), kwargs.get("timeout_s", TIMEOUT_S) + SLACK_S))


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
    assert (at_once.status, at_once.message) == ("exception", "MemoryError")
    gradual = execute(sandbox, "chunks = []\nwhile True:\n    chunks.append(bytearray(200 * 2**20))")
    # MemoryError at the address-space limit, unless a slow (shared) machine is still faulting pages in.
    assert gradual.status in ("exception", "crash", "timeout"), gradual
    if gradual.status == "exception":
        assert gradual.message == "MemoryError"
    assert_healthy(sandbox)


def test_fork_bomb_is_bounded_and_cleaned_up(sandbox: LocalSandbox) -> None:
    before = sandbox.pool.resting_size()  # wrapper, zygote, idle spares (perhaps not all forked yet)
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    result = execute(sandbox, code)
    assert result.status in ("timeout", "crash"), result
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
    assert result.status == {"": "ok", "w": "timeout", "i": "crash"}[ending[:1]], result
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
        ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", "crash"),
        ("import ctypes\nctypes.string_at(0)", "crash"),
        ("import os\nos.killpg(0, 9)", "crash"),
        ("import os\nos._exit(3)", "crash"),
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
    assert result.status in ("exception", "crash") and result.status != "ok", result
    assert_healthy(sandbox)


def test_killing_the_parent_zygote_from_inside(sandbox: LocalSandbox) -> None:
    result = execute(sandbox, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nprint('still here')")
    assert result.status in ("ok", "exception", "crash"), result  # refused (EPERM, PID 1) or the pool dies
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
    assert lost.status == "crash", lost
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
    assert result.status == "exception" and "connected" not in result.stdout, result
    assert result.message is not None and result.message.split(":")[0] in (
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
        assert result.status == "exception" and not target.exists(), (target, result)
        # Not there at all (outside the allowlist) or not writable.
        assert result.message is not None and result.message.split(":")[0] in (
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
    left = f"left-{uuid.uuid4().hex}.txt"
    first = execute(sandbox, f"import os\nopen({left!r}, 'w').write('x')\nprint(os.getcwd())")
    second = execute(sandbox, "import os\nprint(os.getcwd(), os.listdir('.'))")
    where = first.stdout.strip()
    assert first.ok and second.ok and where not in second.stdout and left not in second.stdout
    time.sleep(0.2)
    # The file is nowhere on the host: not at the path the code saw, nor anywhere in the pool's own folder.
    zygote = sandbox.pool._zygote
    assert zygote is not None
    assert not (Path(where) / left).exists()
    assert list(Path(zygote.base_dir).rglob(left)) == []


def test_files_left_in_shared_memory_are_removed(sandbox: LocalSandbox) -> None:
    if not sandbox.info.get("private_uids"):
        pytest.skip("without a private uid per worker, leftovers cannot be attributed to a worker")
    name = f"/dev/shm/rstar-test-{uuid.uuid4().hex}"
    assert execute(sandbox, f"open({name!r}, 'w').write('left behind')").ok
    deadline = time.monotonic() + 30  # only catches a leftover that is never removed, not a slow machine
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
    # Cut by the output limit, not by the timeout: the status says which (no clock needed).
    assert result.status == "output_limit" and len(result.stdout) <= sandbox.max_output_bytes
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
        return await asyncio.gather(*(sandbox.execute(f"print({i})") for i in range(150)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = run(flood())
    finally:
        done.set()
        watcher.join()
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(150)]
    # At most max_concurrency workers run; the rest are idle spares, the zygote, its wrapper, and workers being
    # torn down (killed once they replied; their namespaces go with them). On a loaded machine a dozen or two of
    # those can wait to be reaped at once (19 seen with three test processes on two cores); a fork per call would
    # show up to 150, three times the bound.
    assert peak <= sandbox.pool.resting_size() + sandbox.max_concurrency + 40, peak


def test_no_process_leaks_after_the_suite(sandbox: LocalSandbox) -> None:
    assert_healthy(sandbox)
    deadline = time.monotonic() + 5
    expected = sandbox.pool.resting_size()  # wrapper, zygote, idle spares
    while len(sandbox.pool.processes()) > expected and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(sandbox.pool.processes()) <= expected, sandbox.pool.processes()


# ------------------------------------------------------------------------------------- forged replies (issue 17.1)

# Everything user code can reach that might carry a reply: every socket it holds (a datagram and a framed
# message on each), and every object up the stack that looks like a channel or a token.
FORGE_REPLY = """
import json, os, socket, struct, sys
done = json.dumps({"op": "done", "status": "ok", "error": None}).encode()
result = {"op": "result", "status": "ok", "error": None}
frame = f = sys._getframe()
while f is not None:
    for value in list(f.f_locals.values()):
        if isinstance(value, dict) and "token" in value:
            result["token"] = value["token"]
    f = f.f_back
body = json.dumps(result).encode()
for fd in range(3, 256):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    try:
        # A well-formed message for each kind of socket: a datagram, or a length-prefixed frame on a stream.
        payload = done if s.type == socket.SOCK_SEQPACKET else struct.pack(">I", len(body)) + body
        s.send(payload, socket.MSG_DONTWAIT)
    except OSError:
        pass
    s.detach()
"""


def test_a_forged_reply_does_not_end_the_call_and_nothing_outlives_it(sandbox: LocalSandbox) -> None:
    tag = marker()
    result = execute(sandbox, FORGE_REPLY + f"os.execvp('sleep', ['sleep', '{tag}'])")
    # The call is not over when the code says so: it ends at its deadline (or as tampering), with no survivor.
    assert result.status in ("timeout", "crash"), result
    assert processes_with(tag) == []
    assert_healthy(sandbox)


def test_a_forged_reply_then_a_fork_chain_leaves_nothing_running(sandbox: LocalSandbox) -> None:
    chain = """
import time
if os.fork() == 0:
    while True:
        if os.fork():
            os._exit(0)  # the parent leaves; the child carries on with a fresh per-process CPU limit
        end = time.time() + 0.05
        while time.time() < end:
            pass
time.sleep(3600)
"""
    result = execute(sandbox, FORGE_REPLY + chain)
    assert result.status in ("timeout", "crash"), result
    assert pool_cpu_burned(sandbox, 0.5) < 0.25  # nothing of the call keeps a CPU busy after it
    assert_healthy(sandbox)


def pool_cpu_burned(box: LocalSandbox, seconds: float) -> float:
    """CPU seconds the pool's processes (its wrapper, zygote, spares and anything left) use in ``seconds``."""
    time.sleep(0.1)
    first = {p: _cpu_ticks(p) for p in box.pool.processes()}
    time.sleep(seconds)
    later = {p: _cpu_ticks(p) for p in box.pool.processes()}
    burned = sum((later[p] or 0) - (first.get(p) or 0) for p in later if later[p] is not None)
    return burned / os.sysconf("SC_CLK_TCK")


def test_a_forged_reply_in_a_session_leaves_nothing_running(sandbox: LocalSandbox) -> None:
    tag = marker()
    started = f"import subprocess\nsubprocess.Popen(['sleep', '{tag}'])\n"
    code = started + FORGE_REPLY + "os.kill(os.getpid(), 19)\n"
    result = execute(sandbox, code + "while True:\n    pass", session="forger")
    assert processes_with(tag) == [], result
    # Whatever the session's interpreter does next, it runs only within a call's deadline.
    after = execute(sandbox, "print('after')", session="forger")
    assert after.status in ("ok", "timeout", "crash"), after
    run(sandbox.close_session("forger"))
    assert processes_with(tag) == []
    assert_healthy(sandbox)


def test_cpu_budget_covers_the_whole_process_tree() -> None:
    # Four spinning children: each stays far below a per-process CPU limit, together they blow the call's.
    box = LocalSandbox(timeout_s=30.0, cpu_s=1.0, max_concurrency=2, spares=1, memory_mb=1024)
    code = (
        "import os, time\nfor _ in range(4):\n    if os.fork() == 0:\n        while True:\n            pass\n"
        "time.sleep(60)"
    )
    try:
        result = run(box.execute(code))
        # Ended by the CPU budget, not by the 30 s wall-clock limit (that would be a "timeout"): the status says so.
        assert result.status == "crash" and "CPU time" in (result.message or ""), result
    finally:
        box.close()


# ------------------------------------------------------------------------------------- bounded messages (17.2)


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def test_a_huge_frame_from_the_code_does_not_grow_the_caller(sandbox: LocalSandbox) -> None:
    code = """
import os, socket, struct
size = 200 * 2**20
frame = struct.pack(">I", size) + b"x" * size
for fd in range(3, 256):
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    s.settimeout(2.0)
    try:
        s.sendall(frame)
    except OSError:
        pass
    s.detach()
os.write(1, b"y" * (4 * 2**20))
"""
    Path("/proc/self/clear_refs").write_text("5")  # reset this process's peak RSS
    before = _peak_rss_mib()
    result = run(sandbox.execute(code, timeout_s=5.0))  # time enough to push the whole frame, were it read
    grown = _peak_rss_mib() - before
    assert result.status in ("output_limit", "crash", "timeout"), result
    assert len(result.stdout) <= sandbox.max_output_bytes
    assert grown < 64, f"the caller's peak RSS grew by {grown:.0f} MiB"
    assert_healthy(sandbox)


# ------------------------------------------------------------------------------------- no shared IPC (17.3)


SYSV_SEGMENT = """
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmget.argtypes = (ctypes.c_int, ctypes.c_size_t, ctypes.c_int)
key = {key}
"""


def _sysv_keys(pid: int | None = None) -> str:
    """/proc/sysvipc/shm of this process's IPC namespace, or of ``pid``'s."""
    import subprocess

    if pid is None:
        return Path("/proc/sysvipc/shm").read_text()
    done = subprocess.run(["nsenter", "-t", str(pid), "--ipc", "cat", "/proc/sysvipc/shm"], capture_output=True)
    return done.stdout.decode()


def test_sysv_shared_memory_dies_with_the_call(sandbox: LocalSandbox) -> None:
    key = 0x5E000000 + uuid.uuid4().int % 0xFFFFFF
    secret = "secret-of-episode-A-" + uuid.uuid4().hex
    create = (
        SYSV_SEGMENT.format(key=key)
        + f"""
for k in (key, key + 1, key + 2):
    shmid = libc.shmget(k, 16 * 2**20, 0o1000 | 0o666)  # IPC_CREAT, mode 0666
    assert shmid >= 0, ctypes.get_errno()
    addr = libc.shmat(shmid, None, 0)
    ctypes.memmove(addr, {secret.encode()!r}, {len(secret)})
    libc.shmdt(ctypes.c_void_p(addr))
print('created')
"""
    )
    assert execute(sandbox, create).stdout == "created\n"
    read = (
        SYSV_SEGMENT.format(key=key)
        + f"""
shmid = libc.shmget(key, 0, 0)
if shmid < 0:
    print('no segment')
else:
    print(ctypes.string_at(libc.shmat(shmid, None, 0), {len(secret)}).decode())
"""
    )
    other_episode = execute(sandbox, read)
    assert other_episode.stdout == "no segment\n" and secret not in other_episode.stdout, other_episode
    session = execute(sandbox, read, session="ipc-reader")
    assert session.stdout == "no segment\n", session
    run(sandbox.close_session("ipc-reader"))
    hex_key = f"{key:d}"
    assert hex_key not in _sysv_keys()  # not in the host's namespace
    zygote = sandbox.pool.zygote_pid()
    if zygote is not None:
        assert hex_key not in _sysv_keys(zygote)  # nor in the pool's: nothing outlives the call


def test_posix_message_queues_die_with_the_call(sandbox: LocalSandbox) -> None:
    name = f"/rstar-{uuid.uuid4().hex[:12]}"
    mq = """
import ctypes, ctypes.util, os
rt = ctypes.CDLL(ctypes.util.find_library("rt") or None, use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long),
                ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
"""
    send = (
        mq
        + f"""
q = rt.mq_open({name.encode()!r}, os.O_CREAT | os.O_WRONLY, 0o666, ctypes.byref(Attr(0, 4, 64, 0)))
assert q >= 0, ctypes.get_errno()
assert rt.mq_send(q, b"secret-of-episode-A", 19, 0) == 0, ctypes.get_errno()
print('sent')
"""
    )
    assert execute(sandbox, send).stdout == "sent\n"
    receive = (
        mq
        + f"""
q = rt.mq_open({name.encode()!r}, os.O_RDONLY | os.O_NONBLOCK)
if q < 0:
    print('no queue')
else:
    buf = ctypes.create_string_buffer(64)
    n = rt.mq_receive(q, buf, 64, None)
    print(buf.raw[:max(n, 0)].decode())
"""
    )
    later = execute(sandbox, receive)
    assert later.stdout == "no queue\n", later


# ------------------------------------------------------------------------------------- session threads (17.4)


def test_a_thread_left_in_a_session_does_not_write_into_later_calls(sandbox: LocalSandbox) -> None:
    leak = (
        "import threading, time\n"
        "def spam():\n    while True:\n        print('LEAKED', flush=True)\n        time.sleep(0.001)\n"
        "threading.Thread(target=spam, daemon=True).start()\nstate = 1\ntime.sleep(0.05)"
    )
    first = execute(sandbox, leak, session="threads")
    assert first.status == "exception" and "state" in (first.message or "") and "thread" in (first.message or ""), first
    assert "thread" in first.stderr  # the model is told what happened and what to do
    later = [execute(sandbox, f"print('call {i}')", session="threads") for i in range(3)]
    assert [r.stdout for r in later] == [f"call {i}\n" for i in range(3)], later
    assert all("LEAKED" not in r.stdout + r.stderr for r in later)
    spin = "import threading\nthreading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()"
    spun = execute(sandbox, spin, session="threads")
    assert spun.status == "exception", spun
    # The spinning thread is gone with its interpreter: no process of the pool keeps a CPU busy between calls.
    assert pool_cpu_burned(sandbox, 0.5) < 0.25
    run(sandbox.close_session("threads"))


def _cpu_ticks(pid: int) -> int | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) + int(fields[12])


# ------------------------------------------------------------------------------ what the code can see (issue 12)


def test_host_secrets_are_not_readable(sandbox: LocalSandbox, tmp_path: Path) -> None:
    if sandbox.isolation is None or sandbox.isolation.kind != "bwrap":
        pytest.skip("the filesystem allowlist needs bubblewrap")
    secret = "host-secret-" + uuid.uuid4().hex
    in_host_tmp = Path("/tmp") / f"rstar-host-{uuid.uuid4().hex}.txt"
    in_host_tmp.write_text(secret)
    in_host_tmp.chmod(0o644)
    (tmp_path / "secret.txt").write_text(secret)
    checkout_file = Path(__file__).resolve().parents[2] / "README.md"
    try:
        targets = ["/etc/shadow", str(in_host_tmp), str(tmp_path / "secret.txt"), str(checkout_file)]
        code = f"""
import glob, os
seen = []
for path in {targets!r} + glob.glob('/tmp/*') + glob.glob('/root/.*') + glob.glob('/home/*/*'):
    try:
        with open(path) as f:
            seen.append((path, f.read(200)))
    except OSError as exc:
        pass
print(seen)
"""
        result = execute(sandbox, code)
        assert result.ok, result
        assert secret not in result.stdout and "root:" not in result.stdout, result.stdout
        assert str(checkout_file) not in result.stdout
        # What the allowlist grants is readable by the worker's uid, without any capability.
        granted = execute(sandbox, "print(all(open(p, 'rb').read() for p in ('/etc/passwd', '/etc/ld.so.cache')))")
        assert granted.stdout == "True\n", granted
    finally:
        in_host_tmp.unlink()


def test_capabilities_are_all_dropped(sandbox: LocalSandbox) -> None:
    code = (
        "import subprocess\nprint(open('/proc/self/status').read())\n"
        "print(subprocess.run(['cat', '/proc/self/status'], capture_output=True, text=True).stdout)"
    )
    for session in (None, "caps"):
        result = execute(sandbox, code, session=session)
        caps = [line.split() for line in result.stdout.splitlines() if line.startswith(("CapEff", "CapPrm", "CapAmb"))]
        assert len(caps) == 6 and all(int(value, 16) == 0 for _, value in caps), caps
        assert "NoNewPrivs:\t1" in result.stdout
    run(sandbox.close_session("caps"))


def test_sessions_cannot_see_each_others_files_or_processes(sandbox: LocalSandbox) -> None:
    secret = "mine-" + uuid.uuid4().hex
    write = (
        f"import os\nfor path in ('mine.txt', '/tmp/mine.txt', '/dev/shm/mine.txt'):\n"
        f"    open(path, 'w').write({secret!r})\nprint(os.getpid())"
    )
    a = execute(sandbox, write, session="episode-a")
    assert a.ok, a
    look = f"""
import glob, os
found = []
for root in ('/tmp', '/dev/shm', '/var/tmp', '/proc'):
    for path in glob.glob(root + '/**', recursive=True) if root != '/proc' else []:
        try:
            if {secret!r} in open(path).read():
                found.append(path)
        except (OSError, UnicodeDecodeError):
            pass
others = []
for pid in os.listdir('/proc'):
    if pid.isdigit() and int(pid) != os.getpid():
        try:
            others.append(open(f'/proc/{{pid}}/cmdline').read())
        except OSError:
            pass
print(found, len(others))
"""
    b = execute(sandbox, look, session="episode-b")
    assert b.ok and b.stdout == "[] 0\n", b
    assert secret not in execute(sandbox, look).stdout
    for name in ("episode-a", "episode-b"):
        run(sandbox.close_session(name))


def test_files_written_to_dev_shm_stay_with_the_call(sandbox: LocalSandbox) -> None:
    name = f"rstar-shm-{uuid.uuid4().hex}"
    wrote = execute(sandbox, f"open('/dev/shm/{name}', 'w').write('x' * 1000)\nprint('written')")
    assert wrote.stdout == "written\n", wrote
    assert not Path(f"/dev/shm/{name}").exists()  # not the host's
    later = execute(sandbox, f"import os\nprint(os.path.exists('/dev/shm/{name}'))")
    assert later.stdout == "False\n", later  # nor the next call's


def test_the_timeout_counts_from_the_start_and_the_wait_is_reported_apart(sandbox: LocalSandbox) -> None:
    # Eight 0.3 s calls on two slots: the last ones wait about 0.9 s, longer than their 1 s timeout allows
    # for waiting plus running, and still succeed.
    async def scenario() -> list[ExecResult]:
        return await asyncio.gather(*(sandbox.execute("import time\ntime.sleep(0.3)") for _ in range(8)))

    results = run(scenario())
    assert all(r.ok for r in results), results
    assert max(r.queue_s for r in results) >= 0.6, [round(r.queue_s, 2) for r in results]
    assert max(r.queue_s + r.duration_s for r in results) > TIMEOUT_S
    assert all(r.duration_s < TIMEOUT_S for r in results)


# ------------------------------------------------------------------------------- no head-of-line blocking (12.1)
# Orders of events, not times: what they rule out is calls waiting for each other.


@pytest.fixture(scope="module")
def default_sandbox() -> Iterator[LocalSandbox]:
    isolation = os.environ.get("RSTAR_TEST_SANDBOX_ISOLATION", "auto")
    # Default concurrency: many more calls than cores. Each open session reserves memory_mb of pool_memory_mb: these
    # budgets hold the 16 sessions of test_sleeping_calls_overlap whatever this machine's memory.
    box = LocalSandbox(timeout_s=5.0, isolation=isolation, memory_mb=512, pool_memory_mb=17 * 512)
    start_or_skip(box)
    yield box
    box.close()


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """How many of the (start, end) spans overlap at one instant: an order of events, whatever the machine's speed."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = running = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_sleeping_calls_overlap(default_sandbox: LocalSandbox) -> None:
    # Each call reports when its code started and ended (the host's clock, read inside): compared, not measured.
    code = "import time\nprint(time.time())\ntime.sleep(0.5)\nprint(time.time())"

    async def scenario(session: bool) -> list[ExecResult]:
        return await asyncio.gather(
            *(default_sandbox.execute(code, session=f"sleep-{i}" if session else None) for i in range(16))
        )

    for session in (False, True):
        done = run(scenario(session))
        assert all(r.ok for r in done), done
        spans = [tuple(float(x) for x in r.stdout.split()) for r in done]
        # Two at a time (one per core) would be 2; all 16 at once is what happens on an idle machine.
        assert _most_at_once(spans) > 4, (session, spans)
    for i in range(16):
        run(default_sandbox.close_session(f"sleep-{i}"))


SPIN_S = 2.0
"""The spinners' timeout: two cores' worth of CPU for that long, against 14 prints that take a fraction of it."""


def test_spinning_calls_do_not_hold_up_the_others(default_sandbox: LocalSandbox) -> None:
    ended: list[str] = []

    async def call(name: str, code: str, **kwargs: Any) -> ExecResult:
        result = await default_sandbox.execute(code, **kwargs)
        ended.append(name)
        return result

    async def scenario() -> list[ExecResult]:
        spinners = [call("spinner", "while True:\n    pass", timeout_s=SPIN_S) for _ in range(2)]
        first = [asyncio.ensure_future(c) for c in spinners]
        await asyncio.sleep(0.05)  # the spinners hold their CPUs first
        prints = [call("print", f"print({i})") for i in range(14)]
        return await asyncio.gather(*prints, *first)

    done = run(asyncio.wait_for(scenario(), SPIN_S + SLACK_S))  # a hang guard: a timeout that never fired
    prints, spinners = done[:14], done[14:]
    assert [r.stdout for r in prints] == [f"{i}\n" for i in range(14)]
    # Queued behind the spinners' workers, the prints would end after the spinners' timeout: they end first.
    assert ended == ["print"] * 14 + ["spinner"] * 2, ended
    # Each spinner was ended by its own limit (the verdict names it), none by a limit of the pool's.
    assert all((r.status, r.message) == ("timeout", f"timed out after {SPIN_S:g} s") for r in spinners), spinners


# ------------------------------------------------------------------------ what a model could find and keep (round 3)

DATA_ATTACK = r"""
import asyncio, json, sys
from rstar_env.sandbox import create_sandbox

folders = json.loads(sys.argv[1])
code = f'''
import os
seen = []
for top in {folders!r}:
    for root, _dirs, files in os.walk(top):
        for name in files:
            try:
                seen.append(open(os.path.join(root, name)).read())
            except OSError:
                pass
print("searched", len(seen), seen)
'''


async def main():
    async with create_sandbox("local") as box:
        result = await box.execute(code, timeout_s=10)
    print(json.dumps([result.status, result.stdout, result.stderr]))


asyncio.run(main())
"""


def test_training_data_beside_the_script_in_the_cwd_or_on_pythonpath_does_not_come_back(tmp_path: Path) -> None:
    """``cd ~/exp && python scripts/train.py`` with data beside the script, in the working directory and on
    ``PYTHONPATH``, in a project checkout: the model's code must not find any of it."""
    answer = f"answer-{uuid.uuid4().hex}"
    exp = Path(tempfile_in_home())  # not under /tmp: a real user's folder, that the view must leave out
    try:
        (exp / "pyproject.toml").write_text("[project]\nname = 'exp'\n")
        scripts, libs = exp / "scripts", exp / "libs"
        scripts.mkdir()
        libs.mkdir()
        for folder in (exp, scripts, libs):
            (folder / "data.jsonl").write_text(json.dumps({"problem": "1+1?", "answer": answer}) + "\n")
        (scripts / "train.py").write_text(DATA_ATTACK)
        env = {**os.environ, "PYTHONPATH": str(libs)}
        done = subprocess.run(
            [sys.executable, str(scripts / "train.py"), json.dumps([str(exp), str(scripts), str(libs)])],
            cwd=exp,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        status, stdout, _stderr = json.loads(done.stdout.strip().splitlines()[-1])
        assert status == "ok" and stdout.startswith("searched"), (status, stdout)
        assert answer not in stdout
    finally:
        shutil.rmtree(exp, ignore_errors=True)


def tempfile_in_home() -> str:
    return tempfile.mkdtemp(prefix="rstar-exp-", dir=os.path.expanduser("~"))


def skip_without_cgroups() -> None:
    """Skip where this process cannot make a memory cgroup below its own (the sandbox then warns it has none)."""
    try:
        with open("/proc/self/cgroup") as f:
            own = {c: path for _, cs, path in (line.rstrip().split(":", 2) for line in f) for c in cs.split(",")}
        parent = f"/sys/fs/cgroup/memory{own['memory']}" if "memory" in own else f"/sys/fs/cgroup{own['']}"
        probe = os.path.join(parent, f"rstar-test-probe-{uuid.uuid4().hex[:8]}")
        os.mkdir(probe)
        os.rmdir(probe)
    except (OSError, KeyError) as exc:
        pytest.skip(f"no cgroup can be made here, so memory_mb bounds each process only: {exc}")


def test_a_whole_process_tree_holds_no_more_memory_than_the_budget(sandbox: LocalSandbox) -> None:
    """Four children of one call each hold 300 MiB (one of them in memfds, which an address-space limit never
    counts; each memfd below the file-size limit) under a 1 GiB budget: they cannot all hold it at once."""
    skip_without_cgroups()
    code = """
import os, select, time
CHUNK = 300 << 20
r, w = os.pipe()
kids = []
for i in range(4):
    pid = os.fork()
    if pid == 0:
        try:
            if i == 0:
                block = b"\\x01" * (30 << 20)
                fds = [os.memfd_create("hold") for _ in range(CHUNK // len(block))]
                for fd in fds:
                    os.write(fd, block)
                del block
            else:
                held = b"\\x01" * CHUNK
            os.write(w, bytes([i]))
            time.sleep(60)
        finally:
            os._exit(0)
    kids.append(pid)
end = time.time() + 5
holding = set()
while len(holding) < 4 and time.time() < end:
    if select.select([r], [], [], 0.1)[0]:
        holding.update(os.read(r, 4))
    if all(os.waitpid(k, os.WNOHANG)[0] for k in kids):
        break
time.sleep(0.3)
# Those that said they hold their share and are still alive now (a child still allocating does not count).
print(sum(os.waitpid(kids[i], os.WNOHANG) == (0, 0) for i in holding))
"""
    result = execute(sandbox, code, timeout_s=8.0)
    # Either the call itself was ended, or no more than three 300 MiB holders were alive together (1 GiB budget).
    assert result.status == "crash" or (result.ok and int(result.stdout) * 300 <= 1024), result
    assert_healthy(sandbox)


def test_an_idle_session_cannot_keep_more_than_its_budget_in_a_memfd(sandbox: LocalSandbox) -> None:
    skip_without_cgroups()
    code = """
import os
block = b"\\x01" * (32 << 20)
kept, written = [], 0
try:
    for _ in range(48):  # 1.5 GiB, in memfds each below the file-size limit
        kept.append(os.memfd_create("keep"))
        written += os.write(kept[-1], block)
except OSError:
    pass
print(written >> 20)
"""
    held = execute(sandbox, code, session="hoarder", timeout_s=8.0)
    assert held.status == "crash" or (held.ok and int(held.stdout) <= 1024), held
    run(sandbox.close_session("hoarder"))
    assert_healthy(sandbox)


def test_sessions_together_hold_no_more_than_the_pool_budget() -> None:
    # memory_mb=None: no session is bounded, so none is refused (see the next test); the pool's cgroup alone holds.
    box = LocalSandbox(
        timeout_s=8.0, max_concurrency=3, spares=1, preload=(), warmup=None, memory_mb=None, pool_memory_mb=600
    )
    start_or_skip(box)
    try:
        skip_without_cgroups()
        hold = "held = b'\\x01' * (250 << 20)\nprint('holding')"
        results = [run(box.execute(hold, session=f"s{i}")) for i in range(3)]
        # 3 x 250 MiB > 600 MiB: at least one session was ended instead of holding its share.
        alive = [run(box.execute("print(len(held) >> 20)", session=f"s{i}")) for i in range(3)]
        holding = sum(r.ok and r.stdout == "250\n" for r in alive)
        assert holding * 250 <= 600, (results, alive)
    finally:
        box.close()


PARK_FILES = """
import os
block = b"\\x01" * (1 << 20)
for i in range(6):  # 300 MiB, half in /dev/shm and half in /tmp, each file below max_file_mb
    with open(os.path.join(("/dev/shm", "/tmp")[i % 2], f"parked{i}"), "wb") as f:
        for _ in range(50):
            f.write(block)
print("parked")
"""
# In a session, the last call's 300 MiB goes before the next is made.
ORDINARY_CALL = "held = None\nheld = b'\\x01' * (300 << 20)\nprint(len(held) >> 20)"


@pytest.mark.parametrize("innocent_session", [None, "episode"])
def test_idle_sessions_parking_files_do_not_get_an_innocent_call_killed(innocent_session: str | None) -> None:
    """Finding 34.4: three idle sessions each parked 300 MiB in their private /dev/shm and /tmp (memory charged to
    the pool, to no process's RSS); another episode's ordinary 300 MiB call, fine alone, was then the one the OOM
    killer ended, three times in three (memory_mb=512, pool_memory_mb=1024). The innocent call is stateless, or
    made in a session that was open before the squatters came. A call that does not fit waits for room, and is
    turned away unrun past queue_timeout_s (a system failure): never killed. (Waiting, then running once a
    squatter closes: tests/sandbox/test_admission.py.)"""
    box = LocalSandbox(
        timeout_s=8.0,
        max_concurrency=4,
        spares=1,
        preload=(),
        warmup=None,
        memory_mb=512,
        pool_memory_mb=1024,
        queue_timeout_s=2.0,
    )
    start_or_skip(box)
    try:
        alone = run(box.execute(ORDINARY_CALL, session=innocent_session))
        assert (alone.status, alone.stdout) == ("ok", "300\n"), alone
        if innocent_session:
            assert run(box.execute("del held", session=innocent_session)).ok
        squatters = [run(box.execute(PARK_FILES, session=f"squatter-{i}")) for i in range(3)]
        for squat in squatters:  # each holds its files, or waited and was turned away unrun, naming the budgets
            refused = squat.system_failure and squat.stdout == "" and "pool_memory_mb=1024" in (squat.message or "")
            assert refused or (squat.status, squat.stdout) == ("ok", "parked\n"), squat
        assert sum(s.ok for s in squatters) >= 1, squatters
        innocent = [run(box.execute(ORDINARY_CALL, session=innocent_session)) for _ in range(3)]
        whole = [(r.status, r.stdout) == ("ok", "300\n") for r in innocent]
        unrun = [r.system_failure and r.stdout == "" for r in innocent]
        assert all(w or u for w, u in zip(whole, unrun, strict=True)), (innocent, squatters)
    finally:
        box.close()


CLONE_PARENT_SPIN = """
import ctypes, os, resource
libc = ctypes.CDLL(None, use_errno=True)
pid = libc.syscall(56, 0x00008000 | 17, 0, 0, 0, 0)  # clone(CLONE_PARENT | SIGCHLD): a child of the zygote
if pid == 0:
    try:
        resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass
    while True:
        pass
print('parent', pid)
"""


@pytest.mark.parametrize("session", [None, "clone-parent"])
def test_a_clone_parent_child_burns_no_cpu_after_the_call(sandbox: LocalSandbox, session: str | None) -> None:
    result = execute(sandbox, CLONE_PARENT_SPIN, session=session)
    assert result.status == "ok" and result.stdout.startswith("parent"), result  # returns at once, not at timeout
    # A spinning stray gets a good share of a core even on a busy machine; an idle pool uses next to nothing.
    assert pool_cpu_burned(sandbox, 1.0) < 0.15
    if session:
        after = execute(sandbox, "print('next')", session=session)
        assert after.stdout == "next\n", after
        assert pool_cpu_burned(sandbox, 1.0) < 0.15
        run(sandbox.close_session(session))
    assert_healthy(sandbox)


def test_the_kernel_keyring_carries_nothing_between_workers(sandbox: LocalSandbox) -> None:
    description = f"rstar-probe-{uuid.uuid4().hex}"
    plant = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
payload = b"the answer is 42"
key = libc.syscall(248, b"user", {description.encode()!r}, payload, len(payload), -4)  # add_key, user keyring
if key > 0:
    libc.syscall(250, 5, key, 0x3f3f3f3f)  # keyctl(KEYCTL_SETPERM): everyone may read it
print(key)
"""
    planted = execute(sandbox, plant)
    assert planted.ok, planted
    key = int(planted.stdout)
    read = f"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(256)
n = libc.syscall(250, 11, {key}, buf, 256)  # keyctl(KEYCTL_READ)
found = libc.syscall(249, b"user", {description.encode()!r}, None, 0)  # request_key
print(n, buf.value, found)
"""
    got = execute(sandbox, read)
    assert got.ok and "the answer is 42" not in got.stdout, got
    assert description not in Path("/proc/keys").read_text()  # nothing left on the host either


def test_concurrent_episodes_cannot_reach_each_others_sockets(sandbox: LocalSandbox) -> None:
    port = 40000 + uuid.uuid4().int % 20000
    abstract = f"rstar-{uuid.uuid4().hex}"
    listen = f"""
import socket
tcp = socket.socket(); tcp.bind(("127.0.0.1", {port})); tcp.listen(); tcp.setblocking(False)
unix = socket.socket(socket.AF_UNIX); unix.bind("\\0{abstract}"); unix.listen(); unix.setblocking(False)
print("listening")
"""
    assert execute(sandbox, listen, session="listener").stdout == "listening\n"
    talk = f"""
import socket
for family, address in ((socket.AF_INET, ("127.0.0.1", {port})), (socket.AF_UNIX, "\\0{abstract}")):
    s = socket.socket(family)
    try:
        s.connect(address); s.sendall(b"collude")
        print("connected")
    except OSError as exc:
        print("refused", exc.errno)
"""
    talked = execute(sandbox, talk, session="talker")
    heard = """
got = []
for s in (tcp, unix):
    try:
        conn, _ = s.accept()
        got.append(conn.recv(100))
    except BlockingIOError:
        pass
print(got)
"""
    listened = execute(sandbox, heard, session="listener")
    assert "connected" not in talked.stdout and talked.stdout.count("refused") == 2, talked
    assert listened.stdout == "[]\n", listened
    for name in ("listener", "talker"):
        run(sandbox.close_session(name))


def test_unshare_and_io_uring_are_refused(sandbox: LocalSandbox) -> None:
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, OSError) as exc:
        pytest.skip(f"no syscall filter can be had here (pyseccomp or libseccomp is missing: {exc})")
    code = """
import ctypes, os, subprocess, threading
libc = ctypes.CDLL(None, use_errno=True)
params = ctypes.create_string_buffer(120)
calls = {
    "unshare(CLONE_NEWUSER)": lambda: libc.syscall(272, 0x10000000),
    "unshare(CLONE_NEWNET)": lambda: libc.syscall(272, 0x40000000),
    "io_uring_setup": lambda: libc.syscall(425, 8, params),
    "clone(CLONE_NEWUSER)": lambda: libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0),
    "ptrace(PTRACE_ATTACH, 1)": lambda: libc.syscall(101, 16, 1, 0, 0),
}
for name, call in calls.items():
    print(name, call(), ctypes.get_errno())
# Ordinary code still works: threads, subprocesses.
t = threading.Thread(target=lambda: None); t.start(); t.join()
print(subprocess.run(["echo", "fine"], capture_output=True, text=True).stdout.strip())
"""
    result = execute(sandbox, code)
    assert result.ok, result
    lines = result.stdout.splitlines()
    assert lines[-1] == "fine"
    for line in lines[:-1]:
        assert line.endswith(f" -1 {errno.EPERM}"), result.stdout


def _install_into_venv(venv: Path, distributions: tuple[str, ...]) -> None:
    """Put the running interpreter's installed ``distributions`` (their files and metadata) into ``venv``'s
    site-packages, as pip would, by hard link where possible.

    Not ``--system-site-packages``: from a venv's interpreter that inherits the base Python's packages (Debian's
    ``/usr/lib/python3/dist-packages``), not the running venv's. Not a ``.pth`` naming the running venv's
    site-packages either: the sandbox shows an interpreter only its own install locations, so those packages
    would not be there inside it."""
    from importlib import metadata

    (site_packages,) = venv.glob("lib/python*/site-packages")
    for name in distributions:
        dist = metadata.distribution(name)
        root = Path(dist.locate_file("")).resolve()
        for file in dist.files or ():
            source = Path(dist.locate_file(file)).resolve()
            if not source.is_file() or not source.is_relative_to(root):
                continue  # a console script in bin/, or a file listed but gone
            target = site_packages / source.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:  # another filesystem
                shutil.copy2(source, target)


def test_an_interpreter_in_a_virtual_environment_under_tmp_works(tmp_path: Path) -> None:
    venv = Path("/tmp") / f"rstar-venv-{uuid.uuid4().hex[:8]}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # What a user's venv holds: the preloaded sympy (with mpmath) and the syscall filter's binding.
    _install_into_venv(venv, ("sympy", "mpmath", "pyseccomp"))
    box = LocalSandbox(python=str(venv / "bin" / "python"), spares=1, preload=("sympy",), warmup=None)
    try:
        try:
            box.start()
        except SandboxError as exc:
            if "/tmp" in str(exc):
                raise  # the harm: a venv under /tmp does not work
            start_or_skip(box)  # the sandbox cannot start here at all
        result = run(box.execute("import sys, sympy\nprint(sys.prefix, sympy.Integer(6) * 7, sympy.__file__)"))
        # sympy comes from the venv under /tmp, which the sandbox binds back over each worker's private /tmp.
        assert (result.status, result.stdout) == (
            "ok",
            f"{venv} 42 {next(venv.glob('lib/*/site-packages'))}/sympy/__init__.py\n",
        ), result
    finally:
        box.close()
        shutil.rmtree(venv, ignore_errors=True)


def test_a_new_pool_removes_the_folders_of_pools_that_died_without_close() -> None:
    gone_pid = subprocess.Popen(["true"])
    gone_pid.wait()
    stale = Path(tempfile.gettempdir()) / f"rstar-sandbox-{gone_pid.pid}-stale{uuid.uuid4().hex[:6]}"
    stale.mkdir()
    (stale / "left").write_text("x")
    live = Path(tempfile.mkdtemp(prefix=f"rstar-sandbox-{os.getpid()}-"))  # a pool of a live process: kept
    box = LocalSandbox(spares=1, preload=(), warmup=None)
    try:
        start_or_skip(box)
        assert not stale.exists()
        assert live.exists()
    finally:
        box.close()
        live.rmdir()


def test_the_fallbacks_say_what_they_lack_in_one_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No cgroup and no libseccomp: the pool still works, and one warning names both gaps with their fixes."""
    import warnings

    from rstar_env.sandbox import _cgroup

    def no_cgroup(_pool_memory_mb: int | None) -> None:
        raise OSError("this cgroup does not delegate memory and pids")

    monkeypatch.setattr(_cgroup.PoolCgroup, "create", staticmethod(no_cgroup))
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "pyseccomp.py").write_text(f"raise OSError('libseccomp.so.2 missing {uuid.uuid4().hex}')\n")
    # isolation="none": the zygote sees the host, so PYTHONPATH (the zygote's environment) shadows the real module.
    box = LocalSandbox(isolation="none", env={"PYTHONPATH": str(fake)}, spares=1, preload=(), warmup=None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start_or_skip(box)
    try:
        mine = [str(w.message) for w in caught if "rstar_env local sandbox" in str(w.message)]
        assert len(mine) == 1, mine
        assert "no cgroup per worker (this cgroup does not delegate" in mine[0] and "memfds" in mine[0]
        assert "no syscall filter" in mine[0] and "install the `pyseccomp` package" in mine[0]
        assert run(box.execute("print(6 * 7)")).stdout == "42\n"
    finally:
        box.close()


def test_a_forked_copy_of_the_pool_closed_in_the_child_leaves_the_parents_pool_running() -> None:
    """A fork (gymnasium's AsyncVectorEnv, multiprocessing) copies the process's sandboxes into the child, which
    drops or closes them: that must not stop the parent's zygote, kill its workers or remove its cgroup."""
    box = LocalSandbox(spares=1, preload=(), warmup=None)
    try:
        start_or_skip(box)
        assert execute(box, "print(1)").stdout == "1\n"
        zygote = box.pool._zygote
        assert zygote is not None
        pid = os.fork()
        if pid == 0:  # the child: close the copy, as its finalizer does when the copy is dropped
            status = 1
            try:
                signal.alarm(20)
                box.close()
                status = 0
            finally:
                os._exit(status)
        assert os.waitpid(pid, 0)[1] == 0
        after = execute(box, "print(2)")
        assert (after.status, after.stdout) == ("ok", "2\n"), after
        assert box.pool._zygote is zygote and box.pool.restarts == 0  # the same zygote served it: no restart
        if zygote.cgroup is not None:
            assert all(os.path.isdir(path) for path in zygote.cgroup.paths.values())
    finally:
        box.close()


def test_a_forked_copy_of_the_pool_used_in_the_child_runs_on_the_childs_own_zygote() -> None:
    """A forked child that uses its copy of the pool (rather than dropping it) gets a zygote of its own, without a
    warning that the zygote died (it did not), and the parent's pool goes on untouched."""
    box = LocalSandbox(spares=1, preload=(), warmup=None)
    try:
        start_or_skip(box)
        assert execute(box, "print(1)").stdout == "1\n"  # the parent's call threads exist when it forks
        zygote = box.pool._zygote
        assert zygote is not None

        def child() -> dict[str, Any]:
            warnings: list[str] = []
            handler = logging.Handler(logging.WARNING)
            handler.emit = lambda record: warnings.append(record.getMessage())  # type: ignore[method-assign]
            logging.getLogger("rstar_env.sandbox").addHandler(handler)
            result = execute(box, "import os; print(os.getpid())")
            child_zygote = box.pool._zygote
            report = {
                "status": result.status,
                "own_zygote": child_zygote is not None and child_zygote.pid != zygote.pid,
                "restarts": box.pool.restarts,
                "warnings": warnings,
            }
            box.close()
            return report

        report = in_forked_child(child)
        assert report == {"status": "ok", "own_zygote": True, "restarts": 0, "warnings": []}, report
        assert execute(box, "print(2)").stdout == "2\n"
        assert box.pool._zygote is zygote and box.pool.restarts == 0
    finally:
        box.close()


def test_a_pool_whose_cgroup_was_removed_starts_afresh() -> None:
    """Someone removes the pool's cgroup (its workers die with it): no spare can start in it again, so the zygote
    exits and the next call starts a fresh pool instead of waiting for a worker that never comes."""
    skip_without_cgroups()
    from rstar_env.sandbox import _cgroup

    box = LocalSandbox(spares=1, preload=(), warmup=None, timeout_s=5)
    try:
        start_or_skip(box)
        assert execute(box, "print(1)").ok
        zygote = box.pool._zygote
        assert zygote is not None and zygote.cgroup is not None
        for path in zygote.cgroup.paths.values():
            _cgroup._remove_tree(path)

        async def three() -> list[ExecResult]:
            return [await box.execute(f"print({i})") for i in range(3)]

        # A hang guard: a wait for a worker that never comes would run into it.
        results = run(asyncio.wait_for(three(), 60))
        # A call that met the old zygote may fail (as a crash, saying so); the last ones run on the new pool.
        assert [r.stdout for r in results[1:]] == ["1\n", "2\n"], results
        assert box.pool.restarts == 1 and box.pool._zygote is not zygote
    finally:
        box.close()


# --------------------------------------------------------------------------------- sandbox round 4 (issue 34)


def _needles(count: int) -> list[tuple[str, str]]:
    """Unique markers, each as a (head, tail) pair: the scanning code below never holds one whole, so finding one
    whole in its memory means it came from somewhere else."""
    return [(f"mk{uuid.uuid4().hex[:14]}", uuid.uuid4().hex) for _ in range(count)]


# Reads every readable mapping of its own process and reports which needles it holds whole (head then tail).
SCAN_OWN_MEMORY = """
import json
NEEDLES = {needles!r}
OWN = "own-code-" + {own_tail!r}  # this call's own marker, whole in its memory: proves the scan finds things
found, own = set(), 0
with open("/proc/self/maps") as maps, open("/proc/self/mem", "rb", 0) as mem:
    for line in maps.read().splitlines():
        fields = line.split()
        if "r" not in fields[1] or (len(fields) > 5 and fields[5].startswith("[v")):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        for at in range(start, end, 8 << 20):
            try:
                mem.seek(at)
                chunk = mem.read(min(end, at + (8 << 20) + 256) - at)
            except (OSError, OverflowError, ValueError):
                continue
            own += chunk.count(OWN.encode())
            for head, tail in NEEDLES:
                h, t = head.encode(), tail.encode()
                i = chunk.find(h)
                while i >= 0:
                    if chunk[i + len(h) : i + len(h) + len(t)] == t:
                        found.add(head)
                    i = chunk.find(h, i + 1)
print(json.dumps({{"found": sorted(found), "own": own}}))
"""


def test_a_later_call_finds_no_earlier_calls_code_or_stdin_in_its_memory(sandbox: LocalSandbox) -> None:
    """Finding 34.1: every request used to pass through the zygote, and every spare forked after it held a copy
    of the freed buffers. An episode's program and stdin (~200 characters, unique markers) must be nowhere in a
    later episode's memory, stateless or in a session."""
    needles = _needles(4)
    (code_a, stdin_a), (code_b, stdin_b) = (needles[0], needles[1]), (needles[2], needles[3])

    def program(head: str, tail: str) -> str:
        marker = head + tail
        return (
            f"# the solution of an earlier episode: {marker}\nanswer = {marker!r}\ndata = input()\n"
            f"print(sum(map(ord, answer + data)) % 97, len(data))  # {'x' * 60}\n"
        )

    stateless = execute(sandbox, program(*code_a), stdin="".join(stdin_a) + " the stdin of an earlier episode\n")
    in_session = execute(sandbox, program(*code_b), stdin="".join(stdin_b) + " its stdin\n", session="early")
    assert stateless.ok and in_session.ok, (stateless, in_session)
    scans = []
    # Enough calls to go through every spare forked since (two at a time), and a fresh session.
    for session in (None, None, None, None, None, "later"):
        scan = SCAN_OWN_MEMORY.format(needles=needles, own_tail=uuid.uuid4().hex)
        scans.append(execute(sandbox, scan, session=session, timeout_s=30.0))
    run(sandbox.close_session("early"))
    run(sandbox.close_session("later"))
    reports = [json.loads(s.stdout) if s.ok else s for s in scans]
    assert all(isinstance(r, dict) and r["own"] >= 1 for r in reports), reports  # the scan works
    assert all(r["found"] == [] for r in reports), reports


SESSION_TIMER = """
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
busy = False
def burn(*_):  # 50 ms of CPU per SIGCONT (never nested: a slow machine must not stack them up)
    global busy
    if not busy:
        busy, end = True, time.process_time() + 0.05
        while time.process_time() < end:
            pass
        busy = False
signal.signal(signal.SIGCONT, burn)
signal.signal(signal.SIGXCPU, signal.SIG_IGN)
class Event(ctypes.Structure):  # struct sigevent: SIGEV_SIGNAL delivering SIGCONT
    _fields_ = [("value", ctypes.c_void_p), ("signo", ctypes.c_int), ("notify", ctypes.c_int),
                ("pad", ctypes.c_int * 12)]
class Spec(ctypes.Structure):  # struct itimerspec
    _fields_ = [("every_s", ctypes.c_long), ("every_ns", ctypes.c_long), ("first_s", ctypes.c_long),
                ("first_ns", ctypes.c_long)]
timer = ctypes.c_void_p()
assert libc.timer_create(1, ctypes.byref(Event(None, signal.SIGCONT, 0)), ctypes.byref(timer)) == 0
# First expiry after this call has returned, then every 0.1 s: each one would resume the stopped session.
assert libc.timer_settime(timer, 0, ctypes.byref(Spec(0, 100_000_000, 0, 400_000_000)), None) == 0
times = os.times()
cpu_at_end = times.user + times.system
print("armed")
"""


def test_a_session_burns_no_cpu_between_its_calls(sandbox: LocalSandbox) -> None:
    """Finding 34.2: a session call arms a timer that sends SIGCONT every 0.1 s, with a handler that spins 50 ms
    and SIGXCPU ignored. Between its calls the session must not run: its CPU time across a 4 s pause stays at
    about nothing (or, where the machine cannot freeze it, the session is ended, saying so)."""
    armed = execute(sandbox, SESSION_TIMER, session="timer")
    assert armed.stdout == "armed\n", armed
    time.sleep(4.0)
    measure = (
        "libc.timer_delete(timer)\nsignal.signal(signal.SIGCONT, signal.SIG_DFL)\n"
        "times = os.times()\nprint(round(times.user + times.system - cpu_at_end, 3))"
    )
    later = execute(sandbox, measure, session="timer", timeout_s=5.0)
    run(sandbox.close_session("timer"))
    if later.status == "crash":
        assert "between calls" in (later.message or ""), later  # no freezer here: ended, with the reason
    else:
        assert later.ok and float(later.stdout) < 0.4, later  # resumed every 0.1 s: about 2 s
    assert_healthy(sandbox)


def test_an_episode_sees_no_other_episodes_ptys(sandbox: LocalSandbox) -> None:
    """Finding 34.6: a session opened 200 ptys and kept them while idle; another episode saw them in /dev/pts.
    Each worker has its own, small set of ptys now, and ordinary pty use still works."""
    hold = (
        "import os\nmasters = []\ntry:\n    for _ in range(200):\n"
        "        masters.append(os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY))\nexcept OSError:\n    pass\n"
        "print(len(masters), len(os.listdir('/dev/pts')))"
    )
    held = execute(sandbox, hold, session="pty-holder")
    assert held.ok, held
    opened, _listed = map(int, held.stdout.split())
    assert 1 <= opened < 200, held  # a small per-worker limit
    look = (
        "import os, pty\nbefore = sorted(os.listdir('/dev/pts'))\nmaster, slave = pty.openpty()\n"
        "os.write(master, b'hi\\n')\nprint(before, sorted(os.listdir('/dev/pts')), os.read(slave, 10))"
    )
    for session in (None, "pty-peer"):
        peer = execute(sandbox, look, session=session)
        assert peer.ok and peer.stdout == "['ptmx'] ['0', 'ptmx'] b'hi\\n'\n", peer
    for name in ("pty-holder", "pty-peer"):
        run(sandbox.close_session(name))


def test_the_code_learns_no_host_paths_from_its_command_line_mounts_or_environment(sandbox: LocalSandbox) -> None:
    """Finding 34.7: a worker's /proc/self/cmdline was the zygote's configuration (the pool's host folder, uid
    range, host PATH) and its mountinfo named the project checkout and the pool's folder. What may remain: the
    interpreter's install locations, bound at their own paths (the code sees them as ``sys.prefix`` anyway)."""
    if sandbox.isolation is None or sandbox.isolation.kind != "bwrap":
        pytest.skip("the filesystem allowlist needs bubblewrap")
    import re

    from rstar_env.sandbox import _isolation

    code = (
        "import os\nfor name in ('cmdline', 'mountinfo', 'environ'):\n"
        "    print(open(f'/proc/self/{name}', 'rb').read().replace(b'\\0', b' ').decode())"
    )
    seen = execute(sandbox, code).stdout
    for path in sorted(_isolation.visible_paths(), key=len, reverse=True):
        seen = seen.replace(path, "<interpreter>")
    checkout = str(Path(__file__).resolve().parents[2])
    home = os.path.expanduser("~")
    assert checkout not in seen, seen
    assert home == "/" or not re.search(rf"(?<![\w.-]){re.escape(home)}(?=[/\s:]|$)", seen), seen
    assert f"rstar-sandbox-{os.getpid()}" not in seen and "uid_base" not in seen, seen


SHARED_FILE_CHANNEL = """
import __future__, ctypes, fcntl, os, struct
libc = ctypes.CDLL(None, use_errno=True)
path = __future__.__file__  # read-only and the same file for every worker: the channel's medium
def probe():
    with open(path, "rb") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            flock = "free"
        except OSError:
            flock = "held"
        want = struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, 0, 0, 0)
        owner = struct.unpack("hhqqi4x", fcntl.fcntl(f, fcntl.F_GETLK, want))
        return flock, "free" if owner[0] == fcntl.F_UNLCK else "held"
"""


def test_concurrent_episodes_cannot_signal_through_locks_or_notifications_on_shared_files(
    sandbox: LocalSandbox,
) -> None:
    """Finding 34.3: one episode locks a file every worker shares (the standard library's ``__future__.py``) or
    watches it with inotify; a concurrent one sees the lock, or the watcher sees its reads. Neither carries anything
    now, and SQLite (which locks its file) still works in the private /tmp."""
    try:
        import pyseccomp  # noqa: F401
    except (ImportError, OSError) as exc:
        pytest.skip(f"no syscall filter can be had here (pyseccomp or libseccomp is missing: {exc})")
    hold = SHARED_FILE_CHANNEL + (
        "held = open(path, 'rb')\nfcntl.flock(held, fcntl.LOCK_SH)\n"
        "fcntl.fcntl(held, fcntl.F_SETLK, struct.pack('hhqqi4x', fcntl.F_RDLCK, 0, 0, 0, 0))\n"
        "watch = libc.inotify_init1(os.O_NONBLOCK)\n"
        "if watch >= 0:\n    libc.inotify_add_watch(watch, path.encode(), 0x1 | 0x20)  # IN_ACCESS | IN_OPEN\n"
        "print('holding')"
    )
    assert execute(sandbox, hold, session="signaller").stdout == "holding\n"
    # Another episode, stateless and in a session: the locks are not there, and its reads are not seen.
    for session in (None, "receiver"):
        seen = execute(sandbox, SHARED_FILE_CHANNEL + "print(*probe())", session=session)
        assert seen.stdout == "free free\n", seen
    heard = (
        "events = b''\nif watch >= 0:\n    try:\n        events = os.read(watch, 4096)\n    except OSError:\n"
        "        pass\nprint(len(events))"
    )
    assert execute(sandbox, heard, session="signaller").stdout == "0\n"
    sqlite = (
        "import sqlite3\ndb = sqlite3.connect('/tmp/scratch.db')\n"
        "db.execute('create table t (x)')\ndb.executemany('insert into t values (?)', [(i,) for i in range(10)])\n"
        "db.commit()\nprint(db.execute('select sum(x) from t').fetchone()[0])"
    )
    assert execute(sandbox, sqlite).stdout == "45\n"
    for name in ("signaller", "receiver"):
        run(sandbox.close_session(name))


# ------------------------------------------------------------------------- a PID namespace per worker (issue 34.3)


def skip_without_pid_namespace(box: LocalSandbox) -> None:
    if not box.info.get("pid_namespace"):
        pytest.skip("no PID namespace per worker on this machine (isolation='none' without root)")


def _nspid(host_pid: int) -> list[int]:
    """``host_pid`` in each PID namespace it belongs to, outermost first (``NSpid`` of its status)."""
    for line in Path(f"/proc/{host_pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return [int(p) for p in line.split()[1:]]
    raise AssertionError(f"no NSpid line for {host_pid}")


def _wait_for(predicate: Any, timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := predicate():
            return found
        time.sleep(0.02)
    raise AssertionError("timed out waiting")


PROBE_PIDS = """
import errno, os
def probe(pid):
    try:
        os.kill(pid, 0)
        killed = "exists"
    except OSError as exc:
        killed = errno.errorcode[exc.errno]
    try:
        os.close(os.pidfd_open(pid))
        opened = "opened"
    except OSError as exc:
        opened = errno.errorcode[exc.errno]
    return killed, opened
print(os.getpid(), probe(os.getpid()), [probe(pid) for pid in {pids}])
"""


def test_concurrent_episodes_cannot_see_each_others_processes_by_pid(sandbox: LocalSandbox) -> None:
    """Finding 34.3: ``kill(pid, 0)`` (EPERM, not ESRCH) and ``pidfd_open`` told a worker which of a concurrent
    episode's pids were alive, a signal one episode can send another by starting processes. Probed with the very
    pids the other episode's worker and child have in the pool's namespace, both now say there is no such
    process."""
    skip_without_pid_namespace(sandbox)
    tag = marker()
    holder = f"import subprocess, time\nsubprocess.Popen(['sleep', '{tag}'])\ntime.sleep(4)"

    async def scenario() -> tuple[ExecResult, ExecResult, list[int]]:
        held = asyncio.ensure_future(sandbox.execute(holder, timeout_s=10.0))
        (child,) = await asyncio.to_thread(_wait_for, lambda: processes_with(tag))
        worker = int(Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[1])  # its parent
        zygote = sandbox.pool.zygote_pid()
        assert zygote is not None
        level = len(_nspid(zygote)) - 1  # the pool's namespace: where workers used to see each other's pids
        pids = [_nspid(pid)[level] for pid in (worker, child)]
        probed = await sandbox.execute(PROBE_PIDS.format(pids=pids))
        return probed, await held, pids

    probed, held, pids = run(scenario())
    assert held.ok, held
    assert 1 not in pids, pids  # the pool's PID 1 is the zygote
    # Its own pid is 1 (and exists); the other episode's worker and child are not there at all.
    assert probed.stdout == f"1 ('exists', 'opened') {[('ESRCH', 'ESRCH')] * 2}\n", probed


COUNT_MY_FORKS = (
    "import os, subprocess\nchild = subprocess.Popen(['true'])\nchild.wait()\n"
    "print(child.pid, open('/proc/sys/kernel/ns_last_pid').read().strip())"
)


def test_an_episode_cannot_count_another_episodes_forks(sandbox: LocalSandbox) -> None:
    """Finding 34.3: ``/proc/sys/kernel/ns_last_pid`` and the pids of one's own children moved with every process
    a concurrent episode started, so the number of forks could carry a message. A receiver's next pid now follows
    only its own forks, whatever a sender does between its calls."""
    skip_without_pid_namespace(sandbox)
    first = execute(sandbox, COUNT_MY_FORKS, session="receiver")
    sender = execute(sandbox, "import subprocess\nfor _ in range(5):\n    subprocess.run(['true'])")
    second = execute(sandbox, COUNT_MY_FORKS, session="receiver")
    run(sandbox.close_session("receiver"))
    assert first.ok and sender.ok and second.ok, (first, sender, second)
    child, last = (int(x) for x in first.stdout.split())
    assert child == last and child < 10, first  # numbered from 1 in its own namespace
    assert second.stdout == f"{child + 1} {child + 1}\n", (first, second)


@pytest.mark.parametrize(
    ("code", "stdout"),
    [
        ("import os\nprint(os.getpid(), os.getppid())", "1 0\n"),
        ("import subprocess\nprint(subprocess.run(['echo', 'hi'], capture_output=True, text=True).stdout)", "hi\n\n"),
        (
            "import multiprocessing as mp\nwith mp.Pool(2) as pool:\n    print(pool.map(abs, [-1, -2, -3]))",
            "[1, 2, 3]\n",
        ),
        (
            "import os\npid = os.fork()\nif pid == 0:\n    os._exit(7)\n"
            "print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))",
            "7\n",
        ),
        (
            "import multiprocessing as mp, time\nchild = mp.Process(target=time.sleep, args=(30,))\nchild.start()\n"
            "child.terminate()\nchild.join()\nprint(child.exitcode)",
            "-15\n",
        ),
        (
            "import sqlite3\ndb = sqlite3.connect('/tmp/pid1.db')\ndb.execute('create table t (x)')\n"
            "db.executemany('insert into t values (?)', [(i,) for i in range(10)])\ndb.commit()\n"
            "print(db.execute('select sum(x) from t').fetchone()[0])",
            "45\n",
        ),
        (
            "import signal\nprint(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "
            "signal.signal(signal.SIGUSR1, signal.SIG_IGN) == signal.SIG_DFL)",
            "True True\n",
        ),
        (
            "import os, signal\nsignal.signal(signal.SIGUSR1, lambda *_: print('handled'))\n"
            "os.kill(os.getpid(), signal.SIGUSR1)",
            "handled\n",
        ),
    ],
    ids=[
        "own-pids",
        "subprocess",
        "multiprocessing",
        "fork-waitpid",
        "child-terminated",
        "sqlite",
        "getsignal",
        "handler",
    ],
)
def test_ordinary_code_works_in_a_worker_that_is_pid_1(sandbox: LocalSandbox, code: str, stdout: str) -> None:
    skip_without_pid_namespace(sandbox)
    result = execute(sandbox, code, timeout_s=10.0)
    assert (result.status, result.stdout) == ("ok", stdout), result


@pytest.mark.parametrize(
    ("code", "killed_by"),
    [
        ("import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\nprint('alive')", "SIGTERM"),
        (
            "import os, signal\nsignal.signal(signal.SIGTERM, signal.SIG_DFL)\nos.kill(os.getpid(), signal.SIGTERM)\n"
            "print('alive')",
            "SIGTERM",
        ),
        ("import signal\nsignal.raise_signal(signal.SIGUSR1)\nprint('alive')", "SIGUSR1"),
        ("import signal, time\nsignal.alarm(1)\ntime.sleep(5)\nprint('alive')", "SIGALRM"),
        ("import subprocess\nsubprocess.run(['sh', '-c', 'kill -TERM $PPID; sleep 5'])\nprint('alive')", "SIGTERM"),
        ("import os, signal\nos.killpg(0, signal.SIGKILL)\nprint('alive')", "SIGKILL"),
    ],
    ids=["kill-self", "default-set-again", "raise", "alarm", "child-kills-parent", "killpg"],
)
def test_signals_end_a_worker_that_is_pid_1_as_they_end_any_process(
    sandbox: LocalSandbox, code: str, killed_by: str
) -> None:
    """The kernel drops a signal whose action is the default when it is sent to a namespace's PID 1 from inside;
    the worker still dies of it, and the call says which."""
    skip_without_pid_namespace(sandbox)
    result = execute(sandbox, code, timeout_s=3.0)
    assert result.status == "crash" and f"killed by {killed_by} " in (result.message or ""), result
    assert "alive" not in result.stdout
    assert_healthy(sandbox)


def test_a_session_keeps_its_state_and_its_pid_namespace_across_calls(sandbox: LocalSandbox) -> None:
    skip_without_pid_namespace(sandbox)
    assert execute(sandbox, "import os\nstate = 41\nprint(os.getpid())", session="pid1").stdout == "1\n"
    later = execute(sandbox, "print(state + 1, os.getpid())", session="pid1")
    run(sandbox.close_session("pid1"))
    assert (later.status, later.stdout) == ("ok", "42 1\n"), later


def test_pid_namespace_false_shares_the_pools_namespace() -> None:
    box = LocalSandbox(max_concurrency=1, spares=1, preload=(), warmup=None, pid_namespace=False)
    try:
        start_or_skip(box)
        result = execute(box, "import os\nprint(os.getpid() != 1, os.getppid() != 0)")
        assert (result.status, result.stdout, box.info["pid_namespace"]) == ("ok", "True True\n", False), result
        assert execute(box, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)").status == "crash"
    finally:
        box.close()
