"""Moving parts of the step's graph into the input pipeline ("slicing").

A model may compute its lookup ids in the step from the batch: parse strings
(``StringSplit``, ``StringToNumber``), hash, cast. Those ops then run on the
step's critical path although they need nothing but the batch. Slicing moves
such ops, with everything they are computed from back to the iterator (their
*minimum dependency subgraph*), into the dataset: the iterator is rebuilt as
``dataset.map(fn).prefetch(0)`` where ``fn`` recomputes them in tf.data's
threads, and every op of the step that read one of their outputs reads the new
iterator's matching component instead (dynemb.graph.pipeline). The values do
not change (only pure ops are moved, dynemb.graph.trace), only where they are
computed.

Three selections use it (mxRec's hooks, dynemb.graph.hooks and
dynemb.graph.acg_push_ops):

- `slice_lookup_subgraphs(op_types)`: ops of the given types in the ids
  subgraph of the graph's ``modify_graph=True`` lookups;
- `slice_orphan_keys()`: lookups whose ids come from no iterator at all (a
  constant, ids computed from constants): their computation joins the
  pipeline of the lookups of the same mode, so that automatic graph
  modification can prepare them ahead with the batch;
- `push_ops_to_dataset()`: string-parsing ops anywhere in the graph.

Slicing comes before automatic graph modification (GraphModifierHook,
modify_graph_and_start_emb_cache), which then traces the lookups' ids to the
rebuilt iterators.
"""

from __future__ import annotations

import csv
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set

import tensorflow as tf

from dynemb import _state
from dynemb.graph.pipeline import PipelineError, extend_iterator, replace_uses
from dynemb.graph.rewrite import GraphModificationError
from dynemb.graph.trace import GET_NEXT_TYPES, replay_ops, walk
from dynemb.util.log import logger

# What mxRec's hook pushes by default, and the name marker that pushes any op.
PUSH_OP_TYPES = frozenset({"StringSplit", "StringSplitV2", "StringToNumber"})
PUSH_NAME_MARK = "ACG_PUSH_NODE"
# Ops that are never moved: the pipeline's own ops, summaries, and ops that
# belong to saving and the loss (as mxRec).
_SKIP_TYPE_PARTS = ("Dataset", "Summary")
_SKIP_NAME_PARTS = ("save", "report_", "loss")


class SlicingError(GraphModificationError):
    """Part of the graph cannot be moved into the input pipeline."""


@dataclass
class SliceReport:
    """What one slicing found and did (logged; `write_summary` saves it)."""
    kind: str
    found: "OrderedDict[str, int]" = field(default_factory=OrderedDict)   # op type -> in graph
    moved: "OrderedDict[str, int]" = field(default_factory=OrderedDict)   # op type -> moved
    skipped: List[str] = field(default_factory=list)                       # sentences
    iterators: List[str] = field(default_factory=list)                     # rebuilt

    def log(self) -> None:
        if not self.found and not self.moved:
            logger.info("%s: nothing to move into the input pipeline", self.kind)
            return
        rows = ", ".join(f"{t}: {self.moved.get(t, 0)} of {n}" for t, n in self.found.items())
        logger.info("%s: moved into the input pipeline (%s) on iterator(s) %s", self.kind,
                    rows or ", ".join(f"{t}: {n}" for t, n in self.moved.items()),
                    ", ".join(self.iterators) or "none")
        for s in self.skipped:
            logger.warning("%s: %s", self.kind, s)

    def write_summary(self, info_dir: str) -> str:
        """Writes ``slicing_summary.csv`` (op type, found, moved) into `info_dir`."""
        os.makedirs(info_dir, exist_ok=True)
        path = os.path.join(info_dir, "slicing_summary.csv")
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["op_type", "found", "moved"])
            for t in sorted(set(self.found) | set(self.moved)):
                w.writerow([t, self.found.get(t, 0), self.moved.get(t, 0)])
        return path


def _describe(op: tf.Operation) -> str:
    return f"{op.type} op '{op.name}'"


