"""The child's end of its pipe to the supervisor: pickled messages, each after its length.

The framing is multiprocessing.connection's (a 4-byte big-endian signed length, or -1 and an
8-byte one for a message of 2 GiB or more), so the supervisor's end stays a multiprocessing
`Connection`. The child does without the module: it and what it imports (tempfile, shutil and the
compression modules among them) were about a tenth of a worker's start.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
from typing import Any, Optional

_SIZE = struct.Struct("!i")
_LARGE_SIZE = struct.Struct("!Q")
_LARGE = 0x7FFFFFFF
_ONE_WRITE = 16384  # up to this size, the length and the message go out in one write


class Pipe:
    """A blocking, message-framed pipe over a connected stream socket's descriptor. One thread
    sends and one receives at a time (the worker's `ParentWatch` holds a lock for each)."""

    def __init__(self, fd: int):
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def send(self, message: Any) -> None:
        """Raises OSError (BrokenPipeError) once the supervisor's end is closed."""
        body = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
        size = len(body)
        header = _SIZE.pack(size) if size <= _LARGE else _SIZE.pack(-1) + _LARGE_SIZE.pack(size)
        if size <= _ONE_WRITE:
            self._write(header + body)
        else:
            self._write(header)
            self._write(body)

    def recv(self) -> Any:
        """The next message; raises EOFError once the supervisor's end is closed."""
        (size,) = _SIZE.unpack(self._read(_SIZE.size))
        if size == -1:
            (size,) = _LARGE_SIZE.unpack(self._read(_LARGE_SIZE.size))
        return pickle.loads(self._read(size))

    def poll(self, timeout: Optional[float] = 0.0) -> bool:
        """Whether a message (or the end of the pipe) is waiting; waits up to `timeout` seconds
        (None: for ever)."""
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return bool(poller.poll(None if timeout is None else timeout * 1000))

    def close(self) -> None:
        os.close(self._fd)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def _read(self, size: int) -> bytes:
        data = os.read(self._fd, size)
        if len(data) == size:
            return data  # nearly always: one read
        parts = bytearray(data)
        while len(parts) < size:
            more = os.read(self._fd, size - len(parts))
            if not more:
                raise EOFError("the supervisor's end of the pipe is closed")
            parts += more
        return bytes(parts)
