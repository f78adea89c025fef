"""Turning a lookup into a "prepared" lookup (shared by automatic graph
modification and the FeatureSpec pipeline).

In plain mode a train lookup does everything at step time: it counts admission
candidates, inserts admitted ids, stamps last access and returns rows. In the
prepared modes the input pipeline has already done the table-side part for the
batch with the ``DynembPrepare`` op (in tf.data's threads, possibly several
batches ahead) and delivers, next to the batch, one *admission ticket* per id
(int64): -1 where a plain lookup at this point would have returned the default
value (not admitted), else where the id's row was.

A ticket is binding. At step time the lookup only reads (``is_train`` off:
nothing is counted twice) and returns the default value where the ticket says
"not admitted", although a later batch, prepared since, may have admitted the
id; the table's apply op trains an id only when one of its occurrences was
admitted. Rows that the pipeline created for *later* batches therefore neither
show through nor get trained early, which is what makes the three input modes
give the same numbers.

When a table's one apply op takes exactly the gradients of its prepared lookups
(the usual case; see ``plan_ticket_apply``) the apply op gets the tickets in
the order of its keys and finds the rows through them
(``dynemb_apply`` with tickets). Otherwise it gets the batch's *trainable keys*
(the ids admitted somewhere in the batch, ``trainable_keys``) and drops the
gradient rows of other ids (``dynemb_apply`` with a filter): the same ids.

Inputs of the dynemb ops are set by name (``set_input``), never by position.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.ops import gen_resource_variable_ops

from dynemb import _lib, _state
from dynemb.graph.trace import replay, walk, Trace
from dynemb.util.log import logger

GUARD_MARK = "dynemb_unmodified_guard"


class GraphModificationError(ValueError):
    """The graph cannot be modified as asked; the message says why and the fix."""


def _input_index(op: tf.Operation, name: str) -> int:
    names = [arg.name for arg in op.op_def.input_arg]
    if name not in names:
        raise GraphModificationError(f"'{op.name}' is a {op.type} op without an input "
                                     f"'{name}' (it has {', '.join(names)}); rebuild the "
                                     f"graph with this version of dynemb")
    return names.index(name)


def faae_of(op: tf.Operation) -> int:
    """The sightings one occurrence of a lookup op's ids counts for admission."""
    try:
        return int(op.get_attr("faae_coefficient"))
    except ValueError:  # (an op without the attr)
        return 1


def input_of(op: tf.Operation, name: str) -> tf.Tensor:
    """The input called `name` (in the op's definition) of `op`."""
    return op.inputs[_input_index(op, name)]


def set_input(op: tf.Operation, name: str, tensor: tf.Tensor) -> None:
    """Rewires the input called `name` (in the op's definition) of `op`."""
    op._update_input(_input_index(op, name), tensor)  # pylint: disable=protected-access


def prepare(table_name: str, ids: tf.Tensor, now: tf.Tensor, weight: int = 1) -> tf.Tensor:
    """Train-mode table work for `ids` (any shape) ahead of the step, each
    occurrence counting `weight` sightings for admission (faae_coefficient);
    returns the admission tickets (int64, same shape; -1 where not admitted)."""
    if ids.dtype not in (tf.int32, tf.int64):
        raise GraphModificationError(
            f"table '{table_name}': ids must be int32 or int64, got {ids.dtype.name}")
    out = _lib.ops.dynemb_prepare(ids=ids, now=tf.cast(now, tf.int64),
                                  table_name=table_name, is_train=True,
                                  faae_coefficient=int(weight))
    out.set_shape(ids.shape)
    return out


def admitted_of(tickets: tf.Tensor) -> tf.Tensor:
    """Which ids the admission tickets admit (bool, same shape)."""
    return tf.not_equal(tickets, tf.constant(-1, tf.int64))


def trainable_keys(ids: Sequence[tf.Tensor], admitted: Sequence[tf.Tensor]) -> tf.Tensor:
    """The int64 ids admitted somewhere in the batch (any order, with repeats).

    Admission only grows within a batch, so an id admitted at any occurrence has a
    row once the batch is counted: exactly the ids whose gradients a plain step
    applies (the apply op drops ids without a row).
    """
    keys = tf.concat([tf.reshape(tf.cast(i, tf.int64), [-1]) for i in ids], 0)
    adm = tf.concat([tf.reshape(a, [-1]) for a in admitted], 0)
    return tf.boolean_mask(keys, adm)  # the engine's filter takes any order


# --------------------------------------------------------------------------
# The clock stamped by the pipeline
# --------------------------------------------------------------------------