def _pending_lookups(graph: tf.Graph, what: str) -> List[dict]:
    """The graph's modify_graph lookups; an error if modification already ran."""
    st = _state.existing_modification_state(graph)
    done = st.done if st is not None else set()
    records = [r for r in _state.graph_state(graph).lookups if r.get("modify_graph")]
    modified = [r for r in records if r["op"].name in done]
    if modified:
        raise SlicingError(
            f"{what}: lookup '{modified[0]['op'].name}' was already rewritten by automatic "
            f"graph modification; run {what} before it (put the hook before "
            f"GraphModifierHook in the hooks list, or call it before "
            f"modify_graph_and_start_emb_cache())")
    return records


def _subgraph(seeds: Sequence[tf.Operation]):
    """(get_next ops, blockers, ops in replay order) of the seeds' dependencies."""
    sources: Dict[str, tf.Operation] = {}
    blockers: List[str] = []
    order: List[tf.Operation] = []
    seen: Set[str] = set()
    for seed in seeds:
        srcs, blocks, ops = walk(seed.outputs[0])
        for s in srcs:
            sources[s.name] = s
        blockers.extend(blocks)
        for op in ops:
            if op.name not in seen:
                seen.add(op.name)
                order.append(op)
    return list(sources.values()), blockers, order


def move_to_pipeline(graph: tf.Graph, get_next: tf.Operation, ops: List[tf.Operation],
                     targets: Sequence[tf.Tensor], name: str) -> int:
    """Computes `targets` (outputs of `ops`; `ops` in replay order, computed
    from `get_next` and constants) in `get_next`'s pipeline: the step's ops
    that read a target read the rebuilt iterator's component instead. The
    other outputs of `ops` keep being computed where they are, so that a
    constant or an intermediate tensor that other parts of the graph (a
    variable's initializer, the dataset itself) share is never switched to
    the iterator. Returns how many targets were moved (0: nothing read
    them, nothing changed)."""
    inside = {op.name for op in ops}
    targets = [t for t in targets if any(_rewirable(c, inside) for c in t.consumers())]
    if not targets:
        return 0

    def extra_fn(components: List[tf.Tensor]) -> List[tf.Tensor]:
        mapping = replay_ops(get_next, ops, components, prefix="sliced")
        return [mapping[t.name] for t in targets]

    try:
        ext = extend_iterator(get_next, extra_fn, prefetch=0, name=name)
    except PipelineError as e:
        raise SlicingError(str(e)) from None
    moved: Dict[str, tf.Tensor] = {}
    for old, new in zip(targets, ext.extras):
        new.set_shape(new.shape.merge_with(old.shape))
        replace_uses(old, new, keep=[c for c in old.consumers()
                                     if not _rewirable(c, inside)])
        moved[old.name] = new
    # The records that name a moved tensor (a lookup's ids) name the new one,
    # so that graph modification traces what the lookups now read.
    for r in _state.graph_state(graph).lookups:
        if r["ids"].name in moved:
            r["ids"] = moved[r["ids"].name]
    return len(targets)


def _rewirable(consumer: tf.Operation, inside: set) -> bool:
    """Whether `consumer` of a moved tensor should read the pipeline's copy:
    ops of the step, not the moved ops themselves nor the ops that build
    datasets and iterators (rewiring those would make the iterator read
    itself)."""
    return consumer.name not in inside and "Dataset" not in consumer.type and \
        consumer.type not in ("MakeIterator", "OneShotIterator", "IteratorV2", "Iterator")


def _skip_reason(op: tf.Operation) -> Optional[str]:
    if any(p in op.type for p in _SKIP_TYPE_PARTS):
        return f"{_describe(op)} is a pipeline or summary op"
    if any(p in op.name for p in _SKIP_NAME_PARTS):
        return f"{_describe(op)} belongs to saving or the loss (its name)"
    return None


