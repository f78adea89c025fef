"""Engine checkpoints of tables, and where Saver checkpoints keep them.

``save_tables`` writes tables in the engine's own checkpoint format
(docs/checkpoint-format.md: atomic, checksummed) and streams the rows of tables
with an SSD tier from memory and disk into the files; ``restore_tables``
verifies a checkpoint, then loads it (in steps, into tiered tables). Call them
between ``sess.run`` calls.

``tf.compat.v1.train.Saver`` (and so Estimator) checkpoints keep the tables as
mxRec's do: the Saver's files hold a marker per table
(dynemb.core.tables.MarkerTableSaveable), and ``patch_saver`` makes
``Saver.save(sess, "<dir>/model", global_step=N)`` write the rows of the
graph's tables with ``save_tables`` into the sparse directory
``<dir>/sparse-model-N`` (before the Saver writes its own files, so a
checkpoint the Saver lists always has them), prune those directories with the
Saver's ``max_to_keep``, and ``Saver.restore`` load them back. Scripts that
decide whether to load by looking for ``sparse-model-*`` find it.
Checkpoints of earlier versions (rows as tensors in the Saver's files, and
``<prefix>.dynemb`` directories for tables with an SSD tier) still restore.

On several ranks each rank holds a shard of every table, so a checkpoint
directory holds one part per rank, ``<path>/rank-<r>-of-<N>`` (an engine
checkpoint of that rank's keys): ``save_tables`` is then collective (every
rank calls it, and it returns once every rank's part is written), and
``restore_tables`` on M ranks reads every part of a checkpoint written by
any number of ranks, or a one-process checkpoint, keeping the keys each rank
owns (dynemb_key_shard). A Saver checkpoint's dense variables, the same on
every rank, are written once, by rank 0, after every rank's part; every
rank restores them. The ranks must share the checkpoint directory (one host,
or a shared file system). A checkpoint path on one of TensorFlow's file
systems (``hdfs://``, ``s3://``, ...) works too: the tables are staged
locally and copied there (dynemb.core.remote); incremental checkpoints need
a local (or mounted) path.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import threading
from typing import Any, Iterable, Iterator, Optional

import tensorflow as tf

from dynemb import _lib, _state
from dynemb.core import remote
from dynemb.core.tables import EXPORT_FIELDS, TABLE_SAVEABLES
from dynemb.util.log import logger

LEGACY_SUFFIX = ".dynemb"  # <checkpoint prefix>.dynemb: earlier versions' tiered rows
SPARSE_PREFIX = "sparse-"   # <dir>/sparse-<prefix basename>: the tables' rows
_PART = re.compile(r"^rank-(\d+)-of-(\d+)$")  # a rank's part of a checkpoint directory
_LIBC = ctypes.CDLL(None)  # (free() of what the engine allocates for us)
_LIBC.free.argtypes = [ctypes.c_void_p]


def part_dir(path: str, rank: int, size: int) -> str:
    """Rank `rank`'s part of checkpoint directory `path` written by `size` ranks."""
    return os.path.join(path, "rank-%d-of-%d" % (rank, size))


def checkpoint_parts(path: str) -> list[str]:
    """The engine checkpoint directories that make up checkpoint `path`: its
    rank parts (all of them, or a ValueError naming the missing ones), or
    `path` itself when one process wrote it (the engine's rule,
    dynemb_checkpoint_parts, which the command-line tool follows too)."""
    out = ctypes.POINTER(ctypes.c_char_p)()
    n = ctypes.c_size_t()
    try:
        _lib.check(_lib.clib.dynemb_checkpoint_parts(str(path).encode(), ctypes.byref(out),
                                                     ctypes.byref(n)))
    except _lib.DynembError as e:
        raise ValueError(str(e)) from None
    try:
        return [out[i].decode() for i in range(n.value)]
    finally:
        _LIBC.free(ctypes.cast(out, ctypes.c_void_p))


def _all_ranks_ok(channel: int, error: Optional[str], what: str) -> None:
    """Every rank says whether its part of `what` worked; raises on every
    rank if one failed (the first failing rank's error)."""
    w = _state._world()  # pylint: disable=protected-access
    said = w.allgather(channel, (error or "").encode())
    for rank, text in enumerate(said):
        if text:
            raise RuntimeError("dynemb %s: rank %d failed: %s"
                               % (what, rank, text.decode(errors="replace")))


def sparse_dir(prefix: str) -> str:
    """The sparse directory of Saver checkpoint `prefix` (mxRec's layout:
    ``<dir>/model-5`` -> ``<dir>/sparse-model-5``)."""
    if remote.is_remote(prefix):
        d, base = remote.split(prefix)
        return d + "/" + SPARSE_PREFIX + base
    d, base = os.path.split(os.path.normpath(remote.local_path(prefix)))
    return os.path.join(d, SPARSE_PREFIX + base)


