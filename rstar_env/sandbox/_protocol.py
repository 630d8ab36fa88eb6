"""Framed JSON messages with attached file descriptors, over a Unix stream socket.

Every message is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON; descriptors ride as
``SCM_RIGHTS`` on the first byte. Used between the caller and the zygote (the control socket), and between the
caller and each worker (a private per-call or per-session socket).

Stdlib only: the zygote and the worker load this module without importing ``rstar_env``.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import socket
import struct
from typing import Any

MAX_FDS = 4
"""The most descriptors one message may carry."""
MAX_MESSAGE_BYTES = 1 << 24
"""Default bound on a frame: a corrupt or hostile length header must not make a reader allocate without limit.
Readers that face less trusted peers pass a smaller ``max_bytes``."""
MAX_DATAGRAM_BYTES = 1 << 16
"""Default bound on a datagram; a longer one is an error, never a partial read."""

_HEADER = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer sent something that is not a frame of this protocol (closed early, garbage, oversized)."""


def send_message(
    sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] | list[int] = (), *, nowait: bool = False
) -> None:
    """Send one message; ``fds`` are duplicated into the receiver.

    ``nowait`` fails with BlockingIOError instead of blocking on a full socket. It uses ``MSG_DONTWAIT`` rather
    than ``O_NONBLOCK``: the flag would change every descriptor sharing the socket, the worker's included.
    """
    body = json.dumps(message, separators=(",", ":")).encode()
    frame = _HEADER.pack(len(body)) + body
    flags = socket.MSG_DONTWAIT if nowait else 0
    if fds:
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
        sent = sock.sendmsg([frame], ancillary, flags)
    else:
        sent = sock.send(frame, flags)
    if sent < len(frame):
        if nowait:
            raise BlockingIOError("socket full")
        sock.sendall(memoryview(frame)[sent:])


def recv_message(sock: socket.socket, max_bytes: int = MAX_MESSAGE_BYTES) -> tuple[dict[str, Any], list[int]] | None:
    """Receive one message and the descriptors that came with it; None on a clean end of stream.

    Raises :class:`ProtocolError` on a truncated or malformed frame or one over ``max_bytes`` (checked on the
    header, before anything is buffered), and whatever the socket raises on a timeout. Received descriptors are
    the caller's to close.
    """
    fds: list[int] = []
    header = _recv_exact(sock, _HEADER.size, fds, allow_eof=True)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    if size > max_bytes:
        _close_all(fds)
        raise ProtocolError(f"frame of {size} bytes is over the limit of {max_bytes} bytes")
    body = _recv_exact(sock, size, fds, allow_eof=False)
    try:
        message = json.loads(body) if body else None
    except ValueError as exc:
        _close_all(fds)
        raise ProtocolError(f"frame is not JSON: {exc}") from None
    if not isinstance(message, dict):
        _close_all(fds)
        raise ProtocolError("frame is not a JSON object")
    return message, fds


def _recv_exact(sock: socket.socket, size: int, fds: list[int], *, allow_eof: bool) -> bytes | None:
    chunks = bytearray()
    fd_space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
    while len(chunks) < size:
        data, ancillary, _flags, _addr = sock.recvmsg(size - len(chunks), fd_space)
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                received = array.array("i")
                received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
                fds.extend(received)
        if not data:
            if allow_eof and not chunks:
                _close_all(fds)
                return None
            _close_all(fds)
            raise ProtocolError("stream ended inside a frame")
        chunks += data
    return bytes(chunks)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


def send_datagram(sock: socket.socket, message: dict[str, Any], fds: tuple[int, ...] | list[int] = ()) -> None:
    """Send one message on a ``SOCK_SEQPACKET`` socket: one datagram, delivered whole to exactly one reader."""
    body = json.dumps(message, separators=(",", ":")).encode()
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([body], ancillary)


def recv_datagram(
    sock: socket.socket, max_bytes: int = MAX_DATAGRAM_BYTES, *, nowait: bool = False
) -> tuple[dict[str, Any], list[int]] | None:
    """Receive one :func:`send_datagram` message; None when every sender is gone.

    A datagram longer than ``max_bytes`` is discarded and raises :class:`ProtocolError` (the kernel never hands
    over more than ``max_bytes``). ``nowait`` raises BlockingIOError when nothing is queued.
    """
    fd_space = socket.CMSG_SPACE(MAX_FDS * array.array("i").itemsize)
    flags = socket.MSG_DONTWAIT if nowait else 0
    data, ancillary, msg_flags, _addr = sock.recvmsg(max_bytes, fd_space, flags)
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(payload[: len(payload) - len(payload) % received.itemsize])
            fds.extend(received)
    if msg_flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        _close_all(fds)
        raise ProtocolError(f"datagram over the limit of {max_bytes} bytes (or {MAX_FDS} descriptors)")
    if not data:
        _close_all(fds)
        return None
    try:
        message = json.loads(data)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        _close_all(fds)
        raise ProtocolError("datagram is not a JSON object")
    return message, fds
