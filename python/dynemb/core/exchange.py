"""The graph's exchanges with the other ranks, and the order they run in.

On several ranks (an MPI launch) each table is sharded: a rank's engine
table holds the keys that ``dynemb_key_shard`` gives it, and lookups and
gradient applies are ops of the sharded op library (tf/sharded_ops.c) that
send keys, rows and gradients to their owners. Dense tensors are reduced by
its ``DynembAllreduce``.

Why a chain: every such op blocks one of TensorFlow's inter-op threads until
every rank has joined its exchange, and TensorFlow may start the ops of a
step in a different order on each rank. With fewer threads than exchange
ops, two ranks could each wait in an exchange the other has not begun (this
was measured: docs/distributed.md). So the exchange ops of a graph form
chains: each op waits (a control dependency) for the one built before it in
its chain, so every rank runs a chain's exchanges one at a time in the same
order, whatever its threads and scheduling. Train lookups, gradient applies
and dense all-reduces share the "train" chain (a train step runs them all);
eval lookups form one chain per input iterator, so an eval step runs no
train lookup and pulls no training batch; an all-reduce joins the chain of
the exchanges its input comes from (the train chain when none).

Consequences for scripts (docs/distributed.md): a step that fetches only
some of a chain's ops also runs the ops built before them in that chain;
two chains' exchanges should not run in one step (they could wait for each
other, which ends in the exchange's timeout error, never in a hang).
"""
from __future__ import annotations

from typing import Any, Hashable, Optional, Sequence

import tensorflow as tf

from dynemb import _state
from dynemb.graph.trace import ancestors

TRAIN_CHAIN = "train"


def several_ranks() -> bool:
    """Whether this process is one of several ranks of an MPI launch."""
    return _state.get_rank_size() > 1


def _link(op: tf.Operation, chain: Hashable) -> None:
    """Makes `op` the tail of `chain` in its graph, after the previous tail."""
    st = _state.graph_state(op.graph)
    tail = st.exchange_tails.get(chain)
    if tail is not None:
        op._add_control_input(tail)  # pylint: disable=protected-access
    st.exchange_tails[chain] = op
    st.exchange_chain_of[op.name] = chain


def chain_of_inputs(tensors: Sequence[tf.Tensor], limit: int = 100_000) -> Hashable:
    """The chain of the latest exchange op the tensors are computed from (an
    all-reduce of eval metrics joins its eval lookups' chain), or the train
    chain when there is none."""
    if not tensors:
        return TRAIN_CHAIN
    chains = _state.graph_state(tensors[0].graph).exchange_chain_of
    found = {op._id: chains[op.name]  # pylint: disable=protected-access
             for op in ancestors([t.op for t in tensors], lambda o: o.name in chains,
                                 control=True)
             if op.name in chains}  # (what an exchange op waits for is in its chain)
    return found[max(found)] if found else TRAIN_CHAIN


def sharded_lookup(table_name: str, ids: tf.Tensor, now: tf.Tensor, anchor: tf.Tensor,
                   is_train: bool, chain: Hashable, send_count: int = 0,
                   replicated: bool = False, weight: int = 1,
                   found: bool = False) -> Any:
    """Rows of `ids` (any shape) as [n, dim], each looked up (train: counted,
    inserted, stamped with the latest `now` of all ranks) at its owner.
    send_count > 0: the unique ids sent to each owner must fit it (mxRec's
    static-shape mode). replicated (is_dp tables): every rank holds all the
    table; every rank's ids are looked up on every replica alike. weight:
    the sightings one occurrence counts for admission (faae_coefficient).
    found=True: returns (rows, has_row), has_row [n] bool saying which ids
    read a row (the others read the table's default)."""
    out, has_row = _state.sharded_ops().dynemb_sharded_lookup(
        ids=ids, now=now, anchor=anchor, table_name=table_name, is_train=bool(is_train),
        send_count=int(send_count), replicated=bool(replicated),
        faae_coefficient=int(weight), found=bool(found),
        channel=_state.next_exchange_channel(), ranks=_state.get_rank_size())
    _link(out.op, chain)
    return (out, has_row) if found else out


def sharded_apply(table_name: str, keys: tf.Tensor, grads: tf.Tensor,
                  learning_rate: tf.Tensor, average: bool,
                  replicated: bool = False) -> tf.Tensor:
    """Applies every rank's (key, gradient row) pairs at the keys' owners (on
    every replica when `replicated`), one update per key with the rows
    summed over ranks (divided by the rank count when `average`)."""
    out = _state.sharded_ops().dynemb_sharded_apply(
        keys=keys, grads=grads, learning_rate=learning_rate, table_name=table_name,
        average=bool(average), replicated=bool(replicated), channel=_state.next_exchange_channel(),
        ranks=_state.get_rank_size())
    _link(out.op, TRAIN_CHAIN)
    return out


REDUCIBLE = (tf.float32, tf.float64, tf.int32, tf.int64)


def allreduce(tensors: Sequence[tf.Tensor], reduction: str = "sum",
              chain: Optional[Hashable] = None) -> list:
    """Tensors reduced over all ranks: "sum", "mean" (float types), "prod",
    "max", "min", or "broadcast" (rank 0's values); one exchange per dtype
    (float32, float64, int32, int64), every rank getting the same bits. The
    chain defaults to that of the exchanges the tensors come from."""
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    for i, t in enumerate(tensors):
        if t.dtype not in REDUCIBLE:
            raise TypeError("allreduce: tensor %d is %s; dynemb reduces float32, float64, "
                            "int32 and int64 tensors (cast it with tf.cast)"
                            % (i, t.dtype.name))
        if reduction == "mean" and t.dtype.is_integer:
            raise TypeError("allreduce(reduction='mean'): tensor %d is %s; the mean of "
                            "integers is not an integer: reduce with 'sum', or cast to a "
                            "float type first" % (i, t.dtype.name))
    if chain is None:
        chain = chain_of_inputs(tensors)
    out: list = [None] * len(tensors)
    for dtype in REDUCIBLE:
        at = [i for i, t in enumerate(tensors) if t.dtype == dtype]
        if not at:
            continue
        reduced = list(_state.sharded_ops().dynemb_allreduce(
            tensors=[tensors[i] for i in at], reduction=reduction,
            channel=_state.next_exchange_channel(), ranks=_state.get_rank_size()))
        for i, o in zip(at, reduced):
            o.set_shape(tensors[i].shape)
            out[i] = o
        _link(reduced[0].op, chain)
    return out
