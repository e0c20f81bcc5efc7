"""Capturing what a kernel prints, so it lands in its case's result instead of the report's table.

`captured_stdout(transcript)` redirects file descriptor 1 and `sys.stdout` into a temporary
file for the duration of a call, so Python prints and C-level writes (a library's printf, a
GPU's device printf) are both caught; fd 1 and sys.stdout are restored exactly, exceptions
included. Whatever fd 1 is at the time (a terminal, a pipe, pytest's capture) is what comes back.

A drift case calls its kernel at every decode step, so the temporary file is opened once per
process and reused: a call that printed nothing costs a few system calls and no read.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import torch

from ssmcheck.core.execution import STOPPING_SIGNALS, interrupts_held

# What a case keeps of its kernel's output: the start, the rest only counted.
STDOUT_LIMIT = 4000


class Transcript:
    """What the calls of one case printed, kept up to `limit` bytes (the start)."""

    def __init__(self, limit: int = STDOUT_LIMIT):
        self.limit = limit
        self._kept = bytearray()
        self._dropped = 0

    @property
    def room(self) -> int:
        return self.limit - len(self._kept)

    def add(self, data: bytes, total: int) -> None:
        """Keep `data` (at most `room` bytes of the `total` that were printed)."""
        self._kept += data
        self._dropped += total - len(data)

    @property
    def text(self) -> str:
        text = self._kept.decode("utf-8", errors="replace")
        return text + f"\n[... {self._dropped} more bytes not kept]" if self._dropped else text


class _Sink:
    """The process's capture file and a text stream over it, made on first use."""

    def __init__(self):
        self.fd, path = tempfile.mkstemp(prefix="ssmcheck-stdout-")
        os.unlink(path)  # open but nameless: gone with the process, whatever ends it
        self._stream = None

    @property
    def stream(self):
        """sys.stdout during a call (made again if a kernel closed it)."""
        if self._stream is None or self._stream.closed:
            self._stream = open(  # noqa: SIM115 (kept open for the process's life)
                self.fd, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False,
            )
        return self._stream

    def drain(self, transcript: Transcript) -> None:
        size = os.fstat(self.fd).st_size
        if size:
            transcript.add(os.pread(self.fd, min(size, transcript.room), 0), size)
            os.ftruncate(self.fd, 0)
            os.lseek(self.fd, 0, os.SEEK_SET)


_sink: _Sink | None = None


def _libc_fflush():
    try:
        return ctypes.CDLL(None).fflush
    except (OSError, AttributeError):  # no C library to flush (not a POSIX libc)
        return None


_fflush = _libc_fflush()


@contextmanager
def captured_stdout(transcript: Transcript) -> Iterator[None]:
    """Send fd 1 and sys.stdout to the capture file during the block; add what was written to `transcript`."""
    global _sink
    if _sink is None:
        _sink = _Sink()
    with suppress(OSError, ValueError):  # a closed stdout is for its next writer to find, not the kernel
        sys.stdout.flush()  # what was printed before belongs where it was going
    stream = _sink.stream
    with _signals_deferred():
        saved_fd, saved_stream = os.dup(1), sys.stdout
        os.dup2(_sink.fd, 1)
        sys.stdout = stream
    try:
        yield
        # A GPU's device printf reaches fd 1 at synchronization; a call being captured into a CUDA graph
        # runs nothing yet (and may not synchronize).
        if torch.cuda.is_initialized() and not torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
    finally:
        with _signals_deferred():
            with suppress(ValueError):  # the kernel closed sys.stdout: nothing left in it to flush
                stream.flush()
            if _fflush is not None:
                _fflush(None)  # C stdio buffers fd 1 fully when it is a file: flush them into it
            sys.stdout = saved_stream
            os.dup2(saved_fd, 1)
            os.close(saved_fd)
            _sink.drain(transcript)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back while fd 1 and sys.stdout are swapped: the handler that stops a sweep
    (core.execution.interruptible) raises between any two statements, and raised halfway through the restore
    it left fd 1 in the capture file, so the interrupted sweep's summary went there and not to the user.
    The sweep's Interrupted comes when the block ends (core.execution.interrupts_held); the signals are also
    blocked in this thread, for a library user's own handlers (KeyboardInterrupt), which then run when the
    block ends if the signal came to this thread."""
    with interrupts_held():
        if not hasattr(signal, "pthread_sigmask"):  # not POSIX: nothing to block with
            yield
            return
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING_SIGNALS)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)
