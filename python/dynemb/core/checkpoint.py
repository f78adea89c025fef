"""Engine checkpoints of tables, outside TensorFlow's Saver.

``tf.compat.v1.train.Saver`` (and Estimator) checkpoint dynemb tables as
tensors, so a save holds a copy of every table in memory. A table with an SSD
tier may be larger than memory: ``save_tables`` writes tables in the engine's
own checkpoint format (docs/checkpoint-format.md: atomic, checksummed), and
streams the rows of tiered tables from memory and disk into the files;
``restore_tables`` verifies a checkpoint, then loads it (in steps, into tiered
tables). Call them between ``sess.run`` calls, for example every N steps.
"""
from __future__ import annotations

import ctypes
from typing import Any, Iterable, Optional

from dynemb import _lib

_lib.clib.dynemb_checkpoint_save.restype = ctypes.c_int
_lib.clib.dynemb_checkpoint_save.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                             ctypes.c_size_t]
_lib.clib.dynemb_checkpoint_load.restype = ctypes.c_int
_lib.clib.dynemb_checkpoint_load.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_char_p,
                                             ctypes.c_uint, ctypes.c_uint32, ctypes.c_uint32]


def _names(tables: Optional[Iterable[Any]]) -> list[str]:
    if tables is None:
        from dynemb.core.embedding import _HANDLES  # the tables of this process
        return sorted(_HANDLES)
    out = []
    for t in tables:
        name = t if isinstance(t, str) else getattr(t, "table_name", None)
        if not isinstance(name, str):
            raise TypeError("dynemb: tables must be table objects or names, got %r" % (t,))
        out.append(name)
    return out


def _handles(names: list[str], what: str) -> list[ctypes.c_void_p]:
    hs = []
    for name in names:
        h = _lib.find_table(name)
        if h is None:
            for x in hs:
                _lib.clib.dynemb_table_release(x)
            raise _lib.DynembError(_lib.ENOTFOUND, "dynemb %s: table '%s' does not exist in "
                                   "this process; create it with create_table() first"
                                   % (what, name))
        hs.append(h)
    return hs


def save_tables(path: str, tables: Optional[Iterable[Any]] = None) -> list[str]:
    """Saves `tables` (table objects or names; default: every table of this
    process) into checkpoint directory `path` (created if missing; tables it
    already holds and that are not saved again are kept). Returns the names
    saved. Raises DynembError naming the table and the cause."""
    names = _names(tables)
    hs = _handles(names, "save_tables")
    try:
        arr = (ctypes.c_void_p * max(len(hs), 1))(*[h.value for h in hs])
        _lib.check(_lib.clib.dynemb_checkpoint_save(str(path).encode(), arr, len(hs)),
                   "save_tables('%s')" % path)
    finally:
        for h in hs:
            _lib.clib.dynemb_table_release(h)
    return names


def restore_tables(path: str, tables: Optional[Iterable[Any]] = None,
                   name_map: Optional[dict[str, str]] = None,
                   embedding_only: bool = False) -> list[str]:
    """Replaces the contents of `tables` (default: every table of this
    process) with those saved in checkpoint directory `path`. `name_map`
    maps a table's name to its name in the checkpoint (renamed tables);
    `embedding_only` takes the embeddings and starts the optimizer slots
    afresh (another optimizer). Each table is verified before it changes.
    Returns the names restored."""
    names = _names(tables)
    name_map = dict(name_map or {})
    hs = _handles(names, "restore_tables")
    flags = _lib.IMPORT_REPLACE | (_lib.IMPORT_EMBEDDING_ONLY if embedding_only else 0)
    try:
        for name, h in zip(names, hs):
            src = name_map.get(name, name)
            _lib.check(_lib.clib.dynemb_checkpoint_load(str(path).encode(), h, src.encode(),
                                                        flags, 0, 0),
                       "restore_tables('%s')" % path)
    finally:
        for h in hs:
            _lib.clib.dynemb_table_release(h)
    return names