def _ancestors(tensor: tf.Tensor) -> List[tf.Operation]:
    seen, stack, out = set(), [tensor.op], []
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        out.append(op)
        stack.extend(i.op for i in op.inputs)
    return out


def pipeline_now(now: tf.Tensor, get_next: Optional[tf.Operation], table_name: str,
                 eviction: bool) -> "callable":
    """How to compute, inside the pipeline, the clock a plain lookup would stamp.

    `now` is the plain lookup's clock tensor. Returns a function of the element's
    flat components, its position in the pass and the global step when the
    pass began (pipeline_start; called inside the map function) giving an
    int64 scalar: data time when `now` is computed from the same iterator
    (ASCEND_TIMESTAMP), a constant when it is one, the wall clock when it
    reads ``tf.timestamp()``, and for the global step, the step that will
    train the batch: the pass's start plus the batches before it times the
    step's increment, when the graph advances the step by a constant
    (optimizer.minimize(global_step=...)), so one process stamps what the
    in-step lookups of several ranks stamp, whatever the pipeline's lead;
    else the step read in the pipeline (which may lag by that lead).
    """
    sources, blockers, _ = walk(now)
    if not blockers and (not sources or (get_next is not None and sources[0] is get_next)):
        trace = Trace(tensor=now, get_next=sources[0] if sources else None,
                      ops=walk(now)[2])
        return lambda comps, index, start: tf.cast(replay(trace, comps if sources else []),
                                                   tf.int64)
    ancestry = _ancestors(now)
    if any(op.type == "Timestamp" for op in ancestry):
        return lambda comps, index, start: tf.cast(tf.timestamp(), tf.int64)
    gs = tf.compat.v1.train.get_global_step(now.graph)
    if gs is not None and any(op.name == gs.op.name for op in ancestry):
        if isinstance(gs, tf.Variable) and gs.op.type == "VarHandleOp":
            step = _step_increment(gs)
            if step is not None:
                return lambda comps, index, start: start + step * index
            logger.warning("table '%s': the graph does not advance the global step by a "
                           "constant amount per step; the input pipeline stamps last access "
                           "with the step it reads, which may lag the step that trains the "
                           "batch by the pipeline's lead", table_name)
            return lambda comps, index, start: read_by_name(gs)
        if eviction:
            raise GraphModificationError(
                f"table '{table_name}' evicts by global step, but the global step is a "
                f"reference variable, which the input pipeline cannot read; create it as a "
                f"resource variable (TensorFlow 2's default: do not call "
                f"tf.compat.v1.disable_resource_variables() or disable_v2_behavior()), or "
                f"feed a data timestamp (ASCEND_TIMESTAMP)")
        logger.warning("table '%s': the global step is a reference variable; the input "
                       "pipeline stamps last access with 0 (harmless: the table does not "
                       "evict)", table_name)
        return lambda comps, index, start: tf.constant(0, tf.int64)
    raise GraphModificationError(
        f"table '{table_name}': cannot compute the lookup's clock ('{now.name}') in the "
        f"input pipeline ({'; '.join(blockers) or 'it comes from another iterator'}); use "
        f"the global step, the wall clock or a data timestamp from the same iterator")


def pipeline_start(graph: tf.Graph) -> Optional["callable"]:
    """What a rebuilt pipeline reads when a pass begins (extend_iterator's
    start_fn): the global step, when it is a resource variable."""
    gs = tf.compat.v1.train.get_global_step(graph)
    if gs is not None and isinstance(gs, tf.Variable) and gs.op.type == "VarHandleOp":
        return lambda: read_by_name(gs)
    return None


def _step_increment(gs: tf.Variable) -> Optional[int]:
    """How much one training step advances the global step: the sum of the
    constant increments (AssignAddVariableOp, as apply_gradients(global_step=)
    builds them) that the graph applies to it; None when a computed
    increment or a decrement writes it, or nothing does (a hook may then
    change it between steps). Assignments are not steps: the initializer,
    a Saver's restore or warm start set it before training."""
    handle = gs.handle.op.name
    total, writers = 0, 0
    for op in gs.graph.get_operations():
        if op.type not in ("AssignAddVariableOp", "AssignSubVariableOp") or \
                op.inputs[0].op.name != handle:
            continue
        value = tf.get_static_value(op.inputs[1])
        if op.type != "AssignAddVariableOp" or value is None:
            return None
        total, writers = total + int(value), writers + 1
    return total if writers else None


