"""Lookups of dynamic tables, and the gradient that trains them.

``sparse_lookup`` builds one DynembLookup op per call: train lookups insert
new ids (subject to admission) and stamp their access time, eval lookups only
read. The op's gradient with respect to the table's anchor is an
IndexedSlices of the ids and the rows' gradients, which the sparse
optimizers (dynemb.optimizers) turn into DynembApply ops. Lookups of the two
prepared modes (``modify_graph=True``, FeatureSpec input) are recorded in the
graph's state and rewritten later (dynemb.graph.modification,
dynemb.core.asc.lookups).

mxRec's path for these is ``dynemb.core.embedding``.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np
import tensorflow as tf

from dynemb import _lib, _state
from dynemb.core import exchange
from dynemb.constants.constants import (ASCEND_SPARSE_LOOKUP_ID_OFFSET,
                                        ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
                                        ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS, ASCEND_TIMESTAMP,
                                        MAX_ACCESS_THRESHOLD)
from dynemb.core.asc.lookups import lookup_ids
from dynemb.core.asc.spec import FeatureSpec
from dynemb.core.tables import (EmbeddingTable, constant_default_value, engine_default_value,
                                no_longer_registered, op_name, require_graph_mode,
                                set_default_value, set_thresholds)
from dynemb.graph.rewrite import guard_lookup, input_of
from dynemb.graph.trace import GET_NEXT_TYPES, ancestors
from dynemb.util.log import logger


def unused_input(dtype: tf.DType) -> tf.Tensor:
    """An empty vector of unknown static length, for op inputs that only a
    graph rewrite fills in (any 1-D tensor can replace it)."""
    return tf.compat.v1.placeholder_with_default(tf.zeros([0], dtype), shape=[None])


@tf.RegisterGradient("DynembLookup")
@tf.RegisterGradient("DynembShardedLookup")
def _lookup_grad(op: tf.Operation, grad: Any, *_has_row: Any) -> list:
    """d(loss)/d(anchor) as IndexedSlices(values=d(loss)/d(rows), indices=ids)."""
    keys = tf.reshape(input_of(op, "ids"), [-1])
    if keys.dtype != tf.int64:
        keys = tf.cast(keys, tf.int64)
    # The gradient may not depend on the lookup's output (d sum(x)/dx is a
    # constant when shapes are static): order it after the lookup, so that
    # the step's apply never updates a row before the step has read it.
    with tf.control_dependencies([op.outputs[0]]):
        values = tf.identity(tf.convert_to_tensor(grad))
    grads: list = [None] * len(op.inputs)
    grads[[a.name for a in op.op_def.input_arg].index("anchor")] = \
        tf.IndexedSlices(values, keys)
    return grads


_EVICT_KEYS = ("access_threshold", "eviction_threshold", "faae_coefficient",
               "eviction_clock")


def _check_evict_config(table: EmbeddingTable, cfg: Optional[dict]) -> Optional[dict]:
    if cfg is None:
        return None
    if not isinstance(cfg, dict):
        raise TypeError("sparse_lookup('%s'): access_and_evict_config must be a dict "
                        "like {'access_threshold': 2, 'eviction_threshold': 100}"
                        % table.table_name)
    bad = sorted(set(cfg) - set(_EVICT_KEYS))
    if bad:
        raise ValueError("sparse_lookup('%s'): unknown access_and_evict_config keys %s; "
                         "known: %s" % (table.table_name, bad, list(_EVICT_KEYS)))
    # mxRec: None (the default) and -1 are off; an access_threshold of 0
    # admits without counting (a count of 0 reaches it): at once; an
    # eviction_threshold of 0 evicts what is not accessed at the eviction's
    # time (dynemb keeps None for off).
    given = {k: cfg.get(k) for k in _EVICT_KEYS}
    out = {"access_threshold": 0 if given["access_threshold"] in (None, -1)
           else given["access_threshold"],
           "eviction_threshold": None if given["eviction_threshold"] in (None, -1)
           else given["eviction_threshold"],
           "faae_coefficient": _state.check_faae(
               "sparse_lookup('%s')" % table.table_name,
               1 if given["faae_coefficient"] is None else given["faae_coefficient"]),
           "eviction_clock": given["eviction_clock"] or "step"}
    for k in ("access_threshold", "eviction_threshold"):
        v = out[k]
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (
                v > (MAX_ACCESS_THRESHOLD if k == "access_threshold" else 2**63 - 1)):
            raise ValueError("sparse_lookup('%s'): access_and_evict_config['%s'] must be an "
                             "int in [0, %s], got %r"
                             % (table.table_name, k, "2^31-1" if k == "access_threshold"
                                else "2^63-1", v))
    if out["eviction_clock"] not in ("step", "wall"):
        raise ValueError("sparse_lookup('%s'): eviction_clock must be 'step' (global "
                         "steps) or 'wall' (seconds)" % table.table_name)
    return out


def wall_time() -> tf.Tensor:
    """The wall clock (int64 seconds) stamped by lookups of 'wall' tables; a
    module-level function so that tests can replace it here, in
    dynemb.core.lookup (EvictHook's `clock` is the matching Python side)."""
    return tf.cast(tf.timestamp(), tf.int64)


def _iterators_of(t: tf.Tensor) -> set:
    """Names of the iterator ``get_next`` ops in `t`'s data ancestry."""
    return {op.name for op in ancestors([t.op], lambda o: o.type in GET_NEXT_TYPES)
            if op.type in GET_NEXT_TYPES}


def _batch_timestamp(ids: tf.Tensor) -> Optional[tf.Tensor]:
    """The ASCEND_TIMESTAMP tensor of the batch `ids` come from: the one read
    from the same iterator. Never another iterator's: a train lookup that read
    the timestamp of another pipeline would pull a batch from it on every
    step. Ids that come from no iterator (fed, constants) take the latest
    timestamp registered."""
    stamps = tf.compat.v1.get_collection(ASCEND_TIMESTAMP)
    if not stamps:
        return None
    sources = _iterators_of(ids)
    if not sources:
        return stamps[-1]
    for ts in reversed(stamps):
        if _iterators_of(tf.convert_to_tensor(ts)) & sources:
            return ts
    logger.warning("sparse_lookup: the ids come from iterator %s, but no timestamp in "
                   "the ASCEND_TIMESTAMP collection does; this lookup stamps the global "
                   "step (or wall time) instead of data time. Add the batch's timestamp "
                   "with tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, ...)",
                   ", ".join(sorted(sources)))
    return None


def _now_tensor(evict_cfg: Optional[dict], ids: tf.Tensor, is_train: bool) -> tf.Tensor:
    """The clock stamped on accessed rows: data time (the batch's
    ASCEND_TIMESTAMP), wall seconds, or the global step (0 without one, when
    not evicting). Eval lookups stamp nothing, so they read no clock: a clock
    computed from another batch would make every eval step consume it."""
    if not is_train:
        return tf.constant(0, tf.int64)
    ts = _batch_timestamp(ids)
    if ts is not None:
        return tf.reduce_max(tf.cast(ts, tf.int64))
    if evict_cfg and evict_cfg["eviction_clock"] == "wall":
        return wall_time()
    gs = tf.compat.v1.train.get_global_step()
    if gs is None and evict_cfg and evict_cfg["eviction_threshold"] is not None:
        gs = tf.compat.v1.train.get_or_create_global_step()
    if gs is None:
        return tf.constant(0, tf.int64)
    return tf.cast(tf.identity(gs), tf.int64)


_MXREC_LOOKUP_KWARGS = ("dim", "feature_spec_name_ids_dict", "lookup_ids", "multi_lookup")


def _dim_of(dim: Any) -> Any:
    if isinstance(dim, tf.TensorShape):
        return dim[0] if dim.rank == 1 else dim
    return dim


def sparse_lookup(hashtable: EmbeddingTable, ids: Any, send_count: Optional[int] = None,
                  is_train: bool = True, name: Optional[str] = None,
                  modify_graph: bool = False, batch: Any = None,
                  access_and_evict_config: Optional[dict] = None, is_grad: bool = True,
                  serving_default_value: Any = None, **kwargs: Any) -> tf.Tensor:
    """Looks up `ids` (int32/int64 tensor of any shape) -> ids.shape + [dim].

    is_train: train lookups insert new ids (subject to admission) and stamp
    their access time; eval lookups read unknown ids as the default value.
    send_count: mxRec's capacity of the ids a lookup sends, in static-shape
    mode (init(use_dynamic=False)): at least the batch's unique ids (checked
    at run time); not used with dynamic shapes.
    access_and_evict_config: {'access_threshold': n, 'eviction_threshold': t}
    (dynemb also takes 'eviction_clock': 'step' (default) or 'wall').
    is_grad=False: no gradient flows to the table from this lookup.
    modify_graph=True: the lookup is recorded for automatic graph
    modification (dynemb.graph.modifier); it fails with a message naming the
    fix until modify_graph_and_start_emb_cache() or GraphModifierHook ran.
    Admission order: the pipeline modes count a table's ids in the order of
    the lookups in the model; plain train lookups of one table that run in
    parallel count ids they share in TensorFlow's scheduling order.
    ids may also be a FeatureSpec, with batch=iterator.get_next().
    mxRec's keywords dim (must be the table's), multi_lookup (several
    lookups of a table always work), feature_spec_name_ids_dict and
    lookup_ids (mxRec-internal) are accepted; others raise TypeError.
    """
    unknown = sorted(set(kwargs) - set(_MXREC_LOOKUP_KWARGS))
    if unknown:
        raise TypeError("sparse_lookup: unexpected arguments %s (mxRec's are %s)"
                        % (unknown, ", ".join(_MXREC_LOOKUP_KWARGS)))
    if not isinstance(hashtable, EmbeddingTable):
        raise TypeError("sparse_lookup: hashtable must be a table from create_table(), "
                        "got %s" % type(hashtable).__name__)
    tname = hashtable.table_name
    if kwargs.get("dim") is not None and _dim_of(kwargs["dim"]) != hashtable.dim:
        raise ValueError("sparse_lookup('%s'): dim = %r, but the table's dim is %d; drop "
                         "dim or pass the table's" % (tname, kwargs["dim"], hashtable.dim))
    _state.require_init("sparse_lookup('%s')" % tname)
    require_graph_mode("sparse_lookup('%s')" % tname)
    graph = tf.compat.v1.get_default_graph()
    if hashtable.graph is not graph:
        raise ValueError("sparse_lookup('%s'): the table was created in another graph; "
                         "call create_table() again inside this graph (same arguments "
                         "reuse the table)" % tname)
    # mxRec: serving_default_value is the lookup's own; ids without a row of a
    # lookup without one read zeros. The engine's default row (shared by the
    # table's graphs) serves the first constant value while no lookup reads
    # the table without a value of its own; any other value, or zeros where
    # the engine's default is not, is the lookup's own (read through tf.where).
    per_lookup_default = None
    engine_default = engine_default_value(hashtable)
    if serving_default_value is not None:
        numbers = constant_default_value(serving_default_value, tname)
        dim = hashtable.dim
        same = numbers is not None and numbers.size in (1, dim) and np.array_equal(
            np.broadcast_to(numbers.reshape(-1), [dim]), engine_default)
        if numbers is not None and not same and (
                numbers.size not in (1, dim) or
                (not engine_default.any() and tname not in _state.DEFAULT_READERS)):
            set_default_value(hashtable, numbers)  # the table's own (or its size error)
        elif not same:  # batch-computed, or other numbers than the table's
            per_lookup_default = serving_default_value
        elif not engine_default.any():  # explicit zeros read the engine's zeros
            _state.DEFAULT_READERS.add(tname)
    elif engine_default.any():  # another lookup's numbers are the engine's
        per_lookup_default = tf.constant(0.0)
    else:
        _state.DEFAULT_READERS.add(tname)
    from_spec = isinstance(ids, FeatureSpec)
    # The sightings one occurrence of these ids counts for admission (mxRec's
    # faae_coefficient: features sharing a table may weigh differently).
    weight = ids.faae_coefficient if from_spec else 1
    if from_spec:
        # Explicit FeatureSpec mode: the spec's ids come from `batch` (the
        # dataset mapped by get_asc_insert_func); dynemb.core.asc sets the
        # spec's thresholds and later switches the lookup to its pipeline.
        ids = lookup_ids(ids, batch, hashtable)
    ids = tf.convert_to_tensor(ids)
    if ids.dtype not in (tf.int32, tf.int64):
        raise TypeError("sparse_lookup('%s'): ids must be int32 or int64, got %s; convert "
                        "them with tf.cast(ids, tf.int64) (float ids are not exact above "
                        "2^24)" % (tname, ids.dtype.name))
    evict_cfg = _check_evict_config(hashtable, access_and_evict_config)
    st = _state.graph_state(graph)
    if evict_cfg is not None:
        if not from_spec:  # (a FeatureSpec's ids weigh its own coefficient)
            weight = evict_cfg["faae_coefficient"]
        prev = st.evict_configs.get(tname)
        # (each lookup weighs its own sightings: only the rest must agree)
        shared = ("access_threshold", "eviction_threshold", "eviction_clock")
        if prev is not None and any(prev.get(k) != evict_cfg[k] for k in shared):
            raise ValueError("sparse_lookup('%s'): access_and_evict_config %s differs from "
                             "the one of an earlier lookup of this table (%s); give every "
                             "lookup of a table the same thresholds (only "
                             "faae_coefficient may differ)" % (tname, evict_cfg, prev))
        st.evict_configs[tname] = evict_cfg
        hashtable.access_and_evict_config = evict_cfg
        # (the engine's own eviction 0 is off: EvictHook passes 0 explicitly)
        set_thresholds(tname, evict_cfg["access_threshold"],
                       evict_cfg["eviction_threshold"], "sparse_lookup('%s')" % tname,
                       no_longer_registered(tname))
    dim = hashtable.dim
    with tf.name_scope(name or op_name(tname) + "_lookup"):
        static_count, has_row = 0, None
        own_default = per_lookup_default is not None
        if send_count is not None:
            ids, static_count = _check_send_count(ids, send_count, tname)
        now = _now_tensor(evict_cfg, ids, bool(is_train))
        # Plain train lookups of one table that TensorFlow runs in parallel
        # count shared ids for admission in scheduling order; the pipeline
        # modes (modify_graph, FeatureSpec) count them in model order.
        # `tickets` is used only when a pipeline mode sets use_tickets.
        if exchange.several_ranks():
            # Each id is looked up at the rank that owns it; the lookups of
            # a step run in one order on every rank (core/exchange.py).
            chain = exchange.TRAIN_CHAIN if is_train else (
                "eval",) + tuple(sorted(_iterators_of(ids)))
            emb = exchange.sharded_lookup(tname, ids, now, hashtable.anchor,
                                          bool(is_train), chain, static_count,
                                          hashtable.is_dp, weight, found=own_default)
            if own_default:  # (and which ids read a row)
                emb, has_row = emb
        else:
            # With a default of its own the lookup also says which ids read
            # a row (one pass; in the prepared modes, its batch's tickets).
            emb, has_row = _lib.ops.dynemb_lookup(
                ids=ids, now=now, anchor=hashtable.anchor, tickets=unused_input(tf.int64),
                table_name=tname, is_train=bool(is_train), faae_coefficient=weight,
                found=own_default)
        emb.set_shape([ids.shape.num_elements(), dim])
        lookup_op = emb.op
        if not (is_train and is_grad):
            emb = tf.stop_gradient(emb)
        elif _state.get_use_dynamic_expansion():
            _publish_by_address(graph, st, hashtable, ids, emb)
        found = None
        if per_lookup_default is not None:
            emb, found = _with_default(emb, per_lookup_default, hashtable, has_row)
        if ids.shape.rank == 1:
            # A new tensor, so graph modification can mask the op's output
            # for every consumer (fetches included).
            out = tf.identity(emb)
        else:
            out = tf.reshape(emb, tf.concat([tf.shape(ids, out_type=tf.int32), [dim]], 0))
        out.set_shape(ids.shape.concatenate([dim]))
    if modify_graph:
        # Fails at run time until modify_graph_and_start_emb_cache() or
        # GraphModifierHook rewrites the lookup, instead of silently
        # training in plain mode.
        guard_lookup(lookup_op, tname, "with an Estimator, add GraphModifierHook() to the "
                     "hooks of estimator.train/evaluate/predict (or of the TrainSpec and "
                     "EvalSpec of train_and_evaluate); in a sess.run script, call "
                     "modify_graph_and_start_emb_cache() before creating the session")
    st.lookups.append({"table": hashtable, "ids": ids, "output": out,
                       "op": lookup_op, "is_train": bool(is_train),
                       "modify_graph": bool(modify_graph), "send_count": send_count,
                       "found": found})
    return out


def _with_default(rows: tf.Tensor, value: Any, table: EmbeddingTable,
                  has_row: tf.Tensor) -> tuple:
    """A lookup's own serving_default_value (a tensor the graph computes,
    numbers other than the engine's default row, or zeros where that row is
    not): rows [n, dim] with the ids that have no row (not admitted,
    unknown) reading `value` (a scalar, [dim], [n, dim] or ids' shape +
    [dim]) instead. `has_row` [n]: the lookup op's own output (the prepared
    modes switch a train lookup's to its batch's admission tickets, exactly
    what its rows follow). Returns (rows, that bool [n])."""
    dim = table.dim
    value = tf.cast(tf.convert_to_tensor(value), tf.float32)
    n = tf.shape(rows)[0]
    if value.shape.rank is not None and value.shape.rank <= 1:
        value = tf.broadcast_to(value, tf.stack([n, dim]))
    else:
        value = tf.reshape(value, tf.stack([n, dim]), name="serving_default_value")
    found = tf.identity(has_row, name="has_row")
    return tf.where(tf.expand_dims(found, 1), rows, value), found


def _publish_by_address(graph: tf.Graph, st: Any, table: EmbeddingTable, ids: tf.Tensor,
                        rows: tf.Tensor) -> None:
    """mxRec's by-address training path (dynamic expansion): the looked-up
    rows go into ASCEND_SPARSE_LOOKUP_LOCAL_EMB and their "address" (here the
    lookup's int64 ids, one per row) into ASCEND_SPARSE_LOOKUP_ID_OFFSET and
    _UNIQUE_KEYS, in the same order, so that a script's
    apply_gradients(zip(tf.gradients(loss, rows), addresses)) with a ByAddr
    optimizer trains the table (dynemb.optimizers.*_by_addr)."""
    address = tf.reshape(tf.cast(ids, tf.int64), [-1], name="address")
    st.addresses[address.name] = (table, rows)
    graph.add_to_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB, rows)
    graph.add_to_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET, address)
    graph.add_to_collection(ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS, address)


