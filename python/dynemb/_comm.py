"""The world of an MPI launch: libdynemb_comm.so (comm/, the exchange between
worker processes) through ctypes.

Loaded only when a script runs under an MPI launcher or asks for MPI
(``init(use_mpi=True)``): one worker needs neither MPI nor this library. The
world is joined once per process and left at exit (MPI_Finalize).

libmpi is loaded with RTLD_GLOBAL first: Open MPI loads its transports as
plugins that look up libmpi's symbols in the global namespace, so a libmpi
reached only through a ctypes library loaded locally would fail to start.
"""
from __future__ import annotations

import atexit
import ctypes
import ctypes.util
import os
import sys
from pathlib import Path
from typing import Optional

_LIB_FILE = "libdynemb_comm.so"
# How long a rank that sends nothing -- no part, and no status message,
# which every live rank sends about once a second from a thread of its own,
# however busy -- is waited for (dynemb_comm_open's timeout_s): after it, the
# rank is dead, frozen or unreachable, and the error names it. 60 s: no live
# process is silent that long (a status thread needs no GIL and no free
# core for long), and a dead rank is found 5x sooner than with the 300 s
# that a single deadline needed to spare busy ranks. Busy ranks are now
# spared by their status: a rank that is alive but does not join is waited
# for 5 x this (300 s, a slow input or a long save on one rank), and ranks
# that run different exchanges fail within seconds
# (docs/distributed.md, "Faults never hang the job").
TIMEOUT_VARIABLE = "DYNEMB_EXCHANGE_TIMEOUT"
DEFAULT_TIMEOUT_S = 60.0


def _find_library() -> str:
    env = os.environ.get("DYNEMB_COMM_LIB")
    here = Path(__file__).resolve().parent
    candidates = [Path(env)] if env else []
    candidates += [here / _LIB_FILE, here.parent.parent / "build" / _LIB_FILE]
    for c in candidates:
        if c.is_file():
            return str(c)
    raise RuntimeError(
        "dynemb: this process runs under an MPI launch, but the exchange library %s was "
        "not found (looked in: %s). Build it with `make comm` in the source tree (it "
        "needs Open MPI: apt-get install openmpi-bin libopenmpi-dev)"
        % (_LIB_FILE, ", ".join(str(c) for c in candidates)))


class World:
    """This process's place in the launch: rank, size, ranks on this host."""

    def __init__(self, lib: ctypes.CDLL, handle: ctypes.c_void_p):
        self._lib = lib
        self._handle = handle
        self.rank = int(lib.dynemb_comm_rank(handle))
        self.size = int(lib.dynemb_comm_size(handle))
        self.local_size = int(lib.dynemb_comm_local_size(handle))

    def allgather(self, channel: int, payload: bytes) -> list[bytes]:
        """Every rank's `payload`, in rank order (blocking; every rank calls
        it with the same channel, in the same order). Channels below 16 are
        Python's (dynemb._state.PYTHON_CHANNELS); graph ops use the rest."""
        n = self.size
        send = ctypes.create_string_buffer(payload, len(payload) or 1)
        offsets = (ctypes.c_size_t * n)(*([0] * n))
        lengths = (ctypes.c_size_t * n)(*([len(payload)] * n))
        recv = ctypes.c_void_p()
        roff, rlen = (ctypes.c_size_t * n)(), (ctypes.c_size_t * n)()
        err = ctypes.create_string_buffer(2048)
        rc = self._lib.dynemb_comm_alltoallv(self._handle, channel, send, offsets, lengths,
                                             ctypes.byref(recv), roff, rlen, err, len(err))
        if rc != 0:
            raise RuntimeError("dynemb: exchange with the other ranks failed: %s"
                               % err.value.decode(errors="replace"))
        try:
            return [ctypes.string_at(recv.value + roff[p], rlen[p]) if rlen[p] else b""
                    for p in range(n)]
        finally:
            _libc_free(recv)

    def label_once(self, labels: dict) -> None:
        """Names channels for the errors of every rank ({channel: text}, one
        exchange per run), once per process (dynemb_comm_label)."""
        if getattr(self, "_labelled", False):
            return
        err = ctypes.create_string_buffer(256)
        for channel, text in labels.items():
            self._lib.dynemb_comm_label(self._handle, channel, text.encode(), 1, err, len(err))
        self._labelled = True

    def bytes_sent(self) -> int:
        """Payload bytes this rank has sent to other ranks (benchmarks)."""
        return int(self._lib.dynemb_comm_bytes_sent(self._handle))

    def seconds(self) -> float:
        """Seconds this rank's threads spent in blocking exchanges."""
        return float(self._lib.dynemb_comm_seconds(self._handle))

    def close(self) -> None:
        if self._handle:
            self._lib.dynemb_comm_close(self._handle)
            self._handle = None


_WORLD: Optional[World] = None


def _libc_free(buf: ctypes.c_void_p) -> None:
    if buf.value:
        ctypes.CDLL(None).free(buf)


def _timeout() -> float:
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError("dynemb: %s=%r must be a number of seconds > 0 (how long a "
                         "silent rank is waited for)" % (TIMEOUT_VARIABLE, text))
    return value


def world() -> World:
    """Joins the launch's world (once per process) and returns it."""
    global _WORLD
    if _WORLD is not None:
        return _WORLD
    timeout = _timeout()
    path = _find_library()
    mpi = ctypes.util.find_library("mpi")
    if mpi:
        ctypes.CDLL(mpi, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    lib.dynemb_comm_open.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_double,
                                     ctypes.c_char_p, ctypes.c_size_t]
    lib.dynemb_comm_open.restype = ctypes.c_int
    for fn in ("dynemb_comm_rank", "dynemb_comm_size", "dynemb_comm_local_size"):
        getattr(lib, fn).argtypes = [ctypes.c_void_p]
        getattr(lib, fn).restype = ctypes.c_int
    lib.dynemb_comm_alltoallv.argtypes = [
        ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t),
        ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p,
        ctypes.c_size_t]
    lib.dynemb_comm_alltoallv.restype = ctypes.c_int
    lib.dynemb_comm_label.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_char_p,
                                      ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    lib.dynemb_comm_label.restype = ctypes.c_int
    lib.dynemb_comm_bytes_sent.argtypes = [ctypes.c_void_p]
    lib.dynemb_comm_bytes_sent.restype = ctypes.c_uint64
    lib.dynemb_comm_seconds.argtypes = [ctypes.c_void_p]
    lib.dynemb_comm_seconds.restype = ctypes.c_double
    lib.dynemb_comm_close.argtypes = [ctypes.c_void_p]
    lib.dynemb_comm_close.restype = None
    handle = ctypes.c_void_p()
    err = ctypes.create_string_buffer(1024)
    if lib.dynemb_comm_open(ctypes.byref(handle), timeout, err, len(err)) != 0:
        raise RuntimeError("dynemb: joining the MPI launch failed: %s"
                           % err.value.decode(errors="replace"))
    lib.dynemb_comm_abort.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.dynemb_comm_abort.restype = None
    _WORLD = World(lib, handle)
    atexit.register(_WORLD.close)
    _abort_on_uncaught_exceptions(lib, handle)
    return _WORLD


def _abort_on_uncaught_exceptions(lib: ctypes.CDLL, handle: ctypes.c_void_p) -> None:
    previous = sys.excepthook

    def hook(kind, value, tb):  # type: ignore[no-untyped-def]
        previous(kind, value, tb)
        sys.stderr.flush()
        sys.stdout.flush()
        lib.dynemb_comm_abort(handle, 1)

    sys.excepthook = hook
