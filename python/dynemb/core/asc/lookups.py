"""FeatureSpec lookups and start_asc_pipeline.

In FeatureSpec mode the input pipeline already sent each batch's ids to the
engine (get_asc_insert_func, dynemb.core.asc.insert). ``sparse_lookup(table,
spec, batch=batch)`` gets its ids from here (`lookup_ids`): a guarded copy of
the spec's batch component, remembered with the batch's prepared components.
``start_asc_pipeline()``, called once the model and train op are built and
before the first step, switches every such lookup of the default graph to those
components, exactly as automatic graph modification does for its lookups
(dynemb.graph.rewrite): the lookup only reads, ids not admitted as of their
batch read the default value, and their gradients are dropped. On several
ranks nothing is prepared ahead: the lookups stay plain ones that exchange
with the rows' owners in the step, and start_asc_pipeline drops their guards.

mxRec's path for start_asc_pipeline is ``dynemb.core.asc.manager``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import tensorflow as tf

from dynemb import _state
from dynemb.constants.constants import ASCEND_TIMESTAMP
from dynemb.core.asc.spec import (RESERVED_PREFIX, FeatureSpec, admitted_key, stamp_key,
                                  tickets_key)
from dynemb.core.tables import op_name, set_thresholds
from dynemb.graph import rewrite
from dynemb.graph.pipeline import delete_sessions_at_exit
from dynemb.graph.rewrite import GraphModificationError
from dynemb.util.log import logger

_HOW = ("call dynemb.core.asc.manager.start_asc_pipeline() after building the model and "
        "train op and before the first session.run (Estimator: GraphModifierHook("
        "modify_graph=False))")


def _reserved(d: Any) -> bool:
    return isinstance(d, dict) and bool(d) and all(
        isinstance(k, str) and k.startswith(RESERVED_PREFIX) for k in d)


def batch_features(batch: Any, spec: FeatureSpec) -> Dict[Any, Any]:
    """The features of a get_next() result: its dict (a dict, or a tuple led
    by one), or for a tuple of tensors (ended by the insert function's dict
    of reserved components) the tensors by position with those components."""
    if isinstance(batch, dict):
        return batch
    if isinstance(batch, (tuple, list)) and batch and isinstance(batch[0], dict) \
            and not _reserved(batch[0]):
        return batch[0]
    if isinstance(batch, (tuple, list)) and len(batch) > 1 and _reserved(batch[-1]):
        return dict(enumerate(batch[:-1]), **batch[-1])
    raise ValueError(
        f"sparse_lookup with FeatureSpec('{spec.name}') needs batch=iterator.get_next() "
        f"(the dict of features, a tuple whose first item is that dict, or the tuple "
        f"of tensors get_asc_insert_func mapped), got {type(batch).__name__}")


def lookup_ids(spec: FeatureSpec, batch: Any, table: Any) -> tf.Tensor:
    """The ids tensor a ``sparse_lookup(table, spec, batch=batch)`` looks up.

    Called by sparse_lookup for FeatureSpec input. The returned tensor is
    registered with the spec's reserved components and guarded: running it
    fails with a message until start_asc_pipeline() has switched its lookup to
    the prepared components.
    """
    table_name = getattr(table, "table_name", None)
    if spec.is_timestamp:
        raise ValueError(f"sparse_lookup: FeatureSpec('{spec.name}') is the timestamp "
                         f"feature; it has no table to look up")
    if spec.table_name != table_name:
        raise ValueError(f"sparse_lookup('{table_name}'): FeatureSpec('{spec.name}') "
                         f"feeds table '{spec.table_name}', not '{table_name}'")
    features = batch_features(batch, spec)
    missing = [k for k in (spec.index_key, admitted_key(spec.name)) if k not in features]
    if missing:
        raise ValueError(
            f"sparse_lookup('{table_name}', FeatureSpec('{spec.name}')): the batch has no "
            f"{missing[0]!r}; map the dataset with get_asc_insert_func(tgt_key_specs=[...]) "
            f"including this spec, and pass batch=iterator.get_next()")
    return register_lookup_ids(spec, features, table)


def _set_thresholds(graph: tf.Graph, spec: FeatureSpec) -> None:
    cfg = spec.access_and_evict_config
    if cfg is None:
        return
    prev = _state.graph_state(graph).evict_configs.get(spec.table_name)
    keys = ("access_threshold", "eviction_threshold")
    if prev is not None and any(prev.get(k) != cfg[k] for k in keys):
        raise ValueError(
            f"FeatureSpec('{spec.name}'): access_threshold={cfg['access_threshold']}, "
            f"eviction_threshold={cfg['eviction_threshold']}, but another FeatureSpec of "
            f"table '{spec.table_name}' has access_threshold={prev.get('access_threshold')}, "
            f"eviction_threshold={prev.get('eviction_threshold')}; a table has one admission "
            f"and eviction setting: give its FeatureSpecs the same thresholds (each may "
            f"weigh its sightings by its own faae_coefficient)")
    set_thresholds(spec.table_name, cfg["access_threshold"], cfg["eviction_threshold"],
                   f"FeatureSpec('{spec.name}')",
                   ValueError(f"FeatureSpec('{spec.name}'): table '{spec.table_name}' is not "
                              f"registered; create it with create_table() first"))
    # EvictHook reads the graph's eviction settings from here.
    _state.graph_state(graph).evict_configs[spec.table_name] = dict(
        cfg, eviction_clock="step")


def register_lookup_ids(spec: FeatureSpec, features: Dict[str, Any], table: Any) -> tf.Tensor:
    """A guarded copy of the spec's ids, remembered with its prepared components."""
    graph = tf.compat.v1.get_default_graph()
    raw = tf.convert_to_tensor(features[spec.index_key])
    if raw.graph is not graph:
        raise GraphModificationError(
            f"sparse_lookup('{spec.table_name}', FeatureSpec('{spec.name}')): the batch "
            f"belongs to another graph than the default graph")
    tickets = features.get(tickets_key(spec.name))
    stamp = features.get(stamp_key(spec.name))
    _set_thresholds(graph, spec)
    ts_key = getattr(spec, "timestamp_key", None)
    if ts_key is not None and ts_key in features:
        # The table counts data time: publish the batch's timestamp where the
        # rest of dynemb (EvictHook) looks for it.
        ts = tf.convert_to_tensor(features[ts_key])
        if all(t is not ts for t in graph.get_collection(ASCEND_TIMESTAMP)):
            graph.add_to_collection(ASCEND_TIMESTAMP, ts)
    with graph.name_scope(None), tf.name_scope(rewrite.GUARD_MARK):
        check = tf.debugging.Assert(
            tf.constant(False),
            [f"dynemb: FeatureSpec('{spec.name}') lookups are not started: {_HOW}"])
    with tf.control_dependencies([check]):
        ids = tf.identity(raw, name=f"{op_name(spec.name)}_ids")
    _state.feature_spec_state(graph).by_ids[ids.name] = _state.FeatureSpecLookup(
        spec=spec, ids=ids,
        tickets=None if tickets is None else tf.convert_to_tensor(tickets),
        training=tickets is not None,
        stamp=None if stamp is None else tf.convert_to_tensor(stamp))
    return ids


