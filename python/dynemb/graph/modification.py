"""Automatic graph modification: rebuilding input pipelines for lookups.

The user builds an ordinary TensorFlow graph: a tf.data iterator, lookups with
``sparse_lookup(..., modify_graph=True)``, a train op. Then, before the first
``session.run``, ``modify_graph_and_start_emb_cache()`` (or ``GraphModifierHook``
with an Estimator):

1. traces every such lookup's ids back to the iterator's ``get_next`` op,
   through whatever the graph computes on the way (casts, reshapes, arithmetic,
   slicing, hashing: see dynemb.graph.trace);
2. rebuilds each train iterator's pipeline as ``dataset.map(prepare).prefetch(2)``
   where ``prepare`` recomputes those ids and sends them to the engine
   (``DynembPrepare``: admission counting, row insertion, last-access stamps) in
   tf.data's threads, ahead of the step, and appends the per-id admission
   tickets (-1 where not admitted, else where the id's row is) to the element
   (dynemb.graph.pipeline), plus the batch's trainable keys for tables whose
   apply op is not a plain function of their lookups' gradients;
3. rewires the graph: every consumer of the old ``get_next`` reads the new one,
   lookups become read-only and read rows through the tickets, apply ops drop
   gradients of ids that were not admitted as of their batch and find rows
   through the tickets too (dynemb.graph.rewrite).

``get_initializer(True/False)`` then returns the train/eval pipelines'
initializers; running the iterator's own initializer works too (it is chained).
Only the current default graph is supported, as in mxRec.

On several ranks (an MPI launch) the lookups exchange their ids with the
rows' owners inside the step (dynemb.core.exchange), so nothing is sent
ahead: the modification checks the lookups as on one process, drops their
guards and registers the unchanged iterators, whose initializers
``get_initializer`` returns. The training is the same; the pipeline that
prepares batches ahead is one process's only, for now.

mxRec's path for these is ``dynemb.graph.modifier``.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

import tensorflow as tf

from dynemb import _state
from dynemb.core.asc.lookups import start_asc_pipeline
from dynemb.graph import rewrite
from dynemb.graph.pipeline import PipelineError, delete_sessions_at_exit, extend_iterator
from dynemb.graph.rewrite import GraphModificationError
from dynemb.graph.trace import GET_NEXT_TYPES, Trace, TraceError, replay, trace_to_iterator
from dynemb.util.log import logger

DEFAULT_PREFETCH = 2
DUMP_DIR_ENV = "DYNEMB_GRAPH_DUMP_DIR"
DEFAULT_DUMP_DIR = "dynemb_graph_dump"


@dataclass
class _Lookup:
    record: Dict[str, Any]
    trace: Trace

    @property
    def op(self) -> tf.Operation:
        return self.record["op"]

    @property
    def table(self):
        return self.record["table"]

    @property
    def table_name(self) -> str:
        return self.record["table"].table_name

    @property
    def is_train(self) -> bool:
        return bool(self.record["is_train"])


def _pending(graph: tf.Graph) -> List[Dict[str, Any]]:
    st = _state.existing_modification_state(graph)
    done = st.done if st is not None else set()
    return [r for r in _state.graph_state(graph).lookups
            if r.get("modify_graph") and r["op"].name not in done]


def _check_default_graph(full_graph: Optional[tf.Graph]) -> tf.Graph:
    graph = tf.compat.v1.get_default_graph()
    if full_graph is not None and full_graph is not graph:
        raise GraphModificationError(
            "modify_graph_and_start_emb_cache: automatic graph modification only "
            "supports the default graph; call it inside `with full_graph.as_default():` "
            "or build the model in the default graph")
    if not _pending(graph):
        others = [g for g in _state.graphs_with_state() if g is not graph and _pending(g)]
        if others:
            raise GraphModificationError(
                "modify_graph_and_start_emb_cache: the sparse_lookup(..., modify_graph=True) "
                "calls were made in a graph that is not the default graph. Automatic graph "
                "modification only supports the default graph (as mxRec): build the model "
                "in tf.compat.v1.get_default_graph(), or call this function inside "
                "`with that_graph.as_default():`")
    if graph.finalized:
        raise GraphModificationError(
            "modify_graph_and_start_emb_cache: the default graph is finalized (a "
            "MonitoredSession or Estimator already started); call it before creating the "
            "session, or pass GraphModifierHook() to the Estimator / MonitoredSession")
    return graph


def dump_dir(dump_graph: Union[bool, str]) -> str:
    """Where a graph dump goes: the directory `dump_graph` names, else
    ``$DYNEMB_GRAPH_DUMP_DIR``, else ./dynemb_graph_dump."""
    return dump_graph if isinstance(dump_graph, str) else \
        os.environ.get(DUMP_DIR_ENV, DEFAULT_DUMP_DIR)


def _dump(graph: tf.Graph, dump_graph: Union[bool, str], stage: str) -> Optional[str]:
    if not dump_graph:
        return None
    path = tf.io.write_graph(graph.as_graph_def(add_shapes=True), dump_dir(dump_graph),
                             f"{stage}_modify_graph.pbtxt", as_text=True)
    logger.info("automatic graph modification: graph %s modification written to %s",
                stage, path)
    return path


def modify_graph_and_start_emb_cache(full_graph: Optional[tf.Graph] = None,
                                     dump_graph: Union[bool, str] = False,
                                     prefetch: int = DEFAULT_PREFETCH) -> None:
    """Rewrites the default graph for its ``sparse_lookup(..., modify_graph=True)``
    lookups (see the module docstring). Call it once the model, loss and train op
    are built and before the first ``session.run``; then run
    ``get_initializer(True)`` (train) / ``get_initializer(False)`` (eval) instead of
    the iterators' initializers.

    dump_graph: True writes the graph before and after the modification as text
    (``$DYNEMB_GRAPH_DUMP_DIR`` or ``./dynemb_graph_dump``); a string is the
    directory. prefetch: how many batches the pipeline may prepare ahead.
    Calling it again processes only lookups added since.
    """
    graph = _check_default_graph(full_graph)
    records = _pending(graph)
    if not records:
        logger.info("modify_graph_and_start_emb_cache: no sparse_lookup(..., "
                    "modify_graph=True) left to modify in the default graph")
        return
    _dump(graph, dump_graph, "before")

    # 1. Trace everything first: an error leaves the graph untouched.
    lookups: List[_Lookup] = []
    in_place = [r for r in records if r.get("orphan_in_place")]
    for r in records:
        if r.get("orphan_in_place"):  # an eval lookup OrphanLookupKeySlicerHook left
            continue
        what = (f"ids of lookup '{r['op'].name}' (table '{r['table'].table_name}', "
                f"sparse_lookup(..., modify_graph=True))")
        try:
            lookups.append(_Lookup(r, trace_to_iterator(r["ids"], what)))
        except TraceError as e:
            raise GraphModificationError(str(e)) from None
    _check_table_modes(graph, lookups)
    for r in in_place:
        rewrite.drop_guard(r["op"])
        _state.modification_state(graph).done.add(r["op"].name)
    groups: "OrderedDict[str, List[_Lookup]]" = OrderedDict()
    for lk in lookups:
        groups.setdefault(lk.trace.get_next.name, []).append(lk)
    if _state.get_rank_size() > 1:
        _keep_pipelines(graph, groups)
        return
    clocks = {}
    for name, group in groups.items():
        for lk in group:
            if lk.is_train and (name, lk.table_name) not in clocks:
                clocks[(name, lk.table_name)] = rewrite.pipeline_now(
                    rewrite.input_of(lk.op, "now"), lk.trace.get_next, lk.table_name,
                    rewrite.table_evicts(lk.table_name))

    # Tables whose one apply op takes exactly their lookups' gradients get the
    # lookups' tickets; the others a trainable-keys filter (dynemb.graph.rewrite).
    train_ops: "OrderedDict[str, List[tf.Operation]]" = OrderedDict()
    for lk in lookups:
        if lk.is_train:
            train_ops.setdefault(lk.table_name, []).append(lk.op)
    plans = {t: rewrite.plan_ticket_apply(graph, t, ops) for t, ops in train_ops.items()}

    # 2. Rebuild the pipelines and rewrite the lookups.
    st = _state.modification_state(graph)
    trainable: Dict[str, List[tf.Tensor]] = {}
    tickets_of: Dict[str, tf.Tensor] = {}
    for name, group in groups.items():
        train = [lk for lk in group if lk.is_train]
        get_next = group[0].trace.get_next
        if not train:  # eval-only iterator: nothing to send ahead
            _register_unchanged(st, get_next)
        else:
            need_keys = {lk.table_name for lk in train if plans[lk.table_name] is None}
            _rebuild(st, graph, name, get_next, train, clocks, prefetch, need_keys,
                     trainable, tickets_of)
        for lk in group:
            rewrite.drop_guard(lk.op)  # eval lookups keep reading in place
            st.done.add(lk.op.name)
    for table, plan in plans.items():
        if plan is not None:
            rewrite.ticket_apply(plan, tickets_of)
            logger.info("automatic graph modification: table '%s' applies through "
                        "admission tickets", table)
    for table, keys in trainable.items():
        n = rewrite.filter_applies(graph, table, keys)
        if not n:
            logger.warning("automatic graph modification: table '%s' has no apply op yet; "
                           "build the train op before calling "
                           "modify_graph_and_start_emb_cache() so that gradients of ids "
                           "not admitted yet are dropped", table)
    _dump(graph, dump_graph, "after")
    logger.info("automatic graph modification: %d lookup(s) on %d iterator(s) rewritten",
                len(lookups), len(groups))


def _check_table_modes(graph: tf.Graph, lookups: List[_Lookup]) -> None:
    """A table's train lookups must all be prepared ones (the apply filter keeps
    only ids the pipelines admitted)."""
    modified = {lk.table_name for lk in lookups if lk.is_train}
    for r in _state.graph_state(graph).lookups:
        if r["is_train"] and not r.get("modify_graph") and \
                r["table"].table_name in modified:
            raise GraphModificationError(
                f"table '{r['table'].table_name}' has train lookups with and without "
                f"modify_graph=True (plain lookup '{r['op'].name}'); give all train "
                f"lookups of a table the same mode")


def _keep_pipelines(graph: tf.Graph, groups: "OrderedDict[str, List[_Lookup]]") -> None:
    """Several ranks: the iterators stay as they are (module docstring)."""
    st = _state.modification_state(graph)
    for group in groups.values():
        training = any(lk.is_train for lk in group)
        _register_unchanged(st, group[0].trace.get_next, training)
        for lk in group:
            rewrite.drop_guard(lk.op)
            st.done.add(lk.op.name)
    logger.info("automatic graph modification on %d ranks: %d lookup(s) on %d iterator(s) "
                "exchange with the rows' owners in the step; the pipelines are unchanged",
                _state.get_rank_size(), sum(len(g) for g in groups.values()), len(groups))


def _register_unchanged(st: _state.ModificationState, get_next: tf.Operation,
                        training: bool = False) -> None:
    it = get_next.inputs[0]
    makers = [c for c in it.consumers() if c.type == "MakeIterator"]
    st.initializers[training].extend(makers)
    if all(b[0] is not get_next.outputs[0] for b in st.target_batches[training]):
        st.target_batches[training].append(list(get_next.outputs))
    if it.op.type == "OneShotIterator":
        st.one_shot[training] = True


def _rebuild(st: _state.ModificationState, graph: tf.Graph, name: str, get_next: tf.Operation,
             train: List[_Lookup], clocks: Dict, prefetch: int, need_keys: set,
             trainable: Dict[str, List[tf.Tensor]], tickets_of: Dict[str, tf.Tensor]) -> None:
    """Rebuilds one iterator's pipeline; fills `trainable` (table -> trainable
    keys, for the tables in `need_keys`) and `tickets_of` (lookup op -> its
    admission tickets)."""
    tables = list(OrderedDict((lk.table_name, None) for lk in train))
    key_tables = [t for t in tables if t in need_keys]

    def extra_fn(components: List[tf.Tensor], index: tf.Tensor,
                 start: tf.Tensor) -> List[tf.Tensor]:
        tickets, per_table_ids, per_table_adm = [], {t: [] for t in tables}, \
            {t: [] for t in tables}
        previous: Dict[str, tf.Tensor] = {}
        nows = {t: clocks[(name, t)](components, index, start) for t in tables}
        for lk in train:
            ids = replay(lk.trace, components)
            deps = [previous[lk.table_name]] if lk.table_name in previous else []
            with tf.control_dependencies(deps):  # a table's ids are counted in order
                tk = rewrite.prepare(lk.table_name, ids, nows[lk.table_name],
                                     rewrite.faae_of(lk.op))
            previous[lk.table_name] = tk
            tickets.append(tk)  # the lookup reads its rows through them
            if lk.table_name in need_keys:
                per_table_ids[lk.table_name].append(ids)
                per_table_adm[lk.table_name].append(rewrite.admitted_of(tk))
        keys = [rewrite.trainable_keys(per_table_ids[t], per_table_adm[t])
                for t in key_tables]
        stamps = [tf.cast(nows[lk.table_name], tf.int64) for lk in train]
        return tickets + keys + stamps

    try:
        ext = extend_iterator(get_next, extra_fn, prefetch=prefetch,
                              name="dynemb_pipeline_" + get_next.name.replace("/", "_"),
                              start_fn=rewrite.pipeline_start(graph) or
                              (lambda: tf.constant(0, tf.int64)))
    except PipelineError as e:
        raise GraphModificationError(str(e)) from None
    n_keys = len(key_tables)
    tickets, keys = ext.extras[:len(train)], ext.extras[len(train):len(train) + n_keys]
    stamps = ext.extras[len(train) + n_keys:]
    for lk, tk, stamp in zip(train, tickets, stamps):
        rewrite.rewrite_lookup(lk.op, tk, lk.table_name, lk.table.dim, stamp=stamp)
        tickets_of[lk.op.name] = tk
    for t, k in zip(key_tables, keys):
        trainable.setdefault(t, []).append(k)
    delete_sessions_at_exit(graph)
    if ext.one_shot:
        st.one_shot[True] = True
    if len(ext.initializers) > 1:
        st.several_datasets.append(ext.iterator_name)
    st.initializers[True].extend(ext.initializers)
    st.target_batches[True].append(list(ext.new_get_next.outputs[:len(get_next.outputs)]))


def get_initializer(is_training: bool = True) -> tf.Operation:
    """The initializer of the rebuilt train (True) or eval (False) pipelines of the
    default graph: run it where the script ran ``iterator.initializer``.

    A no-op when the graph has no modify_graph lookups of that kind or when its
    iterators are one-shot (they start themselves).
    """
    graph = tf.compat.v1.get_default_graph()
    mode = "train" if is_training else "eval"
    st = _modified_state(graph, is_training, "get_initializer")
    if st is not None and is_training and st.several_datasets:
        raise GraphModificationError(
            f"get_initializer(True): iterator '{st.several_datasets[0]}' is initialized with "
            f"several datasets (Iterator.from_structure + make_initializer); run the "
            f"initializer of the dataset you want (iterator.make_initializer(dataset)), "
            f"which dynemb chained to the rebuilt pipeline")
    inits = list(st.initializers[bool(is_training)]) if st else []
    if not inits:
        return tf.no_op(name=f"dynemb_{mode}_initializer")
    if len(inits) == 1:
        return inits[0]
    return tf.group(*inits, name=f"dynemb_{mode}_initializer")


def _modified_state(graph: tf.Graph, is_training: bool,
                    what: str) -> Optional[_state.ModificationState]:
    """The graph's modification state; raises if lookups of that mode are
    still waiting for modify_graph_and_start_emb_cache()."""
    mode = "train" if is_training else "eval"
    wanted = [r for r in _state.graph_state(graph).lookups
              if r.get("modify_graph") and bool(r["is_train"]) == bool(is_training)]
    st = _state.existing_modification_state(graph)
    if wanted and (st is None or any(r["op"].name not in st.done for r in wanted)):
        raise GraphModificationError(
            f"{what}({bool(is_training)}): the graph has {mode} lookups with "
            f"modify_graph=True that were not modified yet; call "
            f"modify_graph_and_start_emb_cache() first (after building the model and the "
            f"train op, before creating the session)")
    return st


def get_target_batch(is_training: bool = True) -> Any:
    """The batch the train (True) or eval (False) lookups of the default graph
    read after modification: the outputs of the rebuilt pipeline's get_next
    (train; the original iterator's for eval, which is not rebuilt), in the
    structure ``iterator.get_next()`` returned (a dict of features, a tuple,
    ...; a list in tf.nest.flatten order for a get_next made before dynemb
    was imported). Fetch these instead of the original get_next tensors,
    which still read the original iterator."""
    graph = tf.compat.v1.get_default_graph()
    mode = "train" if is_training else "eval"
    st = _modified_state(graph, is_training, "get_target_batch")
    batches = st.target_batches[bool(is_training)] if st is not None else []
    if not batches:
        raise GraphModificationError(
            f"get_target_batch({bool(is_training)}): automatic graph modification rebuilt "
            f"no {mode} pipeline in the default graph: build {mode} lookups with "
            f"sparse_lookup(..., is_train={bool(is_training)}, modify_graph=True) and call "
            f"modify_graph_and_start_emb_cache()")
    if len(batches) > 1:
        names = ", ".join(b[0].op.name for b in batches)
        raise GraphModificationError(
            f"get_target_batch({bool(is_training)}): {len(batches)} {mode} pipelines were "
            f"modified ({names}); there is one batch per pipeline: read the one you want "
            f"from its lookups' inputs")
    outputs = list(batches[0])
    structure = _state.graph_state(graph).batch_structures.get(outputs[0].op.name)
    if structure is None:
        return outputs
    return tf.nest.pack_sequence_as(structure, outputs[:len(tf.nest.flatten(structure))])


def patch_iterator() -> None:
    """Makes tf.compat.v1 iterators' get_next remember the structure of the
    batch it returns (get_target_batch gives the rebuilt batch that shape)."""
    from tensorflow.python.data.ops import iterator_ops
    original = iterator_ops.Iterator.get_next
    if getattr(original, "_dynemb", False):
        return

    def get_next(self, name=None):
        out = original(self, name)
        flat = tf.nest.flatten(out)
        if flat and all(isinstance(t, tf.Tensor) and t.op is flat[0].op for t in flat) \
                and flat[0].op.type in GET_NEXT_TYPES \
                and [t.name for t in flat] == [t.name for t in flat[0].op.outputs]:
            # (a copy: scripts pop and add keys of the dict they get)
            _state.graph_state(flat[0].graph).batch_structures[flat[0].op.name] = \
                tf.nest.map_structure(lambda t: t, out)
        return out

    get_next._dynemb = True  # pylint: disable=protected-access
    get_next.__doc__ = original.__doc__
    iterator_ops.Iterator.get_next = get_next


class GraphModifierHook(tf.compat.v1.train.SessionRunHook):
    """Estimator / MonitoredSession hook running the modification in ``begin()``.

    Add it to ``estimator.train/evaluate/predict(hooks=[...])`` (or the train and
    eval specs of ``train_and_evaluate``). Estimator's own dataset hook runs the
    iterator's initializer, which is chained to the rebuilt pipeline.
    modify_graph=False runs the FeatureSpec pipeline's start instead.
    """

    def __init__(self, dump_graph: Union[bool, str] = False, modify_graph: bool = True,
                 prefetch: int = DEFAULT_PREFETCH):
        self._dump_graph = dump_graph
        self._modify_graph = modify_graph
        self._prefetch = prefetch

    def begin(self) -> None:
        if self._modify_graph:
            modify_graph_and_start_emb_cache(dump_graph=self._dump_graph,
                                             prefetch=self._prefetch)
        else:
            start_asc_pipeline()

