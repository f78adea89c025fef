"""Custom warm start (mxRec: 定制Warm Start), compatible with
``tf.estimator.WarmStartSettings``.

A warm start initializes a new model from the checkpoints of others. Dense
variables follow TensorFlow's own rules (``tf.compat.v1.train.warm_start`` is
called for them, path by path); dynemb tables are handled here: each selected
table's rows are read from the checkpoint (the ``dynemb/<table>/*`` tensors the
Saver wrote) with ``RestoreV2`` and loaded into the table by ``DynembImport``
when the model is *initialized* -- exactly when TensorFlow's warm-started
variables take their checkpoint values, never when a session restores its own
checkpoint.

Settings, single path (as TensorFlow)::

    WarmStartSettings("ckpt_dir_or_prefix", vars_to_warm_start=".*" | "user_table" |
                      ["user_table", "dense/.*"], var_name_to_prev_var_name={...})

or one entry per path (mxRec's multi-path form; later paths override earlier
ones for the tables and variables they select)::

    WarmStartSettings(["p1", "p2", "p3"], [".*", ["user_table", "item_table"], "mlp/w"],
                      var_name_to_prev_var_name=[{}, {"item_table": "items"}, {}])

How the selection reads for tables (``select``): a string that is the name of a
table of the model selects that table only; any other string is a regular
expression that must match a table's whole name (``re.fullmatch``) and is also
passed to TensorFlow for the dense variables (TensorFlow matches a prefix); a
list applies that rule to each entry (entries may also be table objects or
their ``.variable``). A selected table must be in the checkpoint; its name
there is ``var_name_to_prev_var_name.get(name, name)``.

What a warm-started table holds: the checkpoint's ids and embeddings, fresh
optimizer slots and step count (as TensorFlow warm-starts trainable variables,
not optimizer slots), no admission candidates, and last-access stamps set to the
table's clock at initialization (the global step's initial value, or the wall
clock; data-time tables keep the checkpoint's stamps).

Where it runs: the import is chained to the global step's initializer (or, in a
graph without one, the first global variable's), so every initializer that
starts a model -- ``Scaffold``'s ``init_op`` in Estimator / MonitoredSession,
``global_variables_initializer()`` in sess.run scripts -- runs it, before any
input pipeline starts. ``warm_start()`` also returns the op.

``import dynemb`` installs ``warm_start`` as ``tf.compat.v1.train.warm_start``
(the function Estimator calls with its ``warm_start_from`` settings), so
``tf.estimator.Estimator(..., warm_start_from=WarmStartSettings(...))`` works
unchanged, in the single-path and in the list form.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import tensorflow as tf
from tensorflow.python.training import warm_starting_util

from dynemb import _lib, _state
from dynemb.constants.constants import ASCEND_TIMESTAMP
from dynemb.core import lookup, remote
from dynemb.core.checkpoint import LEGACY_SUFFIX, checkpoint_parts, sparse_dir
from dynemb.core.tables import EXPORT_FIELDS, EmbeddingTable, op_name
from dynemb.util.log import logger

# TensorFlow's own warm start (dense variables), kept before patching.
_TF_WARM_START = warm_starting_util.warm_start

_FIELD_DTYPES = {"meta": tf.int64, "keys": tf.int64, "values": tf.float32,
                 "last_access": tf.int64, "cand_keys": tf.int64, "cand_counts": tf.int64,
                 "cand_last_access": tf.int64, "apply_steps": tf.int64}


class WarmStartError(ValueError):
    """The warm-start settings cannot be applied; the message says why and the fix."""


@dataclass
class _Entry:
    """One checkpoint path of the settings, resolved."""
    given: str            # the path as the user wrote it
    prefix: str           # the checkpoint prefix to read
    vars_to_warm_start: Any
    vocab_info: Dict[str, Any]
    prev_names: Dict[str, str]
    ckpt_tables: Dict[str, Tuple[int, ...]] = field(default_factory=dict)  # name -> meta
    ckpt_tiered: Set[str] = field(default_factory=set)  # rows in the sparse directory


@dataclass
class _TableSource:
    entry: _Entry
    prev_name: str


# --------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------

def _is_settings(obj: Any) -> bool:
    return hasattr(obj, "ckpt_to_initialize_from") and hasattr(obj, "vars_to_warm_start")


def _per_path(value: Any, n: int, what: str, kind: type) -> List[Any]:
    """`value` as one item per path: a list/tuple of n items, or (for dicts and
    None) the same value for every path."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise WarmStartError(
                f"warm start: ckpt_to_initialize_from lists {n} paths but {what} has "
                f"{len(value)} entries; give one entry per path (in the same order)")
        return list(value)
    if value is None or isinstance(value, kind):
        return [value] * n
    raise WarmStartError(f"warm start: with several checkpoint paths, {what} must be a "
                         f"list with one entry per path, got {type(value).__name__}")


