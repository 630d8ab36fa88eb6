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
    before = sandbox.pool.resting_size()  # wrapper, zygote, idle spares (perhaps not all forked yet)
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
    # At most max_concurrency workers run; the rest are idle spares, the zygote, its wrapper, and workers being
    # torn down (killed once they replied; their namespaces go with them). On a loaded machine a dozen of those can
    # wait to be reaped at once (16 seen with both cores busy); a fork per call would show hundreds.
    assert peak <= sandbox.pool.resting_size() + sandbox.max_concurrency + 16, peak


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
    assert result.status in ("timeout", "crashed"), result
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
    assert result.status in ("timeout", "crashed"), result
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
    assert after.status in ("ok", "timeout", "crashed"), after
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
        assert result.status == "crashed" and "CPU time" in (result.error or ""), result
        assert result.duration_s < 20.0, result  # long before the 30 s wall-clock limit
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
    assert result.status in ("output_limit", "crashed", "timeout"), result
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
    create = SYSV_SEGMENT.format(key=key) + f"""
for k in (key, key + 1, key + 2):
    shmid = libc.shmget(k, 16 * 2**20, 0o1000 | 0o666)  # IPC_CREAT, mode 0666
    assert shmid >= 0, ctypes.get_errno()
    addr = libc.shmat(shmid, None, 0)
    ctypes.memmove(addr, {secret.encode()!r}, {len(secret)})
    libc.shmdt(ctypes.c_void_p(addr))
print('created')
"""
    assert execute(sandbox, create).stdout == "created\n"
    read = SYSV_SEGMENT.format(key=key) + f"""
shmid = libc.shmget(key, 0, 0)
if shmid < 0:
    print('no segment')
else:
    print(ctypes.string_at(libc.shmat(shmid, None, 0), {len(secret)}).decode())
"""
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
    send = mq + f"""
q = rt.mq_open({name.encode()!r}, os.O_CREAT | os.O_WRONLY, 0o666, ctypes.byref(Attr(0, 4, 64, 0)))
assert q >= 0, ctypes.get_errno()
assert rt.mq_send(q, b"secret-of-episode-A", 19, 0) == 0, ctypes.get_errno()
print('sent')
"""
    assert execute(sandbox, send).stdout == "sent\n"
    receive = mq + f"""
q = rt.mq_open({name.encode()!r}, os.O_RDONLY | os.O_NONBLOCK)
if q < 0:
    print('no queue')
else:
    buf = ctypes.create_string_buffer(64)
    n = rt.mq_receive(q, buf, 64, None)
    print(buf.raw[:max(n, 0)].decode())
"""
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
    assert first.status == "error" and "state" in (first.error or "") and "thread" in (first.error or ""), first
    assert "thread" in first.stderr  # the model is told what happened and what to do
    later = [execute(sandbox, f"print('call {i}')", session="threads") for i in range(3)]
    assert [r.stdout for r in later] == [f"call {i}\n" for i in range(3)], later
    assert all("LEAKED" not in r.stdout + r.stderr for r in later)
    spin = "import threading\nthreading.Thread(target=lambda: [None for _ in iter(int, 1)], daemon=True).start()"
    spun = execute(sandbox, spin, session="threads")
    assert spun.status == "error", spun
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
    checkout_file = Path(__file__).resolve().parents[1] / "README.md"
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
# Generous bounds: what they rule out is calls waiting for each other (4 s and 5 s below), not slowness.


@pytest.fixture(scope="module")
def default_sandbox() -> Iterator[LocalSandbox]:
    isolation = os.environ.get("RSTAR_TEST_SANDBOX_ISOLATION", "auto")
    box = LocalSandbox(timeout_s=5.0, isolation=isolation)  # default concurrency: many more calls than cores
    try:
        box.start()
    except SandboxError as exc:
        pytest.skip(f"local sandbox unavailable: {exc}")
    yield box
    box.close()


async def _timed(coro: Any, t0: float) -> tuple[ExecResult, float]:
    result = await coro
    return result, time.monotonic() - t0


def test_sleeping_calls_overlap(default_sandbox: LocalSandbox) -> None:
    async def scenario(session: bool) -> list[tuple[ExecResult, float]]:
        t0 = time.monotonic()
        calls = [
            default_sandbox.execute("import time\ntime.sleep(0.5)", session=f"sleep-{i}" if session else None)
            for i in range(16)
        ]
        return await asyncio.gather(*(_timed(c, t0) for c in calls))

    for session in (False, True):
        done = run(scenario(session))
        assert all(r.ok for r, _ in done), done
        # Two at a time (one per core) would take 4 s.
        assert max(t for _, t in done) < 2.5, (session, [round(t, 2) for _, t in done])
    for i in range(16):
        run(default_sandbox.close_session(f"sleep-{i}"))


def test_spinning_calls_do_not_hold_up_the_others(default_sandbox: LocalSandbox) -> None:
    async def scenario() -> list[tuple[ExecResult, float]]:
        t0 = time.monotonic()
        spinners = [default_sandbox.execute("while True:\n    pass", timeout_s=5.0) for _ in range(2)]
        await asyncio.sleep(0.05)  # the spinners hold their CPUs first
        prints = [default_sandbox.execute(f"print({i})") for i in range(14)]
        return await asyncio.gather(*(_timed(c, t0) for c in [*prints, *spinners]))

    done = run(scenario())
    prints, spinners = done[:14], done[14:]
    assert [r.stdout for r, _ in prints] == [f"{i}\n" for i in range(14)]
    # Queued behind the spinners' workers, the prints would finish after their 5 s timeout.
    assert max(t for _, t in prints) < 2.5, [round(t, 2) for _, t in prints]
    assert all(r.status == "timeout" for r, _ in spinners), spinners
    # A call's timeout counts from its start; the wait before it is reported apart.
    assert all(r.duration_s < 5.0 + SLACK_S and r.queue_s >= 0 for r, _ in done)


def test_an_interpreter_under_tmp_is_refused_with_the_fix(monkeypatch):
    """Each worker's /tmp is private and empty, so a venv there would vanish: named at start-up, not per call."""
    from rstar_env.sandbox import SandboxError, _isolation

    paths = ("/usr/lib/python3", "/tmp/venv/lib/python3.11/site-packages")
    monkeypatch.setattr(_isolation, "visible_paths", lambda python=None: paths)
    for kind in ("bwrap", "unshare"):
        with pytest.raises(SandboxError, match=r"lives under /tmp \(/tmp/venv.*put the virtual environment elsewhere"):
            _isolation.Isolation(kind, False, True, True).command("/x")
    assert _isolation.Isolation("none", True, False, False).command("/x") == []


def test_an_import_path_under_tmp_is_left_out_of_the_view_not_refused(monkeypatch):
    """``python -m`` run from a directory under /tmp puts it on sys.path: the view drops it, the pool starts."""
    import sys

    from rstar_env.sandbox import _isolation

    work = Path("/tmp") / f"rstar-cwd-{os.getpid()}"
    work.mkdir(exist_ok=True)
    try:
        monkeypatch.setattr(sys, "path", [str(work), *sys.path])
        _isolation.visible_paths.cache_clear()
        paths = _isolation.visible_paths()
        assert not any(p == str(work) or p.startswith("/tmp/") for p in paths), paths
        assert _isolation.Isolation("unshare", False, True, True).command("/x")  # no SandboxError
    finally:
        _isolation.visible_paths.cache_clear()
        work.rmdir()