def _move_groups(graph: tf.Graph, seeds: Iterable[tf.Operation], report: SliceReport,
                 name: str) -> None:
    """Groups the seeds by the iterator they come from and moves each group."""
    groups: "OrderedDict[str, List[tf.Operation]]" = OrderedDict()
    get_nexts: Dict[str, tf.Operation] = {}
    for op in seeds:
        if not op.outputs:
            continue
        skip = _skip_reason(op)
        if skip is None and op.control_inputs:
            skip = f"{_describe(op)} has control inputs, which a dataset function cannot have"
        srcs, blockers, order = _subgraph([op])
        if skip is None and blockers:
            skip = f"{_describe(op)} depends on {'; '.join(blockers)}"
        if skip is None and not srcs:
            skip = f"{_describe(op)} is not computed from a tf.data iterator"
        if skip is None and len(srcs) > 1:
            skip = (f"{_describe(op)} is computed from several iterators "
                    f"({', '.join(sorted(s.name for s in srcs))})")
        if skip is None:
            bad = [o for o in order if o.control_inputs]
            if bad:
                skip = (f"{_describe(op)} depends on {_describe(bad[0])}, which has control "
                        f"inputs")
        if skip is not None:
            report.skipped.append(skip + "; it stays in the step")
            continue
        groups.setdefault(srcs[0].name, []).append(op)
        get_nexts[srcs[0].name] = srcs[0]
    # (every group's subgraph is found before any is moved)
    plans = [(gname, group, _subgraph(group)[2]) for gname, group in groups.items()]
    for gname, group, order in plans:
        get_next = get_nexts[gname]
        targets = [t for op in group for t in op.outputs]
        if move_to_pipeline(graph, get_next, order, targets,
                            name + "_" + gname.replace("/", "_")):
            report.iterators.append(get_next.inputs[0].op.name)
            for op in group:
                report.moved[op.type] = report.moved.get(op.type, 0) + 1


def slice_lookup_subgraphs(op_types: Sequence[str], graph: Optional[tf.Graph] = None,
                           what: str = "LookupSubgraphSlicerHook") -> SliceReport:
    """Moves the ops of `op_types` in the ids subgraphs of the graph's
    ``modify_graph=True`` lookups (train and eval), with their minimum
    dependency subgraphs, into the lookups' input pipelines."""
    graph = graph or tf.compat.v1.get_default_graph()
    types = frozenset(op_types)
    report = SliceReport(what)
    for t in op_types:
        report.found[t] = sum(1 for op in graph.get_operations() if op.type == t)
    records = _pending_lookups(graph, what)
    seeds: "OrderedDict[str, tf.Operation]" = OrderedDict()
    for r in records:
        _, _, order = walk(r["ids"])
        for op in order:
            if op.type in types:
                seeds[op.name] = op
    with graph.as_default():
        _move_groups(graph, seeds.values(), report, "dynemb_sliced")
    report.log()
    return report


def _alive_get_nexts(graph: tf.Graph) -> List[tf.Operation]:
    """Iterators' get_next ops whose outputs something still reads."""
    return [op for op in graph.get_operations()
            if op.type in GET_NEXT_TYPES and any(t.consumers() for t in op.outputs)]