def _names(tables: Optional[Iterable[Any]]) -> list[str]:
    if tables is None:
        return sorted(_state.HANDLES)  # the tables of this process
    out = []
    for t in tables:
        name = t if isinstance(t, str) else getattr(t, "table_name", None)
        if not isinstance(name, str):
            raise TypeError("dynemb: tables must be table objects or names, got %r" % (t,))
        out.append(name)
    return out


@contextlib.contextmanager
def _handles(names: list[str], what: str) -> Iterator[list[ctypes.c_void_p]]:
    """References to the tables `names` for the block (all or none)."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(_lib.table_handle(name, _lib.DynembError(
            _lib.ENOTFOUND, "dynemb %s: table '%s' does not exist in this process; create "
            "it with create_table() first" % (what, name)))) for name in names]


def save_tables(path: str, tables: Optional[Iterable[Any]] = None,
                incremental: bool = False) -> list[str]:
    """Saves `tables` (table objects or names; default: every table of this
    process) into checkpoint directory `path` (created if missing; tables it
    already holds and that are not saved again are kept). Returns the names
    saved. Raises DynembError naming the table and the cause. On several
    ranks every rank calls it: each writes its part, and it returns once
    all have (an error on one rank is raised on every rank).

    incremental=True: `path` (a new directory) gets only what changed since
    the previous save of these tables (rows and candidates changed or new,
    and the keys evicted), building on that save's directory, which must be
    kept; the first incremental save of a table is a full one. A full save
    of a table saved incrementally before starts a new chain. Restoring a
    delta follows its chain (restore_tables, Saver.restore, warm start)."""
    names = _names(tables)
    size = _state.get_rank_size()
    path = remote.local_path(path)
    target = part_dir(path, _state.get_rank_id(), size) if size > 1 else path
    error = None
    tracked = incremental or any(n in _state.INCREMENTAL_TABLES for n in names)
    if remote.is_remote(path) and incremental:
        raise ValueError(_remote_incremental("save_tables('%s', incremental=True)" % path))
    try:
        if remote.is_remote(path):  # (staged locally, then copied there)
            with remote.writable(target) as local:
                _write(local, names, False, False, path)
        else:
            _write(target, names, tracked, incremental, path)
    except Exception as e:  # pylint: disable=broad-except
        if size == 1:
            raise
        error = str(e)
    if size > 1:
        _all_ranks_ok(_state.CHECKPOINT_CHANNEL, error, "save_tables('%s')" % path)
    return names


def _remote_incremental(what: str) -> str:
    return ("%s: incremental checkpoints build on the directory of the previous save, "
            "which the engine reads from a local path: save them to a local directory or "
            "a mounted file system (NFS, a FUSE mount of HDFS or S3)" % what)


def _write(target: str, names: list[str], tracked: bool, incremental: bool,
           path: str) -> None:
    """This process's engine checkpoint of `names` into local directory
    `target` (`path`: the checkpoint's name in errors)."""
    with _handles(names, "save_tables") as hs:
        arr = (ctypes.c_void_p * max(len(hs), 1))(*[h.value for h in hs])
        if tracked:
            delta = ctypes.c_int()
            _lib.check(_lib.clib.dynemb_checkpoint_save_incremental(
                str(target).encode(), arr, len(hs), 0 if incremental else 1,
                ctypes.byref(delta)), "save_tables('%s', incremental=%s)"
                % (path, incremental))
            _state.INCREMENTAL_TABLES.update(names)
        else:
            _lib.check(_lib.clib.dynemb_checkpoint_save(str(target).encode(), arr, len(hs)),
                       "save_tables('%s')" % path)


def checkpoint_base(path: str) -> Optional[str]:
    """The directory that incremental checkpoint directory `path` builds on
    (None for a full checkpoint)."""
    out = ctypes.c_void_p()
    _lib.check(_lib.clib.dynemb_checkpoint_base(str(path).encode(), ctypes.byref(out)),
               "checkpoint '%s'" % path)
    if not out.value:
        return None
    try:
        return os.path.normpath(ctypes.string_at(out.value).decode())
    finally:
        _LIBC.free(out)


def chain_dirs(sparse: str) -> set:
    """The sparse directories that Saver checkpoint directory `sparse` (all
    its rank parts) needs: itself and those its incremental parts build
    on, down to full checkpoints."""
    out, pending = set(), [os.path.normpath(sparse)]
    while pending:
        d = pending.pop()
        if d in out or not os.path.isdir(d):
            continue
        out.add(d)
        try:
            parts = checkpoint_parts(d)
        except ValueError:
            continue
        for part in parts:
            base = checkpoint_base(part) if os.path.isfile(
                os.path.join(part, "MANIFEST")) else None
            if base:
                pending.append(os.path.dirname(base) if _PART.match(os.path.basename(base))
                            else base)
    return out


def restore_tables(path: str, tables: Optional[Iterable[Any]] = None,
                   name_map: Optional[dict[str, str]] = None,
                   embedding_only: bool = False) -> list[str]:
    """Replaces the contents of `tables` (default: every table of this
    process) with those saved in checkpoint directory `path`. `name_map`
    maps a table's name to its name in the checkpoint (renamed tables);
    `embedding_only` takes the embeddings and starts the optimizer slots
    afresh (another optimizer). A table that a sparse optimizer trains in
    the tables' graph (table objects; names: the default graph) must have
    been saved with that optimizer's state; any other table takes the
    saved rows whatever optimizer trained them (docs/checkpoint-format.md,
    "Optimizer state on restore"). Each table is verified before it
    changes. Returns the names restored."""
    tables = list(tables) if tables is not None else None
    graphs = {getattr(t, "graph", None) for t in tables or () if not isinstance(t, str)}
    graph = graphs.pop() if len(graphs) == 1 and None not in graphs else \
        tf.compat.v1.get_default_graph()
    return _restore_into(path, _names(tables), name_map, embedding_only, graph)


def _restore_into(path: str, names: list[str], name_map: Optional[dict[str, str]],
                  embedding_only: bool, graph: Any) -> list[str]:
    """restore_tables of `names`, whose optimizers are those `graph` applies."""
    path = remote.local_path(path)
    if remote.is_remote(path):
        with remote.readable(str(path)) as local:
            if not os.path.isdir(local):
                raise ValueError("restore_tables('%s'): no such checkpoint directory" % path)
            try:
                return _restore_into(local, names, name_map, embedding_only, graph)
            except _lib.DynembError as e:  # (named by the remote path)
                raise _lib.DynembError(e.code, str(e).replace(local, path)) from None
            except ValueError as e:
                raise ValueError(str(e).replace(local, path)) from None
    name_map = dict(name_map or {})
    parts = checkpoint_parts(str(path))
    # The optimizer state each table ends with: the saved one, which a
    # table trained in `graph` must have been saved with (checked for every
    # table before any changes); embedding_only: the table's own, fresh.
    trainers = {} if embedding_only else {n: _trainer(n, graph) for n in names}
    if any(trainers.values()):
        saved = _optimizer_kinds(parts[0])
        for name, opt in trainers.items():
            kind = saved.get(name_map.get(name, name))
            if opt is not None and kind is not None:
                _check_same_optimizer(path, name, opt, kind)
    flags = _lib.IMPORT_REPLACE | (_lib.IMPORT_EMBEDDING_ONLY if embedding_only else
                                   _lib.IMPORT_ADOPT_LAYOUT)
    # On M ranks each keeps the keys it owns, from every part; a replicated
    # table (is_dp) takes every key of every part.
    size = _state.get_rank_size()
    with _handles(names, "restore_tables") as hs:
        for name, h in zip(names, hs):
            src = name_map.get(name, name)
            shard = (_state.get_rank_id(), size) if size > 1 and \
                name not in _state.REPLICATED_TABLES else (0, 0)
            for i, part in enumerate(parts):
                _lib.check(_lib.clib.dynemb_checkpoint_load(
                    part.encode(), h, src.encode(),
                    flags if i == 0 else flags & ~_lib.IMPORT_REPLACE, *shard, None),
                    "restore_tables('%s')" % path)
            if trainers.get(name) is not None:  # (its hyper-parameters, whatever
                _rebind(h, trainers[name])        # another graph set meanwhile)
    return names


def _trainer(name: str, graph: Any) -> Any:
    """The sparse optimizer that trains table `name` in `graph` (its apply
    ops update the table's optimizer state), or None."""
    st = _state.existing_graph_state(graph)
    table = st.tables.get(name) if st is not None else None
    return getattr(table, "applied_by", None) if table is not None else None


def _rebind(h: Any, opt: Any) -> None:
    """The table's optimizer is `opt`'s again (same kind: new hyper-parameters)."""
    o = _lib.Optimizer()
    opt._engine_optimizer(o)  # pylint: disable=protected-access
    _lib.check(_lib.clib.dynemb_table_set_optimizer(h, ctypes.byref(o)), "restore_tables")


def _optimizer_kinds(part: str) -> dict:
    """{table name: engine optimizer kind} of checkpoint directory `part`
    (headers only; {} if it cannot be read: the load reports that)."""
    entries = ctypes.POINTER(_lib.CkptEntry)()
    n = ctypes.c_size_t()
    if _lib.clib.dynemb_checkpoint_inspect(part.encode(), ctypes.byref(entries),
                                           ctypes.byref(n)):
        return {}
    try:
        return {entries[i].name.decode(): entries[i].optimizer_kind for i in range(n.value)}
    finally:
        _lib.clib.dynemb_ckpt_entries_free(entries, n)


# The engine's optimizer kinds, and the sparse optimizers that train with each.
_KIND_NAMES = {_lib.OPT_SGD: "sgd", _lib.OPT_ADAGRAD: "adagrad", _lib.OPT_ADAM: "adam",
               _lib.OPT_FTRL: "ftrl", _lib.OPT_ADAMW: "adamw"}
_KIND_OPTIMIZERS = {
    k: "dynemb.optimizers.%s.create_hash_optimizer" % m for k, m in (
        (_lib.OPT_SGD, "gradient_descent"), (_lib.OPT_ADAGRAD, "adagrad"),
        (_lib.OPT_ADAM, "lazy_adam"), (_lib.OPT_FTRL, "ftrl"))}
_KIND_OPTIMIZERS[_lib.OPT_ADAMW] = "dynemb.v2.AdamWOptimizer"  # (the second generation's)


def _check_same_optimizer(path: str, name: str, opt: Any, kind: int) -> None:
    """Raises when the checkpoint's rows of table `name` hold another
    optimizer's state (`kind`) than `opt`, the sparse optimizer that trains
    the table in the restoring graph, updates."""
    mine = getattr(opt, "KIND", None)
    if mine is None:
        with _lib.table_handle(name) as h:
            c = _lib.TableConfig()
            _lib.clib.dynemb_table_get_config(h, ctypes.byref(c))
            mine = c.optimizer.kind
    if mine == kind:
        return
    saved, ours = _KIND_NAMES.get(kind, "kind %d" % kind), _KIND_NAMES.get(mine, str(mine))
    raise _lib.DynembError(_lib.EMISMATCH, (
        "dynemb restore_tables('%s'): table '%s' was trained with %s (its rows in the "
        "checkpoint hold %s state), but this graph trains it with sparse optimizer %s "
        "(%s state). To go on from the saved state, train it with %s again "
        "(%s); to switch to %s, start from the "
        "checkpoint's embeddings with fresh %s state: restore_tables(path, ['%s'], "
        "embedding_only=True), or a warm start (tf.estimator.WarmStartSettings / "
        "dynemb.warm_start). A graph that only reads the table (no optimizer applies "
        "to it) restores the rows whatever optimizer trained them")
        % (path, name, saved, saved, getattr(opt, "name", type(opt).__name__), ours, saved,
           _KIND_OPTIMIZERS.get(kind, saved), ours, ours, name))


# --------------------------------------------------------------------------
# Saver checkpoints
# --------------------------------------------------------------------------

def _saved_tables(graph: tf.Graph) -> list[str]:
    st = _state.existing_graph_state(graph)
    return sorted(t.table_name for t in st.tables.values() if t.is_save) \
        if st is not None else []


def _checkpoint_path(saver: Any, sess: Any, save_path: str, global_step: Any) -> str:
    """The prefix Saver.save will write (its own rule)."""
    if global_step is None:
        return save_path
    if not hasattr(global_step, "__index__"):  # a tensor or variable
        global_step = tf.compat.v1.train.global_step(sess, global_step)
    if getattr(saver, "_pad_step_number", False):
        return "%s-%08d" % (save_path, int(global_step))
    return "%s-%d" % (save_path, int(global_step))


def _pruned(d: str, n: str, base: str, keep: set, join: Any) -> bool:
    """Whether entry `n` of directory `d` is a sparse (or earlier versions'
    <prefix>.dynemb) directory of Saver prefix `base` that may go: one of
    its steps (``<base>-<digits>``, not another prefix that starts alike),
    not kept, and whose checkpoint the Saver has deleted (a checkpoint it
    keeps for keep_checkpoint_every_n_hours keeps its rows)."""
    step = r"(?:-\d+)?"
    if re.fullmatch(re.escape(SPARSE_PREFIX + base) + step, n):
        prefix = n[len(SPARSE_PREFIX):]
    elif re.fullmatch(re.escape(base) + step + re.escape(LEGACY_SUFFIX), n):
        prefix = n[:-len(LEGACY_SUFFIX)]
    else:
        return False
    full = join(d, n)
    return full not in keep and not tf.io.gfile.exists(join(d, prefix) + ".index")


def _prune(saver: Any, save_path: str) -> None:
    """Removes this Saver's sparse directories (and earlier versions'
    <prefix>.dynemb ones) whose checkpoint the Saver has deleted (its
    max_to_keep), but never one that a kept incremental checkpoint builds
    on."""
    if remote.is_remote(save_path):
        keep = {sparse_dir(p) for p in saver.last_checkpoints}  # (no chains there)
        d, base = remote.split(save_path)
        try:
            names = [n.rstrip("/") for n in tf.io.gfile.listdir(d)]
        except tf.errors.OpError:
            return
        for n in names:
            if _pruned(d, n, base, keep, lambda a, b: a + "/" + b) and \
                    tf.io.gfile.isdir(d + "/" + n):
                tf.io.gfile.rmtree(d + "/" + n)
        return
    keep = set().union(*[chain_dirs(sparse_dir(p)) for p in saver.last_checkpoints]) | \
        {os.path.normpath(remote.local_path(p) + LEGACY_SUFFIX) for p in saver.last_checkpoints}
    d, base = os.path.split(os.path.normpath(remote.local_path(save_path)))
    d = d or "."
    try:
        names = os.listdir(d)
    except OSError:
        return
    join = lambda a, b: os.path.normpath(os.path.join(a, b))  # noqa: E731
    for n in names:
        if _pruned(d, n, base, keep, join) and os.path.isdir(join(d, n)):
            shutil.rmtree(join(d, n), ignore_errors=True)


_NOT_SAVED = threading.local()


@contextlib.contextmanager
def tables_not_saved() -> Iterator[None]:
    """Saver.save in this block (on this thread) writes the Saver's own files
    only: a SavedModel builder's save, whose tables are exported otherwise."""
    before = getattr(_NOT_SAVED, "on", False)
    _NOT_SAVED.on = True
    try:
        yield
    finally:
        _NOT_SAVED.on = before


_orig_save = tf.compat.v1.train.Saver.save
_orig_restore = tf.compat.v1.train.Saver.restore


_HOOK_DELTA = threading.local()  # set while CheckpointSaverHook saves a delta


def _save(self, sess, save_path, global_step=None, *args, is_incremental_checkpoint=False,
          save_delta=False, **kwargs):
    """mxRec's keywords: save_delta=True writes the tables' rows changed
    since the previous save (a delta that builds on that save's sparse
    directory, which pruning keeps); is_incremental_checkpoint=True makes a
    full save that the next delta builds on."""
    graph = getattr(sess, "graph", None)  # (any session-like object)
    names = _saved_tables(graph) if graph is not None else []
    if not names or getattr(_NOT_SAVED, "on", False):
        return _orig_save(self, sess, save_path, global_step, *args, **kwargs)
    path = _checkpoint_path(self, sess, save_path, global_step)
    hook = getattr(_HOOK_DELTA, "kind", None)  # "full" / "delta" of the hook's schedule
    save_delta = save_delta or hook == "delta"
    is_incremental_checkpoint = is_incremental_checkpoint or hook is not None
    if (save_delta or is_incremental_checkpoint) and remote.is_remote(path):
        raise ValueError(_remote_incremental("Saver.save('%s')" % path))
    if save_delta or is_incremental_checkpoint:
        # (a delta saved again under the same step replaces its directory)
        if save_delta and os.path.isdir(sparse_dir(path)):
            shutil.rmtree(sparse_dir(path))
        _state.INCREMENTAL_TABLES.update(names)  # (a full save is tracked too)
        save_tables(sparse_dir(path), names, incremental=bool(save_delta))
    else:
        save_tables(sparse_dir(path), names)  # first: a listed checkpoint has its rows
    if _state.get_rank_size() > 1:
        return _save_dense_once(self, sess, save_path, global_step, path, *args, **kwargs)
    out = _orig_save(self, sess, save_path, global_step, *args, **kwargs)
    if out and os.path.normpath(out) != os.path.normpath(path):  # (not expected)
        shutil.rmtree(sparse_dir(out), ignore_errors=True)
        os.rename(sparse_dir(path), sparse_dir(out))
    if out and self._max_to_keep:  # pylint: disable=protected-access
        _prune(self, save_path)
    if out:
        _state.LAST_SAVED_SPARSE_DIR[:] = [sparse_dir(out)]
    return out


def _save_dense_once(saver, sess, save_path, global_step, path, *args, **kwargs):
    """Several ranks: every rank's part of the tables is written; rank 0
    writes the Saver's files (the dense variables, the same on every rank)
    and prunes, and every rank returns once it has."""
    out, error = path, None
    if _state.get_rank_id() == 0:
        try:
            out = _orig_save(saver, sess, save_path, global_step, *args, **kwargs)
            if out and saver._max_to_keep:  # pylint: disable=protected-access
                _prune(saver, save_path)
        except Exception as e:  # pylint: disable=broad-except
            error = "writing the checkpoint's dense variables: %s" % e
    _all_ranks_ok(_state.CHECKPOINT_CHANNEL, error, "Saver.save('%s')" % path)
    if out:
        _state.LAST_SAVED_SPARSE_DIR[:] = [sparse_dir(out)]
    return out


# --------------------------------------------------------------------------
# Export for other systems: keys and embeddings as NumPy files
# --------------------------------------------------------------------------

def _embeddings(fill: Any, what: str) -> tuple:
    """(keys, embeddings) of the snapshot that `fill` (an engine call on a
    snapshot pointer) makes; the snapshot is freed."""
    import numpy as np  # (numpy comes with TensorFlow)
    snap = _lib.Snapshot()
    _lib.check(fill(ctypes.byref(snap)), what)
    try:
        if not snap.rows:
            return np.zeros([0], np.int64), np.zeros([0, snap.dim], np.float32)
        keys = np.ctypeslib.as_array(snap.keys, (snap.rows,)).copy()
        values = np.ctypeslib.as_array(snap.values, (snap.rows, snap.row_floats))
        return keys, values[:, :snap.dim].copy()
    finally:
        _lib.clib.dynemb_snapshot_free(ctypes.byref(snap))


def _write_npy(path: str, tables: dict) -> None:
    """<path>/<table>/keys.npy and embeddings.npy for each table, written to a
    temporary directory first and then moved in place, table by table."""
    import numpy as np
    bad = [n for n in tables if not n or "/" in n or n in (".", "..")]
    if bad:
        raise ValueError("dynemb export: table '%s' cannot be a directory name (a '/' or "
                         "'.' / '..'); nothing was written" % bad[0])
    path = remote.local_path(path)
    if remote.is_remote(path):  # (written locally, then copied there)
        with remote.writable(path) as local:
            _write_npy(local, tables)
        return
    os.makedirs(path, exist_ok=True)
    for name, (keys, emb) in tables.items():
        final = os.path.join(path, name)
        tmp = final + ".tmp-export"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        np.save(os.path.join(tmp, "keys.npy"), keys)
        np.save(os.path.join(tmp, "embeddings.npy"), emb)
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)