def _check_send_count(ids: tf.Tensor, send_count: Any, tname: str) -> tuple:
    """mxRec's send_count: in static-shape mode (init(use_dynamic=False)) the
    capacity of the ids a lookup sends to each owner, i.e. at least the
    unique ids of the batch that go to one rank (all of them on one
    process); with dynamic shapes it is not used. Returns `ids` (checked at
    run time against the capacity in static-shape mode on one process) and
    the capacity the sharded lookup checks per owner on several ranks (0:
    none)."""
    if isinstance(send_count, bool) or not isinstance(send_count, int) or \
            not 1 <= send_count <= 2**31 - 1:
        raise ValueError("sparse_lookup('%s'): send_count must be an int in [1, 2^31-1], "
                         "got %r" % (tname, send_count))
    if _state.require_init("sparse_lookup('%s')" % tname).get("use_dynamic", True):
        return ids, 0
    if exchange.several_ranks():
        return ids, send_count
    unique = tf.size(tf.unique(tf.reshape(ids, [-1]))[0])
    check = tf.debugging.Assert(
        unique <= send_count,
        ["sparse_lookup(%s): send_count = %d is below the number of unique ids of this "
         "batch, which is" % (tname, send_count), unique,
         "; raise send_count to at least that (static-shape mode, "
         "init(use_dynamic=False))"])
    with tf.control_dependencies([check]):
        return tf.identity(ids), 0
