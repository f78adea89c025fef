"""Tracing a tensor back to the tf.data iterator it comes from, and replaying it.

Automatic graph modification must know, for each lookup's ids, which
``IteratorGetNext`` op produced them and what the graph computed between that op
and the ids (casts, reshapes, arithmetic, slicing, hashing...). `trace_to_iterator`
walks the data inputs backwards and returns both; `replay` copies those ops, in
order, into another graph (the input pipeline's map function), so the engine sees
exactly the ids the lookup will see.

Only pure computations can be replayed: an ids tensor that depends on a
placeholder, a variable, a random op, TF1 control flow or a function call gets an
error naming the op, because recomputing it in the input pipeline could give other
values than in the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, Iterator, List, Optional

import tensorflow as tf

GET_NEXT_TYPES = frozenset({"IteratorGetNext", "IteratorGetNextSync"})

# Ops that cannot be recomputed in the pipeline even though TF does not mark them
# stateful: inputs fed at run time, and TF1 control flow (frames do not exist in a
# dataset function).
_NOT_REPLAYABLE = frozenset({
    "Placeholder", "PlaceholderV2", "PlaceholderWithDefault",
    "Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit",
    "RefExit", "NextIteration", "RefNextIteration", "LoopCond",
})
_NOT_REPLAYABLE_DTYPES = frozenset({tf.resource, tf.variant})


class TraceError(ValueError):
    """An ids tensor cannot be traced to an iterator or replayed in the pipeline."""


@dataclass
class Trace:
    """How a tensor is computed from one iterator's ``get_next`` outputs.

    ``ops`` are the ops strictly between ``get_next`` and ``tensor`` (inclusive of
    the op producing ``tensor``, exclusive of ``get_next``), in an order where every
    op comes after the ops producing its inputs; empty when ``tensor`` is itself an
    output of ``get_next``.
    """
    tensor: tf.Tensor
    get_next: Optional[tf.Operation]  # None: computed from constants only
    ops: List[tf.Operation] = field(default_factory=list)


def _describe(op: tf.Operation) -> str:
    return f"{op.type} op '{op.name}'"


def ancestors(ops: Iterable[tf.Operation], stop: Callable[[tf.Operation], bool],
              control: bool = False, limit: int = 100_000) -> Iterator[tf.Operation]:
    """The ops that `ops` are computed from (themselves included, through
    data inputs and, with `control`, control inputs), each once; an op for
    which `stop` is true is yielded but not walked past. At most `limit`
    ops (graphs can be huge)."""
    seen: set = set()
    stack = list(ops)
    while stack and len(seen) < limit:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        yield op
        if stop(op):
            continue
        stack.extend(i.op for i in op.inputs)
        if control:
            stack.extend(op.control_inputs)


def walk(tensor: tf.Tensor):
    """(get_next ops, blockers, ops in replay order) of `tensor`'s ancestry.

    The walk follows data inputs only and stops at ``IteratorGetNext`` ops and at
    ops that cannot be replayed (listed in `blockers` as sentences).
    """
    sources: Dict[str, tf.Operation] = {}
    blockers: List[str] = []
    order: List[tf.Operation] = []
    visited = set()
    stack = [(tensor.op, False)]  # iterative post-order DFS (graphs can be deep)
    while stack:
        op, expanded = stack.pop()
        if expanded:
            order.append(op)
            continue
        if op.name in visited:
            continue
        visited.add(op.name)
        if op.type in GET_NEXT_TYPES:
            sources[op.name] = op
            continue
        problem = replay_problem(op)
        if problem:
            blockers.append(problem)
            continue
        stack.append((op, True))
        for inp in reversed(op.inputs):
            if inp.op.name not in visited:
                stack.append((inp.op, False))
    return list(sources.values()), blockers, order


FIX = ("Feed the ids through a tf.data iterator (make_initializable_iterator or "
       "make_one_shot_iterator) and compute them from get_next() with plain tensor ops, "
       "or use modify_graph=False.")


def trace_to_iterator(tensor: tf.Tensor, what: str) -> Trace:
    """Finds the single ``IteratorGetNext`` op `tensor` is computed from.

    `what` names the tensor in error messages (e.g. "ids of lookup 'user_lookup'
    (table 'user_table')"). Raises TraceError when the tensor does not come from a
    tf.data iterator, comes from several, or depends on something that cannot be
    recomputed in the input pipeline.
    """
    sources, blockers, order = walk(tensor)
    if not sources:
        found = "; ".join(blockers) if blockers else "only constants"
        raise TraceError(
            f"automatic graph modification: cannot trace the {what} back to a tf.data "
            f"iterator (found {found}). {FIX}")
    if len(sources) > 1:
        raise TraceError(
            f"automatic graph modification: the {what} are computed from several "
            f"iterators ({', '.join(sorted(s.name for s in sources))}); dynemb can only "
            f"send ids to the engine ahead of the step when they come from one iterator.")
    if blockers:
        raise TraceError(
            f"automatic graph modification: the {what} come from iterator op "
            f"'{sources[0].name}' but also depend on {'; '.join(blockers)}, which cannot "
            f"be recomputed in the input pipeline. {FIX}")
    return Trace(tensor=tensor, get_next=sources[0], ops=order)


def replay_problem(op: tf.Operation) -> Optional[str]:
    """Why `op` cannot be replayed in a dataset function, or None if it can."""
    if op.type in _NOT_REPLAYABLE:
        return f"{_describe(op)} (fed or control flow)"
    try:
        stateful = op.op_def.is_stateful
    except (AttributeError, ValueError):  # unregistered op
        return f"{_describe(op)} (unknown op)"
    if stateful:
        return f"{_describe(op)} (stateful: variable, random, I/O or engine op)"
    for name, value in op.node_def.attr.items():
        if value.HasField("func") or (value.HasField("list") and len(value.list.func)):
            return f"{_describe(op)} (calls function attr '{name}')"
    for t in list(op.inputs) + list(op.outputs):
        if t.dtype in _NOT_REPLAYABLE_DTYPES:
            return f"{_describe(op)} ({t.dtype.name} tensor)"
    if op.type == "Const" or op.inputs:
        return None
    return f"{_describe(op)} (an input with no data source)"


def replay(trace: Trace, components: List[tf.Tensor]) -> tf.Tensor:
    """Recomputes ``trace.tensor`` in the current default graph.

    `components` are the current graph's tensors standing for the outputs of
    ``trace.get_next`` (in output order): inside a ``Dataset.map`` function, the
    element's flat components. Every traced op is copied with its attributes
    (colocation and other internal ``_`` attributes dropped); control inputs are
    not copied.
    """
    return replay_ops(trace.get_next, trace.ops, components)[trace.tensor.name]


def replay_ops(get_next: Optional[tf.Operation], ops: List[tf.Operation],
               components: List[tf.Tensor], prefix: str = "replay") -> Dict[str, tf.Tensor]:
    """Copies `ops` (in an order where inputs come first, computed from
    `get_next`'s outputs and constants) into the current default graph, with
    `components` standing for `get_next`'s outputs; returns old tensor name ->
    copy, for every output of `ops` (and the components)."""
    outs = get_next.outputs if get_next is not None else []
    if len(components) != len(outs):
        raise ValueError(f"replay: {len(components)} components for {len(outs)} outputs "
                         f"of '{get_next.name}'")
    mapping: Dict[str, tf.Tensor] = {t.name: c for t, c in zip(outs, components)}
    graph = tf.compat.v1.get_default_graph()
    for op in ops:
        inputs = [mapping[t.name] for t in op.inputs]
        attrs = {k: v for k, v in op.node_def.attr.items() if not k.startswith("_")}
        copy = graph.create_op(op.type, inputs, dtypes=[t.dtype for t in op.outputs],
                               attrs=attrs, name=prefix + "/" + op.name.replace("/", "_"))
        for old, new in zip(op.outputs, copy.outputs):
            mapping[old.name] = new
    return mapping