def export_tables(path: str, tables: Optional[Iterable[Any]] = None) -> list[str]:
    """Writes the keys and embeddings (no optimizer state) of `tables`
    (default: every table of this process) as NumPy files
    ``<path>/<table>/keys.npy`` (int64 [rows], sorted) and ``embeddings.npy``
    (float32 [rows, dim]), for other systems. Returns the names written."""
    names = _names(tables)
    with _handles(names, "export_tables") as hs:
        out = {name: _embeddings(lambda snap: _lib.clib.dynemb_table_snapshot(h, snap),
                                 "export_tables('%s')" % name)
               for name, h in zip(names, hs)}
    _write_npy(str(path), out)
    return names


def export_checkpoint(ckpt_dir: str, path: str,
                      tables: Optional[Iterable[str]] = None) -> list[str]:
    """export_tables from checkpoint directory `ckpt_dir` (every table in it
    by default; the rows of all its rank parts when several ranks wrote
    it), each table verified before it is written."""
    import numpy as np
    ckpt_dir = remote.local_path(ckpt_dir)
    if remote.is_remote(ckpt_dir):  # (read from a local copy)
        with remote.readable(ckpt_dir) as local:
            return export_checkpoint(local, path, tables)
    names = list(tables) if tables is not None else sorted(_entries(ckpt_dir))
    if not names and not os.path.isdir(ckpt_dir):
        raise ValueError("dynemb export: '%s' is not a checkpoint directory" % ckpt_dir)
    parts = checkpoint_parts(str(ckpt_dir))
    out = {}
    for name in names:
        pieces = [_embeddings(lambda snap, n=name, p=p: _lib.clib.dynemb_checkpoint_read(
            p.encode(), n.encode(), snap), "export of table '%s' from '%s'" % (name, p))
            for p in parts]
        keys = np.concatenate([k for k, _ in pieces])
        emb = np.concatenate([e for _, e in pieces])
        # (each key once: the parts of a replicated table hold it on every rank)
        keys, first = np.unique(keys, return_index=True)
        out[name] = (keys, emb[first])
    _write_npy(str(path), out)
    return names


