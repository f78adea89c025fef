"""Loads the dynemb op library and binds the engine's C API with ctypes.

One shared object, ``_dynemb_ops.so``, holds both the TensorFlow kernels
(registered when TensorFlow loads it) and the engine itself, whose public
``dynemb_*`` functions are exported; ctypes opens the very same loaded
library, so tables created here are the tables the kernels find by name.

Search order for the library: ``$DYNEMB_OPS_LIB``, the installed package
directory, then ``build/tf/`` of a source checkout (editable installs).

Python code borrows a table's engine handle with
``with table_handle(name) as h:``, which gives the reference back when the
block ends. This is the bottom layer of the package: it imports no other
dynemb module (tests/py/test_layering.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
from pathlib import Path
from typing import Any, Iterator, Optional

import tensorflow as tf

_LIB_FILE = "_dynemb_ops.so"


def _find_library() -> str:
    env = os.environ.get("DYNEMB_OPS_LIB")
    here = Path(__file__).resolve().parent
    candidates = [Path(env)] if env else []
    candidates += [here / _LIB_FILE, here.parent.parent / "build" / "tf" / _LIB_FILE]
    for c in candidates:
        if c.is_file():
            return str(c)
    raise ImportError(
        "dynemb: the op library %s was not found (looked in: %s). Build it with "
        "`make ops` in the source tree, or reinstall with `pip install .`."
        % (_LIB_FILE, ", ".join(str(c) for c in candidates)))


LIB_PATH = _find_library()
ops: Any = tf.load_op_library(LIB_PATH)  # registers the kernels
clib = ctypes.CDLL(LIB_PATH)              # the same library, already loaded

_SHARDED_FILE = "_dynemb_sharded_ops.so"
_sharded: list = []


def sharded_ops() -> Any:
    """The op library of several ranks (tf/sharded_ops.c), loaded once, next
    to the op library above (installed or build/tf/). It depends on
    libdynemb_comm.so and so on libmpi: load it only after joining the
    launch's world (dynemb._comm.world(), which loads libmpi globally)."""
    if not _sharded:
        path = Path(LIB_PATH).resolve().parent / _SHARDED_FILE
        if not path.is_file():
            raise RuntimeError(
                "dynemb: this process is one of several ranks, but the op library of "
                "several ranks %s is not next to %s. Build it with `make ops` in the source "
                "tree where Open MPI's mpicc is (apt-get install openmpi-bin "
                "libopenmpi-dev), or reinstall with `pip install .` there"
                % (_SHARDED_FILE, LIB_PATH))
        _sharded.append(tf.load_op_library(str(path)))
    return _sharded[0]

# --- engine constants (include/dynemb.h) ------------------------------------
OK, EINVAL, ENOMEM, EEXIST, ENOTFOUND, EDIM = 0, 1, 2, 3, 4, 5
EIO, ECORRUPT, EVERSION, EMISMATCH = 7, 8, 9, 11
INIT_ZEROS, INIT_CONSTANT, INIT_UNIFORM, INIT_NORMAL, INIT_TRUNCATED_NORMAL = range(5)
OPT_SGD, OPT_ADAGRAD, OPT_ADAM, OPT_FTRL, OPT_ADAMW = range(5)
LOOKUP_TRAIN, LOOKUP_EVAL = 0, 1
IMPORT_REPLACE, IMPORT_EMBEDDING_ONLY, IMPORT_KEEP_STEPS, IMPORT_ADOPT_LAYOUT = 1, 2, 4, 8
STATS_FIELDS = ("size", "capacity", "candidates", "bytes", "lookups", "hits",
                "inserted", "rejected", "evicted", "evicted_candidates",
                "applied", "dropped_gradients", "nonfinite_skipped", "apply_steps",
                "host_rows", "ssd_rows", "ssd_bytes", "ssd_reads", "ssd_writes",
                "ssd_lookups")


class Initializer(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int), ("a", ctypes.c_float),
                ("b", ctypes.c_float), ("seed", ctypes.c_uint64)]


