"""The dense side of several ranks: the same dense variables on every rank.

Tables are sharded (each key lives on one rank), but the dense part of a
model is replicated: every rank holds all of it, and it must stay the same
everywhere. Two things keep it so, as in Horovod:

* ``broadcast_global_variables()`` (an op) and
  ``BroadcastGlobalVariablesHook`` (runs it when the session is created)
  give every rank rank 0's values, so ranks start equal whatever their seeds
  or initializers did;
* ``DistributedOptimizer(opt)`` wraps a TensorFlow optimizer: the gradients
  of dense variables are averaged (or summed) over ranks in one fused
  all-reduce per step, and every rank then applies the same update. The
  gradients of dynemb's sparse variables (tables) pass through unchanged:
  their rows are already summed at the rows' owners (DynembShardedApply).

``allreduce_gradients(grads)`` is that reduction for scripts that take
their gradients with tf.gradients, and ``allgather_object(obj)`` gathers a
Python object from every rank (metrics computed from each rank's
predictions, for example).

On one process all of it is the identity: scripts need no branch.
"""
from __future__ import annotations

import pickle
from typing import Any, Optional, Sequence

import tensorflow as tf

from dynemb import _state
from dynemb.core import exchange

BROADCAST_CHAIN = "broadcast"


def _is_sparse_variable(var: Any) -> bool:
    st = _state.existing_graph_state(tf.compat.v1.get_default_graph())
    return st is not None and getattr(var, "name", None) in st.anchors


def broadcast_global_variables(root_rank: int = 0) -> tf.Operation:
    """An op giving every float32, float64, int32 and int64 global variable
    rank 0's value (one exchange per type). Variables of other types are
    left as they are: initialise them from constants. On one process, a
    no-op."""
    if root_rank != 0:
        raise ValueError("broadcast_global_variables(root_rank=%r): dynemb broadcasts "
                         "from rank 0" % (root_rank,))
    variables = [v for v in tf.compat.v1.global_variables()
                 if v.dtype.base_dtype in exchange.REDUCIBLE]
    if not exchange.several_ranks() or not variables:
        return tf.no_op(name="broadcast_global_variables")
    values = exchange.allreduce([v.read_value() for v in variables], "broadcast",
                                chain=BROADCAST_CHAIN)
    return tf.group(*[v.assign(x) for v, x in zip(variables, values)],
                    name="broadcast_global_variables")


def allreduce_gradients(grads: Sequence[Any], average: bool = True) -> list:
    """Dense gradients (tensors or IndexedSlices, None kept) reduced over
    ranks in one all-reduce: their mean, or their sum (`average`=False,
    for losses divided by the global batch size). The identity on one
    process."""
    if not exchange.several_ranks():
        return list(grads)
    at = [i for i, g in enumerate(grads) if g is not None]
    if not at:
        return list(grads)
    dense = []
    for i in at:
        g = tf.convert_to_tensor(grads[i])  # (IndexedSlices become dense)
        if g.dtype not in (tf.float32, tf.float64):
            raise TypeError("allreduce_gradients: gradient %d is %s; dynemb reduces float32 "
                            "and float64 gradients" % (i, g.dtype.name))
        dense.append(g)
    out = list(grads)
    for i, g in zip(at, exchange.allreduce(dense, "mean" if average else "sum")):
        out[i] = g
    return out


def allgather_object(obj: Any) -> list:
    """`obj` (anything pickle can write) from every rank, in rank order;
    every rank calls it at the same point. [obj] on one process."""
    if not exchange.several_ranks():
        return [obj]
    w = _state._world()  # pylint: disable=protected-access
    return [pickle.loads(b) for b in w.allgather(_state.OBJECT_CHANNEL, pickle.dumps(obj))]


class BroadcastGlobalVariablesHook(tf.compat.v1.train.SessionRunHook):
    """Runs broadcast_global_variables() once the session exists (after the
    variables were initialised or restored): every rank starts from rank 0's
    dense variables."""

    def __init__(self, root_rank: int = 0):
        self.root_rank = root_rank
        self._op: Optional[tf.Operation] = None

    def begin(self) -> None:
        self._op = broadcast_global_variables(self.root_rank)

    def after_create_session(self, session, coord) -> None:
        del coord
        session.run(self._op)


class DistributedOptimizer(tf.compat.v1.train.Optimizer):
    """`optimizer` with its dense gradients reduced over ranks: `average`
    (the default, for losses that are each rank's mean) divides their sum by
    the rank count. All dense gradients of a step go through one all-reduce.
    Sparse (table) gradients are left to the tables."""

    def __init__(self, optimizer: tf.compat.v1.train.Optimizer, average: bool = True,
                 name: Optional[str] = None, use_locking: bool = False):
        super().__init__(use_locking=use_locking,
                         name=name or "Distributed" + type(optimizer).__name__)
        self._optimizer = optimizer
        self._average = bool(average)

    def compute_gradients(self, *args: Any, **kwargs: Any) -> list:
        pairs = self._optimizer.compute_gradients(*args, **kwargs)
        if not exchange.several_ranks():
            return pairs
        dense = [i for i, (g, v) in enumerate(pairs)
                 if g is not None and not _is_sparse_variable(v)]
        reduced = allreduce_gradients([pairs[i][0] for i in dense], self._average)
        out = list(pairs)
        for i, g in zip(dense, reduced):
            out[i] = (g, pairs[i][1])
        return out

    def apply_gradients(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.apply_gradients(*args, **kwargs)

    def get_slot(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot(*args, **kwargs)

    def get_slot_names(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.get_slot_names(*args, **kwargs)

    def variables(self, *args: Any, **kwargs: Any) -> Any:
        return self._optimizer.variables(*args, **kwargs)