def _find(st: _state.FeatureSpecState, ids: tf.Tensor) -> Optional[_state.FeatureSpecLookup]:
    """The FeatureSpec entry `ids` was derived from (through sparse_lookup's
    Identity / EnsureShape), if any."""
    t = ids
    for _ in range(8):
        if t.name in st.by_ids:
            return st.by_ids[t.name]
        if t.op.type not in ("Identity", "EnsureShape") or not t.op.inputs:
            return None
        t = t.op.inputs[0]
    return None


def start_asc_pipeline() -> None:
    """Switches the default graph's FeatureSpec lookups to their prepared batch
    components (see the module docstring). Calling it again handles only lookups
    added since."""
    graph = tf.compat.v1.get_default_graph()
    if graph.finalized:
        raise GraphModificationError(
            "start_asc_pipeline: the default graph is finalized; call it before creating "
            "the session (Estimator: GraphModifierHook(modify_graph=False))")
    st = _state.feature_spec_state(graph)
    found: List[tuple] = []
    for r in _state.graph_state(graph).lookups:
        if r["op"].name in st.done:
            continue
        entry = _find(st, r["ids"])
        if entry is not None:
            found.append((r, entry))
    if _state.get_rank_size() > 1:  # the lookups stay plain (dynemb.core.asc.insert)
        for r, e in found:
            rewrite.drop_guard(e.ids.op)
            st.done.add(r["op"].name)
        logger.info("start_asc_pipeline on %d ranks: %d FeatureSpec lookup(s) exchange with "
                    "the rows' owners in the step", _state.get_rank_size(), len(found))
        return
    if any(e.training for _, e in found):  # (its insert function prepares ahead)
        delete_sessions_at_exit(graph)
    train_tables = {e.spec.table_name for r, e in found if r["is_train"]}
    for r in _state.graph_state(graph).lookups:
        t = r["table"].table_name
        if r["is_train"] and t in train_tables and _find(st, r["ids"]) is None \
                and not r.get("modify_graph"):
            raise GraphModificationError(
                f"table '{t}' has train lookups with FeatureSpec and with an ids tensor "
                f"(plain lookup '{r['op'].name}'); give all train lookups of a table the "
                f"same mode")
    for r, e in found:
        if r["is_train"] and not e.training:
            raise GraphModificationError(
                f"train lookup '{r['op'].name}' reads FeatureSpec('{e.spec.name}') from a "
                f"pipeline built with get_asc_insert_func(is_training=False); use "
                f"is_training=True for training pipelines, or sparse_lookup(..., "
                f"is_train=False)")
    train: Dict[str, List[tuple]] = {}  # table -> [(lookup op, FeatureSpecLookup)]
    for r, e in found:
        rewrite.drop_guard(e.ids.op)
        if r["is_train"]:
            rewrite.rewrite_lookup(r["op"], e.tickets, e.spec.table_name, r["table"].dim,
                                   stamp=e.stamp)
            train.setdefault(e.spec.table_name, []).append((r["op"], e))
        st.done.add(r["op"].name)
    # The apply op reads admission tickets when it takes exactly these lookups'
    # gradients (dynemb.graph.rewrite); else the trainable keys filter, whose
    # keys are then computed in the step from the batch's ids and tickets.
    trainable: Dict[str, List[tf.Tensor]] = {}
    for table, pairs in train.items():
        plan = rewrite.plan_ticket_apply(graph, table, [op for op, _ in pairs])
        if plan is not None:
            rewrite.ticket_apply(plan, {op.name: e.tickets for op, e in pairs})
            continue
        with graph.as_default(), graph.name_scope(None), \
                tf.name_scope(f"dynemb_trainable_{table}"):
            trainable[table] = [rewrite.trainable_keys(
                [e.ids for _, e in pairs], [rewrite.admitted_of(e.tickets) for _, e in pairs])]
    for table, keys in trainable.items():
        if not rewrite.filter_applies(graph, table, keys):
            logger.warning("start_asc_pipeline: table '%s' has no apply op yet; build the "
                           "train op before calling start_asc_pipeline()", table)
    logger.info("start_asc_pipeline: %d FeatureSpec lookup(s) started", len(found))