def _entries(path: str) -> set:
    """Names of the tables in checkpoint directory `path` (none if it is
    not one: no such directory, or no MANIFEST), in all its rank parts.
    A part that is there but cannot be read (a damaged MANIFEST or table
    header) raises DynembError naming the file, never reads as a checkpoint
    without tables."""
    if not os.path.isdir(path):
        return set()
    parts = checkpoint_parts(path)
    if parts != [path]:
        return set().union(*(_entries(p) for p in parts))
    if not os.path.exists(os.path.join(path, "MANIFEST")):
        return set()
    entries = ctypes.POINTER(_lib.CkptEntry)()
    n = ctypes.c_size_t()
    rc = _lib.clib.dynemb_checkpoint_inspect(path.encode(), ctypes.byref(entries),
                                             ctypes.byref(n))
    if rc:
        raise _damaged(path, rc)
    try:
        return {entries[i].name.decode() for i in range(n.value)}
    finally:
        _lib.clib.dynemb_ckpt_entries_free(entries, n)


def _damaged(path: str, rc: int) -> _lib.DynembError:
    """The error of checkpoint directory `path` that inspect failed on with
    `rc`: which file is damaged (its MANIFEST when that alone cannot be
    read, else a table file's header), with the engine's message."""
    msg = (_lib.clib.dynemb_last_error() or b"").decode("utf-8", "replace")
    base = ctypes.c_void_p()
    manifest_ok = _lib.clib.dynemb_checkpoint_base(path.encode(), ctypes.byref(base)) == 0
    if base.value:
        _LIBC.free(base)
    what = ("a table file of checkpoint directory '%s' is damaged" % path if manifest_ok
            else "the MANIFEST of checkpoint directory '%s' ('%s') is damaged"
            % (path, os.path.join(path, "MANIFEST")))
    return _lib.DynembError(rc, "dynemb: %s: %s" % (what, msg))