def _resolve_path(path: Any) -> str:
    if isinstance(path, bytes):
        path = path.decode()
    if not isinstance(path, str) or not path:
        raise WarmStartError(f"warm start: a checkpoint path must be a non-empty string, "
                             f"got {path!r}")
    if tf.io.gfile.isdir(path):
        prefix = tf.train.latest_checkpoint(path)
        if not prefix:
            raise WarmStartError(f"warm start: directory '{path}' holds no checkpoint (no "
                                 f"'checkpoint' state file); pass a model_dir that has one, "
                                 f"or a checkpoint prefix like '{path}/model.ckpt-100'")
        return prefix
    if not tf.io.gfile.exists(path + ".index"):
        raise WarmStartError(f"warm start: no checkpoint at '{path}' (neither a directory "
                             f"nor a prefix with '{os.path.basename(path)}.index')")
    return path


def _entries(ckpt: Any, vars_to_warm_start: Any, vocab_info: Any,
             prev_names: Any) -> List[_Entry]:
    if isinstance(ckpt, (list, tuple)):
        if not ckpt:
            raise WarmStartError("warm start: ckpt_to_initialize_from is an empty list")
        n = len(ckpt)
        vars_list = (list(vars_to_warm_start) if isinstance(vars_to_warm_start, (list, tuple))
                     else [vars_to_warm_start] * n)
        if len(vars_list) != n:
            raise WarmStartError(
                f"warm start: ckpt_to_initialize_from lists {n} paths but vars_to_warm_start "
                f"has {len(vars_list)} entries; with several paths, vars_to_warm_start is a "
                f"list with one entry per path (a regex, a table name or a list of names)")
        vocab_list = _per_path(vocab_info, n, "var_name_to_vocab_info", dict)
        prev_list = _per_path(prev_names, n, "var_name_to_prev_var_name", dict)
        raw = list(zip(ckpt, vars_list, vocab_list, prev_list))
    else:
        if isinstance(prev_names, (list, tuple)) or isinstance(vocab_info, (list, tuple)):
            raise WarmStartError("warm start: var_name_to_prev_var_name / "
                                 "var_name_to_vocab_info are lists but "
                                 "ckpt_to_initialize_from is a single path; give a list of "
                                 "paths too (one entry per path)")
        raw = [(ckpt, vars_to_warm_start, vocab_info, prev_names)]
    out = []
    for path, v, vocab, prev in raw:
        for what, d in (("var_name_to_vocab_info", vocab), ("var_name_to_prev_var_name", prev)):
            if d is not None and not isinstance(d, dict):
                raise WarmStartError(f"warm start: {what} for '{path}' must be a dict, got "
                                     f"{type(d).__name__}")
        e = _Entry(given=str(path), prefix=_resolve_path(path), vars_to_warm_start=v,
                   vocab_info=dict(vocab or {}), prev_names=dict(prev or {}))
        e.ckpt_tables, e.ckpt_tiered = _checkpoint_tables(e.prefix)
        out.append(e)
    return out


def _checkpoint_tables(prefix: str) -> Tuple[Dict[str, Tuple[int, ...]], Set[str]]:
    """Tables saved in a checkpoint: name -> meta (dim, row_floats, optimizer;
    only dim for tables with an SSD tier), and the names of those whose rows
    are in the checkpoint's sparse directory (or an earlier version's
    <prefix>.dynemb) rather than in tensors beside their meta."""
    try:
        reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as e:
        raise WarmStartError(f"warm start: cannot read checkpoint '{prefix}': {e}") from None
    out, tiered = {}, set()
    for name in reader.get_variable_to_shape_map():
        if name.startswith("dynemb/") and name.endswith("/meta"):
            table = name[len("dynemb/"):-len("/meta")]
            out[table] = tuple(int(x) for x in reader.get_tensor(name))
            if not reader.has_tensor("dynemb/%s/keys" % table):
                tiered.add(table)  # a marker: the rows are in the sparse directory
        elif name.startswith("dynemb/") and name.endswith("/tiered"):
            table = name[len("dynemb/"):-len("/tiered")]
            out[table] = tuple(int(x) for x in reader.get_tensor(name))
            tiered.add(table)
    return out, tiered