def slice_orphan_keys(graph: Optional[tf.Graph] = None,
                      what: str = "OrphanLookupKeySlicerHook") -> SliceReport:
    """Lookups (``modify_graph=True``) whose ids come from no iterator: their
    ids are computed in the pipeline of the other lookups of their mode
    (train or eval), so that they are prepared ahead like the others.

    The pipeline is the one iterator the other lookups of that mode read;
    for a train lookup without such lookups, the graph's only iterator. An
    eval lookup without an eval pipeline keeps reading in place (eval
    lookups are not prepared ahead). Ids that depend on something a dataset
    cannot compute (a placeholder, a variable) are an error."""
    graph = graph or tf.compat.v1.get_default_graph()
    report = SliceReport(what)
    records = _pending_lookups(graph, what)
    orphans: List[dict] = []
    used: Dict[bool, "OrderedDict[str, tf.Operation]"] = {True: OrderedDict(),
                                                          False: OrderedDict()}
    for r in records:
        srcs, blockers, _ = walk(r["ids"])
        if srcs:
            for s in srcs:
                used[bool(r["is_train"])][s.name] = s
            continue
        if blockers:
            raise SlicingError(
                f"{what}: the ids of lookup '{r['op'].name}' (table "
                f"'{r['table'].table_name}') come from no tf.data iterator and depend on "
                f"{'; '.join(blockers)}, which the input pipeline cannot compute; compute "
                f"them from the batch, or use modify_graph=False for this lookup")
        orphans.append(r)
    report.found["orphan lookup ids"] = len(orphans)
    with graph.as_default():
        for r in orphans:
            train = bool(r["is_train"])
            candidates = list(used[train].values())
            if not candidates and train:  # (never an iterator eval lookups read)
                candidates = [g for g in _alive_get_nexts(graph) if g.name not in used[False]]
            if not candidates:
                if train:
                    raise SlicingError(
                        f"{what}: the ids of train lookup '{r['op'].name}' come from no "
                        f"tf.data iterator, and the graph has no iterator whose pipeline "
                        f"could compute them; read the ids from a dataset")
                r["orphan_in_place"] = True
                report.skipped.append(
                    f"eval lookup '{r['op'].name}': no eval pipeline to join; its ids are "
                    f"computed in the step")
                continue
            if len(candidates) > 1:
                raise SlicingError(
                    f"{what}: the ids of lookup '{r['op'].name}' come from no tf.data "
                    f"iterator, and the graph has several pipelines they could join "
                    f"({', '.join(sorted(c.name for c in candidates))}); compute them from "
                    f"the batch of the one they belong to")
            get_next = candidates[0]
            _, _, order = walk(r["ids"])
            if move_to_pipeline(graph, get_next, order, [r["ids"]],
                                "dynemb_orphan_" + get_next.name.replace("/", "_")):
                report.moved["orphan lookup ids"] = \
                    report.moved.get("orphan lookup ids", 0) + 1
                report.iterators.append(get_next.inputs[0].op.name)
                # The iterator was rebuilt: later orphans of this mode join
                # the new one.
                used[train] = OrderedDict(
                    (s.name, s) for s in walk(r["ids"])[0])
    report.log()
    return report


def push_ops_to_dataset(graph: Optional[tf.Graph] = None,
                        what: str = "ACGPushOpsToDatasetHook") -> SliceReport:
    """Moves every string-parsing op of the graph (``StringSplit``,
    ``StringToNumber``, and any op whose name contains ``ACG_PUSH_NODE``)
    that is computed from one iterator, with its dependencies, into that
    iterator's pipeline."""
    graph = graph or tf.compat.v1.get_default_graph()
    report = SliceReport(what)
    _pending_lookups(graph, what)
    seeds = [op for op in graph.get_operations()
             if (op.type in PUSH_OP_TYPES or PUSH_NAME_MARK in op.name)
             and op.type not in GET_NEXT_TYPES and not op.name.startswith("dynemb_")]
    for op in seeds:
        report.found[op.type] = report.found.get(op.type, 0) + 1
    with graph.as_default():
        _move_groups(graph, seeds, report, "dynemb_pushed")
    report.log()
    return report


def _check_graph(full_graph: Any, what: str) -> Optional[tf.Graph]:
    if full_graph is not None and not isinstance(full_graph, tf.Graph):
        raise TypeError(f"{what}: full_graph must be a tf.Graph or None, got "
                        f"{type(full_graph).__name__}")
    return full_graph


def _check_op_types(op_types: Any, what: str) -> List[str]:
    if not isinstance(op_types, list):
        raise TypeError(f"{what}: op_types must be a list of op type names (for example "
                        f"['StringToNumber']), got {type(op_types).__name__}")
    if not op_types:
        raise ValueError(f"{what}: op_types is empty; name the op types to move, for "
                         f"example ['StringToNumber']")
    bad = [t for t in op_types if not isinstance(t, str) or not t]
    if bad:
        raise TypeError(f"{what}: op_types must hold op type names (str), got {bad[0]!r}")
    return list(op_types)