def _why_no_rows(sparse: str) -> str:
    """Why sparse directory `sparse` gave no rows of a table."""
    if not os.path.isdir(sparse):
        return "is missing"
    if checkpoint_parts(sparse) == [sparse] and \
            not os.path.exists(os.path.join(sparse, "MANIFEST")):
        return ("has no MANIFEST (its save never finished, or the file was removed), so "
                "its table files cannot be read")
    return "lacks the table"


def _restore_error(save_path: str, shown: str, local: str,
                   e: _lib.DynembError) -> _lib.DynembError:
    """Saver.restore's error for tables whose files in `local` (`shown` in
    messages) cannot be read: what is damaged, and what to do."""
    return _lib.DynembError(e.code, (
        "dynemb: Saver.restore('%s') cannot restore the tables: %s. The tables' rows "
        "of this checkpoint are in '%s'; restore that directory from a backup, or "
        "restore an earlier checkpoint of the model (Saver.restore with the prefix of "
        "another step; `dynemb ckpt verify DIR` checks a sparse directory first)")
        % (save_path, re.sub(r"^dynemb:? ", "", str(e).replace(local, shown)).rstrip(". "),
           shown))


def _restore_from_tensors(sess: Any, save_path: str, names: list[str]) -> None:
    """Earlier versions kept a table's rows as tensors in the Saver's files."""
    reader = tf.train.load_checkpoint(save_path)
    saved = {n: {f: reader.get_tensor("dynemb/%s/%s" % (n, f)) for f in EXPORT_FIELDS}
             for n in names}
    trainers = {n: _trainer(n, sess.graph) for n in names}  # (as _restore_into)
    for name, opt in trainers.items():
        if opt is not None:
            _check_same_optimizer(save_path, name, opt, int(saved[name]["meta"][2]))
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        for name in names:
            s.run(_lib.ops.dynemb_import(
                table_name=name, flags=_lib.IMPORT_REPLACE | _lib.IMPORT_ADOPT_LAYOUT,
                **saved[name]))
            if trainers[name] is not None:
                with _lib.table_handle(name) as h:
                    _rebind(h, trainers[name])


