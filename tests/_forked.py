"""Run a function in a forked child of the test process and bring back what it returns."""

from __future__ import annotations

import json
import os
import signal
import traceback
from collections.abc import Callable
from typing import Any


def in_forked_child(body: Callable[[], Any], timeout_s: int = 30) -> Any:
    """``body()`` in a fork of this process; its JSON-able return value. Fails the test if the child raised, hung
    past ``timeout_s`` (it is killed by SIGALRM) or crashed."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            signal.alarm(timeout_s)
            os.close(read)
            os.write(write, json.dumps(body()).encode())
            status = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert status == 0, f"the forked child raised, hung or crashed (wait status {status}; see its stderr)"
    return json.loads(data)