class LookupSubgraphSlicer:
    """mxRec's slicer object: `summarize()` logs what would move, `slice()`
    moves it (slice_lookup_subgraphs); `info_dir` (optional) receives
    ``slicing_summary.csv``."""

    def __init__(self, op_types: List[str], full_graph: Optional[tf.Graph] = None,
                 info_dir: Optional[str] = None):
        self._op_types = _check_op_types(op_types, "LookupSubgraphSlicer")
        self._graph = _check_graph(full_graph, "LookupSubgraphSlicer")
        self._info_dir = info_dir

    def summarize(self) -> None:
        graph = self._graph or tf.compat.v1.get_default_graph()
        counts = ", ".join(f"{t}: {sum(1 for op in graph.get_operations() if op.type == t)}"
                           for t in self._op_types)
        logger.info("LookupSubgraphSlicer: ops of the given types in the graph: %s", counts)

    def slice(self) -> SliceReport:
        report = slice_lookup_subgraphs(self._op_types, self._graph)
        if self._info_dir:
            report.write_summary(self._info_dir)
        return report


class OrphanLookupKeySlicer:
    """mxRec's slicer object for orphan lookup ids (slice_orphan_keys)."""

    def __init__(self, full_graph: Optional[tf.Graph] = None, info_dir: Optional[str] = None):
        self._graph = _check_graph(full_graph, "OrphanLookupKeySlicer")
        self._info_dir = info_dir

    def summarize(self) -> None:
        graph = self._graph or tf.compat.v1.get_default_graph()
        n = sum(1 for r in _state.graph_state(graph).lookups
                if r.get("modify_graph") and not walk(r["ids"])[0])
        logger.info("OrphanLookupKeySlicer: %d modify_graph lookup(s) read ids from no "
                    "iterator", n)

    def slice(self) -> SliceReport:
        report = slice_orphan_keys(self._graph)
        if self._info_dir:
            report.write_summary(self._info_dir)
        return report


class LookupSubgraphSlicerHook(tf.compat.v1.train.SessionRunHook):
    """Estimator / MonitoredSession hook: in ``begin()``, moves the ops of
    `op_types` in the lookups' ids subgraphs into the input pipeline
    (slice_lookup_subgraphs). Put it before GraphModifierHook."""

    def __init__(self, op_types: List[str], full_graph: Optional[tf.Graph] = None):
        self._slicer = LookupSubgraphSlicer(op_types, full_graph)

    def begin(self) -> None:
        self._slicer.summarize()
        self._slicer.slice()


class OrphanLookupKeySlicerHook(tf.compat.v1.train.SessionRunHook):
    """Estimator / MonitoredSession hook: in ``begin()``, computes ids that come
    from no iterator in the pipeline of their lookups' mode
    (slice_orphan_keys). Put it before GraphModifierHook."""

    def __init__(self, full_graph: Optional[tf.Graph] = None):
        self._slicer = OrphanLookupKeySlicer(full_graph)

    def begin(self) -> None:
        self._slicer.summarize()
        self._slicer.slice()


class ACGPushOpsToDatasetHook(tf.compat.v1.train.SessionRunHook):
    """Estimator / MonitoredSession hook: in ``begin()``, moves the graph's
    string-parsing ops into the dataset (push_ops_to_dataset); dump_graph
    writes the graph before and after as text (as automatic graph
    modification's dump_graph)."""

    def __init__(self, dump_graph: bool = False):
        if not isinstance(dump_graph, bool):
            raise TypeError(f"ACGPushOpsToDatasetHook: dump_graph must be a bool, got "
                            f"{type(dump_graph).__name__}")
        self._dump_graph = dump_graph

    def begin(self) -> None:
        graph = tf.compat.v1.get_default_graph()
        self._dump(graph, "before")
        push_ops_to_dataset(graph)
        self._dump(graph, "after")

    def _dump(self, graph: tf.Graph, stage: str) -> None:
        if self._dump_graph:
            directory = os.environ.get("DYNEMB_GRAPH_DUMP_DIR", "dynemb_graph_dump")
            path = tf.io.write_graph(graph.as_graph_def(add_shapes=True), directory,
                                     f"{stage}_push_graph.pbtxt", as_text=True)
            logger.info("ACGPushOpsToDatasetHook: graph %s the push written to %s", stage, path)