def _saves_tables(saver: Any) -> bool:
    """Whether `saver` holds dynemb tables: its default var list (every
    global variable and saveable) or one that names a table's marker."""
    var_list = getattr(saver, "_var_list", None)
    if var_list is None:
        return True
    values = var_list.values() if isinstance(var_list, dict) else var_list
    return any(isinstance(v, TABLE_SAVEABLES) for v in values)


def _versioned(save_path: str) -> str:
    """mxRec's init(is_incremental_checkpoint=True, restore_model_version=V):
    Saver.restore loads the checkpoint of step V next to the one it is
    given (`<dir>/<prefix>-V`), full or incremental."""
    cfg = _state.ConfigInitializer._instance  # pylint: disable=protected-access
    version = cfg.restore_model_version if cfg is not None else None
    if version is None or not cfg.is_incremental_checkpoint or not save_path:
        return save_path
    directory, base = os.path.split(save_path)
    m = re.match(r"^(.*?)(-\d+)?$", base)
    path = os.path.join(directory, "%s-%d" % (m.group(1), version))
    if path != save_path and not tf.io.gfile.exists(path + ".index"):
        step_of = re.compile(re.escape(m.group(1)) + r"-(\d+)\.index")
        have = sorted(int(f.group(1)) for f in (
            step_of.fullmatch(os.path.basename(p)) for p in
            tf.io.gfile.glob(os.path.join(directory, m.group(1) + "-*.index"))) if f)
        raise ValueError("init(restore_model_version=%d): there is no checkpoint '%s' (%s); "
                         "pass one of the saved steps, or leave restore_model_version out "
                         "to load the latest" % (version, path, "saved steps: " + ", ".join(
                             map(str, have)) if have else "no checkpoint of that prefix"))
    if path != save_path:
        logger.info("Saver.restore: loading step %d (init(restore_model_version=%d)) "
                    "instead of '%s'", version, version, save_path)
    return path