class Optimizer(ctypes.Structure):
    _fields_ = [("kind", ctypes.c_int)] + [
        (n, ctypes.c_float) for n in (
            "learning_rate", "initial_accumulator_value", "beta1", "beta2",
            "epsilon", "learning_rate_power", "l1", "l2", "l2_shrinkage",
            "weight_decay")]


class TableConfig(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p), ("dim", ctypes.c_int),
        ("init", Initializer), ("optimizer", Optimizer),
        ("access_threshold", ctypes.c_uint32),
        ("eviction_threshold", ctypes.c_int64),
        ("default_value", ctypes.POINTER(ctypes.c_float)),
        ("nonfinite_policy", ctypes.c_int), ("shards", ctypes.c_int),
        ("device_vocabulary_size", ctypes.c_uint64),
        ("host_vocabulary_size", ctypes.c_uint64),
        ("ssd_vocabulary_size", ctypes.c_uint64),
        ("ssd_data_path", ctypes.c_char_p),
        ("host_budget_name", ctypes.c_char_p)]


class CkptEntry(ctypes.Structure):
    """dynemb_ckpt_entry: one table of an engine checkpoint."""
    _fields_ = [("name", ctypes.c_char_p), ("file", ctypes.c_char_p),
                ("format_version", ctypes.c_int), ("dim", ctypes.c_int),
                ("row_floats", ctypes.c_int), ("optimizer_kind", ctypes.c_int),
                ("rows", ctypes.c_uint64), ("candidates", ctypes.c_uint64),
                ("apply_steps", ctypes.c_uint64), ("file_bytes", ctypes.c_uint64)]


class Snapshot(ctypes.Structure):
    """dynemb_snapshot: a table's contents, rows sorted by key."""
    _fields_ = [("dim", ctypes.c_int), ("row_floats", ctypes.c_int),
                ("optimizer_kind", ctypes.c_int), ("apply_steps", ctypes.c_uint64),
                ("rows", ctypes.c_size_t), ("keys", ctypes.POINTER(ctypes.c_int64)),
                ("values", ctypes.POINTER(ctypes.c_float)),
                ("last_access", ctypes.POINTER(ctypes.c_uint32)),
                ("candidates", ctypes.c_size_t),
                ("cand_keys", ctypes.POINTER(ctypes.c_int64)),
                ("cand_counts", ctypes.POINTER(ctypes.c_uint32)),
                ("cand_last_access", ctypes.POINTER(ctypes.c_uint32))]


class TableStats(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in STATS_FIELDS]