# --------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------

def _split_selection(entry: _Entry, tables: Dict[str, EmbeddingTable],
                     anchors: Dict[str, EmbeddingTable]) -> Tuple[List[str], Any]:
    """(tables selected, what to pass to TensorFlow for dense variables or None)."""
    spec = entry.vars_to_warm_start
    if spec is None:
        spec = ".*"  # TensorFlow: None selects every trainable variable
    items = list(spec) if isinstance(spec, (list, tuple)) else [spec]
    chosen: List[str] = []
    dense_str: List[str] = []
    dense_vars: List[Any] = []
    for item in items:
        if isinstance(item, EmbeddingTable):
            chosen.append(item.table_name)
        elif isinstance(item, tf.Tensor) and item.name in anchors:
            chosen.append(anchors[item.name].table_name)
        elif isinstance(item, (tf.Variable,)) or type(item).__name__.endswith("Variable"):
            dense_vars.append(item)
        elif isinstance(item, str):
            if item in tables:  # a table's name selects that table only
                chosen.append(item)
                continue
            try:
                rx = re.compile(item)
            except re.error as e:
                raise WarmStartError(f"warm start: vars_to_warm_start entry {item!r} (checkpoint "
                                     f"'{entry.given}') is not a table name of the model nor a "
                                     f"valid regular expression: {e}") from None
            hits = [t for t in tables if rx.fullmatch(t)]
            # TensorFlow: a string looks at trainable variables, a list at all.
            listed = isinstance(spec, (list, tuple))
            scope = (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES if listed
                     else tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
            if not hits and not tf.compat.v1.get_collection(scope, scope=item):
                raise WarmStartError(
                    f"warm start: vars_to_warm_start entry {item!r} (checkpoint "
                    f"'{entry.given}') matches no table and no "
                    f"{'' if listed else 'trainable '}variable of the model; tables of the "
                    f"model: {sorted(tables)}")
            chosen.extend(hits)
            dense_str.append(item)
        else:
            raise WarmStartError(
                f"warm start: vars_to_warm_start entries must be regular expressions, table "
                f"names, tables or variables; got {type(item).__name__} (checkpoint "
                f"'{entry.given}')")
    if dense_vars:  # TensorFlow wants all strings or all variables
        for s in dense_str:
            dense_vars.extend(tf.compat.v1.get_collection(
                tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, scope=s))
        dense: Any = dense_vars
    elif not dense_str:
        dense = None
    elif isinstance(spec, (list, tuple)):
        dense = dense_str
    else:
        dense = dense_str[0]
    return list(dict.fromkeys(chosen)), dense


def _check_in_checkpoint(entry: _Entry, table: EmbeddingTable, prev: str) -> None:
    if prev not in entry.ckpt_tables:
        renamed = f" (looked up as '{prev}', from var_name_to_prev_var_name)" \
            if prev != table.table_name else ""
        raise WarmStartError(
            f"warm start: table '{table.table_name}'{renamed} is not in checkpoint "
            f"'{entry.prefix}'; tables there: {sorted(entry.ckpt_tables) or 'none'}. Select "
            f"only tables that checkpoint holds, or map the name with "
            f"var_name_to_prev_var_name={{'{table.table_name}': '<name in checkpoint>'}}")
    dim = entry.ckpt_tables[prev][0]
    if dim != table.dim:
        raise WarmStartError(
            f"warm start: table '{table.table_name}' has dim {table.dim} but table '{prev}' in "
            f"checkpoint '{entry.prefix}' has dim {dim}; warm-start only tables of the same dim")


# --------------------------------------------------------------------------
# Ops
# --------------------------------------------------------------------------

def _stamp(table: EmbeddingTable, graph: tf.Graph) -> Optional[tf.Tensor]:
    """Last-access stamp for warm-started rows (None: keep the checkpoint's)."""
    if graph.get_collection(ASCEND_TIMESTAMP):
        return None  # data time: the checkpoint's stamps are in the same unit
    cfg = _state.graph_state(graph).evict_configs.get(table.table_name) or {}
    if cfg.get("eviction_clock") == "wall":
        return lookup.wall_time()  # (a module attribute: tests replace it)
    gs = tf.compat.v1.train.get_global_step(graph)
    if gs is not None and getattr(gs, "initial_value", None) is not None:
        return tf.cast(gs.initial_value, tf.int64)
    return tf.constant(0, tf.int64)


def _rows_dir(prefix: str) -> str:
    """Where a Saver checkpoint keeps its tables' rows: its sparse directory,
    or an earlier version's <prefix>.dynemb."""
    d = sparse_dir(prefix)
    if remote.is_remote(d):  # (TensorFlow's file systems: a local mirror)
        return remote.mirror(d)
    return d if os.path.isdir(d) else prefix + LEGACY_SUFFIX


def _import_op(table: EmbeddingTable, src: _TableSource, graph: tf.Graph) -> tf.Operation:
    names = [f"dynemb/{src.prev_name}/{f}" for f in EXPORT_FIELDS]
    scope = op_name(table.table_name) + "_warm_start"
    flags = _lib.IMPORT_REPLACE | _lib.IMPORT_EMBEDDING_ONLY | _lib.IMPORT_KEEP_STEPS
    # On several ranks each rank keeps the keys it owns (of a checkpoint
    # written by any number of ranks: every part is read).
    size = _state.get_rank_size()
    shard = {"shard_index": _state.get_rank_id(), "shard_count": size} \
        if size > 1 and table.table_name not in _state.REPLICATED_TABLES else {}
    if src.prev_name in src.entry.ckpt_tiered:  # rows in the engine's files, streamed
        with tf.name_scope(scope):
            stamp = _stamp(table, graph)
            loads: List[tf.Operation] = []
            for i, part in enumerate(checkpoint_parts(_rows_dir(src.entry.prefix))):
                with tf.control_dependencies(loads[-1:]):  # the first one replaces
                    loads.append(_lib.ops.dynemb_load_checkpoint(
                        stamp=tf.constant(-1, tf.int64) if stamp is None else stamp,
                        table_name=table.table_name, dir=part, source_name=src.prev_name,
                        flags=flags if i == 0 else flags & ~_lib.IMPORT_REPLACE,
                        rows_only=True, **shard).op)
            return loads[-1]
    with tf.name_scope(scope):
        with tf.device("/cpu:0"):
            got = tf.raw_ops.RestoreV2(prefix=src.entry.prefix, tensor_names=names,
                                       shape_and_slices=[""] * len(names),
                                       dtypes=[_FIELD_DTYPES[f] for f in EXPORT_FIELDS])
        t = dict(zip(EXPORT_FIELDS, got))
        stamp = _stamp(table, graph)
        last = t["last_access"] if stamp is None else tf.fill(tf.shape(t["keys"]), stamp)
        empty = tf.zeros([0], tf.int64)
        return _lib.ops.dynemb_import(
            table_name=table.table_name, flags=flags, meta=t["meta"], keys=t["keys"],
            values=t["values"], last_access=last, cand_keys=empty, cand_counts=empty,
            cand_last_access=empty, apply_steps=t["apply_steps"], **shard).op


def _attach_to_initializer(graph: tf.Graph, op: tf.Operation) -> Optional[str]:
    """Chains `op` to the global step's initializer (else the first global
    variable's); returns the variable's name, or None when the graph has none."""
    var = tf.compat.v1.train.get_global_step(graph)
    if var is None:
        gv = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        var = gv[0] if gv else None
    if var is None or not hasattr(var, "_initializer_op"):
        return None
    with graph.as_default(), graph.name_scope(None):
        var._initializer_op = tf.group(var._initializer_op, op,  # pylint: disable=protected-access
                                       name="dynemb_warm_start_init")
    return var.op.name


def warm_start(ckpt_to_initialize_from: Any, vars_to_warm_start: Any = ".*",
               var_name_to_vocab_info: Any = None, var_name_to_prev_var_name: Any = None,
               *, sess: Optional[tf.compat.v1.Session] = None) -> tf.Operation:
    """Warm-starts the default graph's dense variables (TensorFlow's rules) and
    dynemb tables from one checkpoint or a list of them (see the module doc).

    The first argument may also be a ``tf.estimator.WarmStartSettings`` or a
    checkpoint path. Call it after the model is built (tables created) and before
    the variables' initializer runs: the warm start is part of initialization.
    Returns an op that performs it (tables and warm-started dense variables);
    with ``sess``, runs that op now (e.g. ``dynemb.warm_start(settings, sess=sess)``
    after ``sess.run(global_variables_initializer())`` and before the input
    pipeline's initializer).
    """
    if _is_settings(ckpt_to_initialize_from):
        s = ckpt_to_initialize_from
        ckpt_to_initialize_from = s.ckpt_to_initialize_from
        vars_to_warm_start = s.vars_to_warm_start
        var_name_to_vocab_info, var_name_to_prev_var_name = (s.var_name_to_vocab_info,
                                                             s.var_name_to_prev_var_name)
    graph = sess.graph if sess is not None else tf.compat.v1.get_default_graph()
    with graph.as_default():
        op, attached = _build(graph, ckpt_to_initialize_from, vars_to_warm_start,
                              var_name_to_vocab_info, var_name_to_prev_var_name)
    if not attached and sess is None:
        logger.warning("warm start: the graph has no global variable whose initializer "
                       "could load the tables; run the op dynemb.warm_start() returned")
    if sess is not None:
        sess.run(op)
    return op


def _build(graph: tf.Graph, ckpt: Any, vars_to_warm_start: Any, vocab_info: Any,
           prev_names: Any) -> Tuple[tf.Operation, bool]:
    """Builds the warm start; returns (op doing all of it, whether the table
    imports were chained to a variable's initializer)."""
    entries = _entries(ckpt, vars_to_warm_start, vocab_info, prev_names)
    st = _state.graph_state(graph)
    tables, anchors = dict(st.tables), dict(st.anchors)
    dense_vars = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    before = {id(v): v.initializer for v in dense_vars}
    sources: Dict[str, _TableSource] = {}
    for e in entries:
        chosen, dense = _split_selection(e, tables, anchors)
        bad_vocab = sorted(k for k in e.vocab_info if k in tables)
        if bad_vocab:
            raise WarmStartError(f"warm start: var_name_to_vocab_info names table "
                                 f"'{bad_vocab[0]}'; vocabulary remapping does not apply to "
                                 f"dynemb tables (their ids are not vocabulary indices)")
        dense_prev = {k: v for k, v in e.prev_names.items() if k not in tables}
        for name in chosen:
            prev = e.prev_names.get(name, name)
            _check_in_checkpoint(e, tables[name], prev)
            sources[name] = _TableSource(e, prev)  # later paths override earlier ones
        if dense is not None:
            _TF_WARM_START(e.prefix, dense, e.vocab_info or None, dense_prev or None)
        elif dense_prev or e.vocab_info:
            k = sorted(dense_prev or e.vocab_info)[0]
            raise WarmStartError(
                f"warm start: '{k}' in var_name_to_prev_var_name / var_name_to_vocab_info "
                f"(checkpoint '{e.given}') is not a table of the model and no dense variable "
                f"is warm-started from that checkpoint")
        logger.info("warm start from '%s': tables %s%s", e.prefix, chosen,
                    ", dense %r (TensorFlow's rules)" % (dense,) if dense is not None else "")
    imports = [_import_op(tables[n], src, graph) for n, src in sorted(sources.items())]
    dense_inits = [v.initializer for v in dense_vars if v.initializer is not before[id(v)]]
    with graph.name_scope(None):
        op = tf.group(*imports, *dense_inits, name="dynemb_warm_start")
    attached = not imports or _attach_to_initializer(graph, tf.group(*imports)) is not None
    return op, attached


# --------------------------------------------------------------------------
# TensorFlow integration
# --------------------------------------------------------------------------

def _tf_warm_start(ckpt_to_initialize_from: Any, vars_to_warm_start: Any = ".*",
                   var_name_to_vocab_info: Any = None,
                   var_name_to_prev_var_name: Any = None) -> None:
    """tf.compat.v1.train.warm_start with dynemb tables and lists of paths."""
    graph = tf.compat.v1.get_default_graph()
    simple = (not isinstance(ckpt_to_initialize_from, (list, tuple))
              and not _state.graph_state(graph).tables)
    if simple:  # no tables, one path: TensorFlow's own function, untouched
        _TF_WARM_START(ckpt_to_initialize_from, vars_to_warm_start, var_name_to_vocab_info,
                       var_name_to_prev_var_name)
        return
    _, attached = _build(graph, ckpt_to_initialize_from, vars_to_warm_start,
                         var_name_to_vocab_info, var_name_to_prev_var_name)
    if not attached:
        raise WarmStartError(
            "warm start: the graph has dynemb tables but no variable whose initializer could "
            "load them; create the global step (tf.compat.v1.train.get_or_create_global_step())"
            " or call dynemb.warm_start(...) and run the op it returns")


def patch_tensorflow() -> None:
    """Installs the dynemb-aware warm start as tf.compat.v1.train.warm_start
    (which Estimator calls for its warm_start_from settings). Idempotent."""
    if getattr(tf.compat.v1.train, "warm_start", None) is not _tf_warm_start:
        tf.compat.v1.train.warm_start = _tf_warm_start