def _restore(self, sess, save_path):
    graph = getattr(sess, "graph", None)
    names = _saved_tables(graph) if graph is not None and save_path else []
    if names and _saves_tables(self):  # (a Saver of other variables loads its path)
        save_path = _versioned(save_path)
    out = _orig_restore(self, sess, save_path)
    if not names:
        return out
    sparse, legacy = sparse_dir(save_path), save_path + LEGACY_SUFFIX
    shown = sparse
    with contextlib.ExitStack() as stack:
        if remote.is_remote(sparse):  # (a local copy to read)
            sparse = stack.enter_context(remote.readable(sparse))
        _restore_tables_of(sess, save_path, names, sparse, legacy, shown)
    return out


def _restore_tables_of(sess: Any, save_path: str, names: list[str], sparse: str,
                       legacy: str, shown: str) -> None:
    """Saver.restore's tables from sparse directory `sparse` (local; `shown`
    is its name in messages), the earlier versions' `legacy` one, or the
    Saver's files."""
    try:
        in_sparse, in_legacy = _entries(sparse), _entries(legacy)
    except _lib.DynembError as e:
        raise _restore_error(save_path, shown, sparse, e) from None
    reader = None
    groups: dict[str, list[str]] = {sparse: [], legacy: [], "tensors": []}
    for name in names:
        if name in in_sparse:
            groups[sparse].append(name)
        elif name in in_legacy:
            groups[legacy].append(name)
        else:
            reader = reader or tf.train.load_checkpoint(save_path)
            if not reader.has_tensor("dynemb/%s/keys" % name):
                raise ValueError(
                    "dynemb: checkpoint '%s' has no rows of table '%s': its sparse "
                    "directory '%s' %s; restore the directory, or start from another "
                    "checkpoint" % (save_path, name, shown, _why_no_rows(sparse)))
            groups["tensors"].append(name)
    for d in (sparse, legacy):
        if groups[d]:
            try:
                _restore_into(d, groups[d], None, False, sess.graph)
            except _lib.DynembError as e:
                if e.code not in (_lib.ECORRUPT, _lib.EVERSION, _lib.EIO):
                    raise
                raise _restore_error(save_path, shown if d == sparse else d, d, e) from None
    if groups["tensors"]:
        _restore_from_tensors(sess, save_path, groups["tensors"])