_P = ctypes.c_void_p
_SIGS = {
    "dynemb_last_error": (ctypes.c_char_p, []),
    "dynemb_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "dynemb_table_config_init": (None, [ctypes.POINTER(TableConfig)]),
    "dynemb_table_create": (ctypes.c_int, [ctypes.POINTER(TableConfig), ctypes.POINTER(_P)]),
    "dynemb_table_find": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_P)]),
    "dynemb_table_release": (None, [_P]),
    "dynemb_table_drop": (ctypes.c_int, [ctypes.c_char_p]),
    "dynemb_registry_clear": (None, []),
    "dynemb_table_dim": (ctypes.c_int, [_P]),
    "dynemb_table_row_floats": (ctypes.c_int, [_P]),
    "dynemb_table_get_config": (None, [_P, ctypes.POINTER(TableConfig)]),
    "dynemb_table_set_access_threshold": (ctypes.c_int, [_P, ctypes.c_uint32]),
    "dynemb_table_set_admission_counting": (ctypes.c_int, [_P, ctypes.c_int]),
    "dynemb_table_admission_counting": (ctypes.c_int, [_P]),
    "dynemb_key_shard": (ctypes.c_uint32, [ctypes.c_int64, ctypes.c_uint32]),
    "dynemb_table_set_eviction_threshold": (ctypes.c_int, [_P, ctypes.c_int64]),
    "dynemb_table_set_default_value": (ctypes.c_int, [_P, ctypes.POINTER(ctypes.c_float)]),
    "dynemb_table_set_optimizer": (ctypes.c_int, [_P, ctypes.POINTER(Optimizer)]),
    "dynemb_checkpoint_inspect": (ctypes.c_int, [ctypes.c_char_p,
                                                 ctypes.POINTER(ctypes.POINTER(CkptEntry)),
                                                 ctypes.POINTER(ctypes.c_size_t)]),
    "dynemb_ckpt_entries_free": (None, [ctypes.POINTER(CkptEntry), ctypes.c_size_t]),
    "dynemb_table_snapshot": (ctypes.c_int, [_P, ctypes.POINTER(Snapshot)]),
    "dynemb_table_export_raw": (ctypes.c_int, [_P, ctypes.c_char_p, ctypes.c_char_p,
                                               ctypes.POINTER(ctypes.c_uint64)]),
    "dynemb_checkpoint_read": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_char_p,
                                              ctypes.POINTER(Snapshot)]),
    "dynemb_snapshot_free": (None, [ctypes.POINTER(Snapshot)]),
    "dynemb_table_get_stats": (None, [_P, ctypes.POINTER(TableStats)]),
    "dynemb_table_size": (ctypes.c_uint64, [_P]),
    "dynemb_table_capacity": (ctypes.c_uint64, [_P]),
    "dynemb_checkpoint_save": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(_P),
                                              ctypes.c_size_t]),
    "dynemb_checkpoint_save_incremental": (ctypes.c_int, [
        ctypes.c_char_p, ctypes.POINTER(_P), ctypes.c_size_t, ctypes.c_int,
        ctypes.POINTER(ctypes.c_int)]),
    "dynemb_checkpoint_base": (ctypes.c_int, [ctypes.c_char_p,
                                              ctypes.POINTER(ctypes.c_void_p)]),
    "dynemb_checkpoint_parts": (ctypes.c_int, [
        ctypes.c_char_p, ctypes.POINTER(ctypes.POINTER(ctypes.c_char_p)),
        ctypes.POINTER(ctypes.c_size_t)]),
    "dynemb_checkpoint_load": (ctypes.c_int, [ctypes.c_char_p, _P, ctypes.c_char_p,
                                              ctypes.c_uint, ctypes.c_uint32, ctypes.c_uint32,
                                              ctypes.c_void_p]),
}
for _name, (_res, _args) in _SIGS.items():
    _f = getattr(clib, _name)
    _f.restype, _f.argtypes = _res, _args


class DynembError(RuntimeError):
    """An engine call failed; ``code`` is the dynemb status code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def check(rc: int, what: str = "") -> None:
    """Raises DynembError with the engine's message when rc is not OK."""
    if rc != OK:
        msg = (clib.dynemb_last_error() or b"").decode("utf-8", "replace")
        if not msg:
            msg = clib.dynemb_strerror(rc).decode()
        raise DynembError(rc, "dynemb%s: %s" % (" " + what if what else "", msg))


def find_table(name: str) -> ctypes.c_void_p | None:
    """A new reference to the registered table `name`, or None."""
    h = _P()
    if clib.dynemb_table_find(name.encode(), ctypes.byref(h)) != OK:
        return None
    return h


_NOT_REGISTERED = object()  # table_handle's default for a missing table


@contextlib.contextmanager
def table_handle(name: str,
                 missing: Any = _NOT_REGISTERED) -> Iterator[Optional[ctypes.c_void_p]]:
    """``with table_handle(name) as h:`` a reference to the registered table
    `name` for the block, released when the block ends (also on errors).

    When no table has that name, raises `missing` (the exception the caller's
    users should see); by default a DynembError (ENOTFOUND) naming the table.
    ``missing=None`` yields None instead, for callers that handle it.
    """
    h = find_table(name)
    if h is None:
        if missing is _NOT_REGISTERED:
            raise DynembError(ENOTFOUND, "dynemb: table '%s' is not registered in this "
                              "process; create it with create_table()" % name)
        if missing is not None:
            raise missing
    try:
        yield h
    finally:
        if h is not None:
            clib.dynemb_table_release(h)


def table_stats(name: str) -> dict[str, int]:
    """The engine's counters for table `name` (see dynemb_table_stats)."""
    with table_handle(name) as h:
        s = TableStats()
        clib.dynemb_table_get_stats(h, ctypes.byref(s))
        return {n: int(getattr(s, n)) for n in STATS_FIELDS}