def read_by_name(var: tf.Variable) -> tf.Tensor:
    """`var`'s value (int64), read through a handle made here from its resource
    name rather than through the variable's own handle: inside a tf.data
    function, capturing the variable would make the dataset stateful, which a
    one-shot iterator (make_one_shot_iterator) refuses; a handle op of the
    function's own finds the same resource."""
    h = var.handle.op
    handle = gen_resource_variable_ops.var_handle_op(
        dtype=var.dtype.base_dtype, shape=var.shape,
        container=h.get_attr("container"), shared_name=h.get_attr("shared_name"))
    return tf.cast(gen_resource_variable_ops.read_variable_op(handle, var.dtype.base_dtype),
                   tf.int64)


def table_evicts(table_name: str, graph: Optional[tf.Graph] = None) -> bool:
    """Whether the table evicts (its engine threshold, or a lookup's or
    FeatureSpec's eviction_threshold in `graph`: mxRec's 0 evicts too)."""
    g = graph if graph is not None else tf.compat.v1.get_default_graph()
    cfg = _state.graph_state(g).evict_configs.get(table_name) or {}
    return bool(_engine_config(table_name).eviction_threshold) or \
        cfg.get("eviction_threshold") is not None


def _engine_config(table_name: str) -> _lib.TableConfig:
    missing = GraphModificationError(f"table '{table_name}' is not registered in this "
                                     f"process; create it with create_table()")
    with _lib.table_handle(table_name, missing) as h:
        cfg = _lib.TableConfig()
        _lib.clib.dynemb_table_get_config(h, ctypes.byref(cfg))
        return cfg


# --------------------------------------------------------------------------
# Guard and rewrites of lookup and apply ops
# --------------------------------------------------------------------------

def guard_lookup(lookup_op: tf.Operation, table_name: str, how: str) -> None:
    """Makes `lookup_op` fail at run time until it is rewritten (a control input
    on a failing Assert). `how` tells the user what to call."""
    with lookup_op.graph.as_default(), lookup_op.graph.name_scope(None), \
            tf.name_scope(GUARD_MARK):
        # No quotes in the message: TensorFlow's Assert prints them escaped.
        check = tf.debugging.Assert(
            tf.constant(False),
            [f"dynemb: lookup {lookup_op.name} of table {table_name} is waiting for "
             f"its input pipeline (sparse_lookup with modify_graph=True): {how}"])
    if hasattr(check, "mark_used"):
        check.mark_used()  # no "Object was never used" log when the guard is dropped
    lookup_op._add_control_input(check)  # pylint: disable=protected-access


def drop_guard(op: tf.Operation) -> None:
    """Removes guard_lookup's failing control input from `op` (if any)."""
    keep = [c for c in op.control_inputs if GUARD_MARK not in c.name]
    if len(keep) != len(op.control_inputs):
        op._remove_all_control_inputs()  # pylint: disable=protected-access
        if keep:
            op._add_control_inputs(keep)  # pylint: disable=protected-access


def rewrite_lookup(lookup_op: tf.Operation, tickets: tf.Tensor, table_name: str,
                   dim: int, stamp: Optional[tf.Tensor] = None) -> tf.Tensor:
    """Makes a DynembLookup read-only and read its rows through `tickets` (the
    admission tickets of its ids, any shape): ids not admitted as of the
    lookup's own batch read the table's default value, even if a later batch,
    prepared ahead, admitted them since (dynemb_lookup_prepared). The lookup's
    gradient still reaches the table; the apply op trains what a plain step
    would train. `stamp`: the clock value the batch was prepared with (its
    rows' last access), which becomes the lookup's `now` (the prepared read
    does not use it; EvictHook counts from the latest one the step read).
    Returns the lookup's output."""
    del dim  # the engine knows the table's width and default value
    if lookup_op.type != "DynembLookup":
        raise GraphModificationError(f"'{lookup_op.name}' is a {lookup_op.type} op, not a "
                                     f"DynembLookup")
    drop_guard(lookup_op)
    graph = lookup_op.graph
    with graph.as_default(), graph.name_scope(None), \
            tf.name_scope(lookup_op.name + "_tickets"):
        flat = tf.reshape(tickets, [-1])
    set_input(lookup_op, "tickets", flat)
    if stamp is not None:
        set_input(lookup_op, "now", tf.cast(stamp, tf.int64))
    lookup_op._set_attr("is_train", attr_value_pb2.AttrValue(b=False))  # pylint: disable=protected-access
    lookup_op._set_attr("use_tickets", attr_value_pb2.AttrValue(b=True))  # pylint: disable=protected-access
    return lookup_op.outputs[0]