# --------------------------------------------------------------------------
# init(is_incremental_checkpoint=True): CheckpointSaverHook's schedule
# --------------------------------------------------------------------------

_orig_hook_after_run = tf.compat.v1.train.CheckpointSaverHook.after_run
_orig_hook_save = tf.compat.v1.train.CheckpointSaverHook._save  # pylint: disable=protected-access


def _incremental_config() -> Optional[tuple]:
    inst = _state.ConfigInitializer._instance  # pylint: disable=protected-access
    if inst is None or not inst.is_incremental_checkpoint:
        return None
    return inst.save_checkpoint_due_time, inst.save_delta_checkpoints_secs


def _due(hook: Any, now: float) -> Optional[str]:
    """What the hook's schedule asks for now: a full save every
    save_checkpoint_due_time seconds, a delta every
    save_delta_checkpoints_secs (the first save is a full one). On several
    ranks rank 0's clock decides for all (the saves are collective)."""
    full_s, delta_s = _incremental_config()
    last_full = getattr(hook, "_dynemb_last_full", None)
    last_any = getattr(hook, "_dynemb_last_save", None)
    kind = "full" if last_full is None or now - last_full >= full_s else \
        "delta" if now - last_any >= delta_s else None
    if _state.get_rank_size() > 1:
        said = _state._world().allgather(  # pylint: disable=protected-access
            _state.CHECKPOINT_CHANNEL, (kind or "").encode())
        kind = said[0].decode() or None
    return kind


def _hook_after_run(self, run_context, run_values):
    if _incremental_config() is None:
        return _orig_hook_after_run(self, run_context, run_values)
    import time
    now = time.time()
    kind = _due(self, now)
    if kind is None:
        return None
    step = run_context.session.run(self._global_step_tensor)  # pylint: disable=protected-access
    self._timer.update_last_triggered_step(step)  # pylint: disable=protected-access
    self._dynemb_last_save = now
    if kind == "full":
        self._dynemb_last_full = now
    _HOOK_DELTA.kind = kind
    try:
        if self._save(run_context.session, step):  # pylint: disable=protected-access
            run_context.request_stop()
    finally:
        _HOOK_DELTA.kind = None
    return None


def _hook_save(self, session, step):
    """The hook's first and last saves (after_create_session, end) are full
    ones in incremental mode, and start or end the schedule."""
    if _incremental_config() is not None and getattr(_HOOK_DELTA, "kind", None) is None:
        import time
        self._dynemb_last_full = self._dynemb_last_save = time.time()
        _HOOK_DELTA.kind = "full"
        try:
            return _orig_hook_save(self, session, step)
        finally:
            _HOOK_DELTA.kind = None
    return _orig_hook_save(self, session, step)


def patch_saver() -> None:
    """Installs dynemb's table handling in tf.compat.v1.train.Saver
    (idempotent; a Saver of a graph without tables is unchanged), and the
    schedule of init(is_incremental_checkpoint=True) in CheckpointSaverHook
    (without it the hook is unchanged)."""
    tf.compat.v1.train.Saver.save = _save
    tf.compat.v1.train.Saver.restore = _restore
    tf.compat.v1.train.CheckpointSaverHook.after_run = _hook_after_run
    tf.compat.v1.train.CheckpointSaverHook._save = _hook_save  # pylint: disable=protected-access
