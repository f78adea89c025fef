"""get_asc_insert_func: the input-pipeline half of FeatureSpec mode.

Builds the ``Dataset.map`` function of FeatureSpec mode: for each spec it sends
the batch's ids to the engine with ``DynembPrepare`` (train: admission counting,
row insertion, last-access stamps; in tf.data's threads, ahead of the step) and
adds to the batch, under reserved keys, the per-id ``admitted`` mask and
admission tickets (see dynemb.graph.rewrite for their meaning).

mxRec's path for it is ``dynemb.core.asc.helper``.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, Sequence, Union

import numpy as np
import tensorflow as tf

from dynemb import _state
from dynemb.core.asc.spec import FeatureSpec, admitted_key, stamp_key, tickets_key
from dynemb.graph import rewrite
from dynemb.graph.modification import dump_dir
from dynemb.util.log import logger


def _outermost_graph(graph: tf.Graph) -> tf.Graph:
    while getattr(graph, "outer_graph", None) is not None:
        graph = graph.outer_graph
    return graph


def _pipeline_clock(specs: Sequence[FeatureSpec], features: Dict[str, Any]) -> tf.Tensor:
    """Data time if a spec is the timestamp, else the global step (resource
    variable, read in the pipeline), else 0 when no spec evicts."""
    stamps = [s for s in specs if s.is_timestamp]
    if stamps:
        ts = features[stamps[0].index_key]
        return tf.reduce_max(tf.cast(ts, tf.int64))
    evicting = [s.name for s in specs if s.eviction_threshold is not None]
    outer = _outermost_graph(tf.compat.v1.get_default_graph())
    gs = tf.compat.v1.train.get_global_step(outer)
    if gs is None and evicting:  # the step counts eviction: make it, as Estimator does
        with outer.as_default():
            gs = tf.compat.v1.train.get_or_create_global_step()
    if gs is not None and isinstance(gs, tf.Variable) and gs.op.type == "VarHandleOp":
        return rewrite.read_by_name(gs)  # (a one-shot iterator captures no variable)
    if evicting:
        raise ValueError(
            f"get_asc_insert_func: FeatureSpec {evicting[0]!r} has an eviction_threshold but "
            f"the pipeline has no clock; add FeatureSpec('timestamp', is_timestamp=True) for "
            f"data time, or create the global step (as a resource variable) with "
            f"tf.compat.v1.train.get_or_create_global_step() before building the dataset")
    return tf.constant(0, tf.int64)


def _by_positions(args_index_list: Any, table_names: Any, feature_counts: Any,
                  is_training: bool) -> Callable:
    """mxRec's other form: the elements' components at `args_index_list`
    (positions in the element flattened as tf.nest flattens it: tuples in
    order, dict values by sorted key) are the ids of the tables
    `table_names`, looked up by tensor lookups (``sparse_lookup(table,
    ids)``; mxRec's automatic graph modification builds this form from
    them). dynemb's tensor lookups do that table work themselves (in the
    step, or ahead of it in the pipeline with modify_graph=True), so the
    function checks its arguments against the elements and passes them on
    unchanged (as tf.data calls it: an element that is a 1-tuple comes back
    as its one tensor)."""
    what = "get_asc_insert_func(args_index_list=...)"

    def as_list(v: Any) -> list:
        return [v] if isinstance(v, (int, str, np.integer)) else list(v)

    try:
        given = as_list(args_index_list)
        positions = [operator.index(i) for i in given if not isinstance(i, bool)]
    except TypeError:
        given, positions = [None], []
    if not positions or len(positions) != len(given) or min(positions) < 0:
        raise ValueError(f"{what}: args_index_list must be positions (ints >= 0) of the "
                         f"elements' id tensors, got {args_index_list!r}")
    names = as_list(table_names) if table_names is not None else []
    if len(names) != len(positions) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{what}: table_names must name one table per position of "
                         f"args_index_list ({len(positions)}), got {table_names!r}")
    if feature_counts is not None and len(as_list(feature_counts)) != len(positions):
        raise ValueError(f"{what}: feature_counts must have one count per position, got "
                         f"{feature_counts!r}")

    def insert_fn(*args: Any) -> Any:
        comps = tf.nest.flatten(args)
        for i, n in zip(positions, names):
            if i >= len(comps):
                raise ValueError(f"{what}: position {i} (table '{n}') is beyond the "
                                 f"elements' {len(comps)} components")
            ids = comps[i]
            if not tf.is_tensor(ids) or ids.dtype not in (tf.int32, tf.int64):
                raise TypeError(f"{what}: component {i} (table '{n}') must be an int32 or "
                                f"int64 tensor of ids, got {getattr(ids, 'dtype', type(ids))}")
        return args[0] if len(args) == 1 else args

    # (the tables may not exist yet: Estimator calls input_fn before model_fn)
    logger.info("%s: %s positions %s are the ids of tables %s; dynemb's lookups of them "
                "count, insert and read in the step, or ahead of it with modify_graph=True",
                what, "train pipeline:" if is_training else "eval pipeline:", positions, names)
    return insert_fn


def get_asc_insert_func(tgt_key_specs: Union[FeatureSpec, Sequence[FeatureSpec], None] = None,
                        args_index_list: Any = None, table_names: Any = None, *,
                        feature_counts: Any = None, is_training: bool = True,
                        dump_graph: Union[bool, str] = False, **kwargs: Any) -> Callable:
    """The function to ``dataset.map`` (after batching) in FeatureSpec mode.

    Elements must be a dict of features, a tuple whose first item is that dict
    (e.g. ``(features, label)``), or a tuple of tensors; each spec's ids are
    ``features[spec.index_key]`` (for a tuple of tensors ``element[index_key]``,
    an int position; int32/int64, any shape). is_training=False (eval pipelines) sends nothing to
    the engine: every id reads its row if it has one. dump_graph writes the
    function's graph as text (``$DYNEMB_GRAPH_DUMP_DIR`` or ./dynemb_graph_dump,
    or the directory given).
    """
    if kwargs:  # (mxRec: undocumented keywords are not used)
        logger.warning("get_asc_insert_func: keywords %s are not used by dynemb (the "
                       "documented ones are tgt_key_specs, is_training and dump_graph)",
                       sorted(kwargs))
    if (tgt_key_specs is None) == (args_index_list is None):
        raise ValueError(
            "get_asc_insert_func: pass either tgt_key_specs (FeatureSpec mode) or "
            "args_index_list with table_names (the ids' positions in the elements and "
            "their tables); got %s" % ("both" if tgt_key_specs is not None else "neither"))
    if args_index_list is not None:
        return _by_positions(args_index_list, table_names, feature_counts, bool(is_training))
    if table_names is not None or feature_counts is not None:
        raise ValueError("get_asc_insert_func: table_names and feature_counts go with "
                         "args_index_list, not with tgt_key_specs")
    specs = [tgt_key_specs] if isinstance(tgt_key_specs, FeatureSpec) else list(tgt_key_specs)
    for s in specs:
        if not isinstance(s, FeatureSpec):
            raise TypeError(f"get_asc_insert_func: tgt_key_specs must hold FeatureSpec "
                            f"objects, got {type(s).__name__}")
    if len({id(s) for s in specs}) != len(specs):
        raise ValueError("get_asc_insert_func: a FeatureSpec object is given twice; make one "
                         "FeatureSpec per lookup (several may share a name)")
    # Several FeatureSpecs of one name (several lookups of the same feature)
    # get names of their own, as mxRec makes them: the k-th repeat is
    # "<name>_<k>"; each still reads the feature's batch key. The script looks
    # its tables up with these same FeatureSpec objects.
    seen: Dict[str, int] = {}
    for s in specs:
        k = seen.get(s.name, 0)
        seen[s.name] = k + 1
        if k:
            s.rename(f"{s.name}_{k}")
    if sum(s.is_timestamp for s in specs) > 1:
        raise ValueError("get_asc_insert_func: at most one FeatureSpec may be the timestamp")
    id_specs = [s for s in specs if not s.is_timestamp]
    stamp = [s for s in specs if s.is_timestamp]
    for s in id_specs:  # lookups then know that their table counts data time
        s.timestamp_key = stamp[0].index_key if stamp else None
    is_training = bool(is_training)
    # On several ranks the lookups exchange with the rows' owners in the step
    # (start_asc_pipeline leaves them plain): nothing is prepared here.
    prepares = is_training and _state.get_rank_size() == 1

    def insert_fn(*args: Any) -> Any:
        data = args[0] if len(args) == 1 else tuple(args)
        positional = False
        if isinstance(data, dict):
            features, rest = dict(data), None
        elif isinstance(data, (tuple, list)) and data and isinstance(data[0], dict):
            features, rest = dict(data[0]), tuple(data[1:])
        elif isinstance(data, (tuple, list)) and data:
            # A tuple of tensors: FeatureSpecs name positions (index_key=0, 1, ...);
            # the reserved components follow as a dict at the end.
            features, rest, positional = dict(enumerate(data)), None, True
        else:
            raise TypeError("get_asc_insert_func: dataset elements must be a dict of "
                            "features, a tuple (features dict, ...) or a tuple of "
                            f"tensors, got {type(data).__name__}")
        for s in specs:
            if positional and not isinstance(s.index_key, int):
                raise KeyError(f"get_asc_insert_func: the elements are a tuple of "
                               f"{len(data)} tensors; FeatureSpec('{s.name}') must name a "
                               f"position (index_key=0..{len(data) - 1}), not "
                               f"{s.index_key!r}")
            if s.index_key not in features:
                raise KeyError(f"get_asc_insert_func: FeatureSpec('{s.name}') reads batch key "
                               f"{s.index_key!r}, which the elements lack (keys: "
                               f"{sorted(map(str, features))})")
        now = _pipeline_clock(specs, features) if prepares else None
        previous: Dict[str, tf.Tensor] = {}
        for s in id_specs:
            ids = tf.convert_to_tensor(features[s.index_key])
            if ids.dtype not in (tf.int32, tf.int64):
                raise TypeError(f"FeatureSpec('{s.name}'): ids must be int32 or int64, got "
                                f"{ids.dtype.name}; cast them in the dataset")
            checks = []
            if s.batch_size:
                checks.append(tf.debugging.assert_equal(
                    tf.shape(ids)[0], s.batch_size,
                    message=f"FeatureSpec('{s.name}'): batch_size"))
            if not prepares:
                features[admitted_key(s.name)] = tf.ones_like(ids, dtype=tf.bool)
                continue
            deps = checks + ([previous[s.table_name]] if s.table_name in previous else [])
            with tf.control_dependencies(deps):  # a table's ids are counted in order
                tickets = rewrite.prepare(s.table_name, ids, now, s.faae_coefficient)
            previous[s.table_name] = tickets
            features[admitted_key(s.name)] = rewrite.admitted_of(tickets)
            features[tickets_key(s.name)] = tickets  # the step's lookup and apply use them
            features[stamp_key(s.name)] = tf.cast(now, tf.int64)  # (EvictHook's clock)
        if dump_graph:
            graph = tf.compat.v1.get_default_graph()
            path = tf.io.write_graph(graph.as_graph_def(), dump_dir(dump_graph),
                                     f"asc_insert_{'train' if is_training else 'eval'}.pbtxt")
            logger.info("get_asc_insert_func: insert function graph written to %s", path)
        if positional:
            reserved = {k: v for k, v in features.items() if isinstance(k, str)}
            return tuple(data) + (reserved,)
        if rest is None:
            return features
        return (features,) + rest

    return insert_fn