def _table_applies(graph: tf.Graph, table_name: str) -> List[tf.Operation]:
    return [op for op in graph.get_operations() if op.type == "DynembApply"
            and op.get_attr("table_name").decode() == table_name]


# How the keys of an apply op are made from lookups' ids: a lookup op (its
# flattened ids) or a list of such trees concatenated in order.
TicketPlan = Tuple[tf.Operation, Any]

_SAME_ORDER_OPS = ("Identity", "Reshape", "Cast")  # keep the element order


def plan_ticket_apply(graph: tf.Graph, table_name: str,
                      lookup_ops: Sequence[tf.Operation]) -> Optional[TicketPlan]:
    """If `table_name` has exactly one DynembApply op and its keys are the ids of
    exactly `lookup_ops` (each once: a lookup's gradient carries its ids
    flattened, and TensorFlow concatenates the indices of several), returns
    (apply op, tree) where the tree mirrors that concatenation with lookup ops
    at the leaves; else None (the caller falls back to trainable keys)."""
    applies = _table_applies(graph, table_name)
    if len(applies) != 1 or not lookup_ops:
        return None
    by_ids: Dict[str, List[tf.Operation]] = {}
    for op in lookup_ops:
        by_ids.setdefault(input_of(op, "ids").name, []).append(op)

    def mirror(t: tf.Tensor, depth: int) -> Any:
        if depth > 64:
            return None
        if by_ids.get(t.name):
            return by_ids[t.name].pop()
        op = t.op
        if op.type in _SAME_ORDER_OPS:
            return mirror(op.inputs[0], depth + 1)
        if op.type == "ConcatV2" and tf.get_static_value(op.inputs[-1]) == 0:
            parts = [mirror(x, depth + 1) for x in op.inputs[:-1]]
            return None if any(p is None for p in parts) else parts
        return None

    tree = mirror(input_of(applies[0], "keys"), 0)
    if tree is None or any(by_ids.values()):
        return None
    return applies[0], tree


def ticket_apply(plan: TicketPlan, tickets_of: Dict[str, tf.Tensor]) -> None:
    """Switches the plan's apply op to the prepared apply (tickets): its `tickets` input
    becomes the admission tickets of the planned lookups (`tickets_of`: lookup op
    name -> the tickets it reads with) in the order of its keys."""
    apply_op, tree = plan
    graph = apply_op.graph
    _claim(graph, table_name=apply_op.get_attr("table_name").decode(), ops=[apply_op])

    def build(node: Any) -> tf.Tensor:
        if isinstance(node, list):
            return tf.concat([build(n) for n in node], 0)
        return tf.reshape(tickets_of[node.name], [-1])

    with graph.as_default(), graph.name_scope(None), \
            tf.name_scope(apply_op.name + "_tickets"):
        tickets = build(tree)
    set_input(apply_op, "tickets", tickets)
    apply_op._set_attr("use_tickets", attr_value_pb2.AttrValue(b=True))  # pylint: disable=protected-access


def _claim(graph: tf.Graph, table_name: str, ops: Sequence[tf.Operation]) -> None:
    """Marks apply ops as switched to prepared lookups; an op switched before
    means lookups of its table were modified twice."""
    filtered = _state.switched_applies(graph)
    again = [op.name for op in ops if op.name in filtered]
    if again:
        raise GraphModificationError(
            f"table '{table_name}': apply op '{again[0]}' was already switched to the "
            f"prepared lookups of an earlier modification; build every lookup of a table "
            f"before calling modify_graph_and_start_emb_cache() / start_asc_pipeline()")
    filtered.update(op.name for op in ops)


def filter_applies(graph: tf.Graph, table_name: str, keys_sets: Sequence[tf.Tensor]) -> int:
    """Drops, in every DynembApply of `table_name`, the gradient rows of ids that
    are not in any of `keys_sets` (int64 trainable keys). Returns how many
    apply ops were filtered."""
    applies = _table_applies(graph, table_name)
    _claim(graph, table_name, applies)
    for op in applies:
        with graph.as_default(), graph.name_scope(None), \
                tf.name_scope(op.name + "_trainable"):
            trainable = (keys_sets[0] if len(keys_sets) == 1 else
                         tf.concat(list(keys_sets), 0))
        # The engine drops the gradient rows of keys outside `trainable`
        # (a filtered dynemb_apply) while it dedupes the batch.
        set_input(op, "trainable", trainable)
        op._set_attr("use_trainable", attr_value_pb2.AttrValue(b=True))  # pylint: disable=protected-access
    return len(applies)
