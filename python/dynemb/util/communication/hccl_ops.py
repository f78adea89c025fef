"""Ranks and the all-reduce of mxRec's collective layer.

mxRec's path for the rank queries is ``mx_rec.util.communication.hccl_ops``;
its ``mx_rec.util.tf_version_adapter.hccl_ops`` (the HCCL op module, whose
``allreduce`` scripts call on dense gradients) is this same module here.

The rank functions (dynemb._state, shared with ``dynemb.util.initialize``)
answer from the MPI launch's world, or 0 of 1 for a process started alone.
An all-reduce over one rank returns its input; over several ranks it is a
DynembAllreduce op (dynemb.core.exchange) in the graph's train chain.
"""
from __future__ import annotations

from typing import Any

import tensorflow as tf

from dynemb._state import get_local_rank_size, get_rank_id, get_rank_size
from dynemb.core import exchange

# HCCL's reductions, and the mean that scripts use for averaged gradients.
# Over one rank each of them is the identity.
REDUCTIONS = ("sum", "prod", "max", "min", "mean")
# The one communication group of a single process (HCCL's name for the group
# of all ranks).
WORLD_GROUP = "hccl_world_group"


def allreduce(tensor: Any, reduction: str = "sum", fusion: int = 1, fusion_id: int = -1,
              group: str = WORLD_GROUP) -> Any:
    """Reduces `tensor` over all ranks with `reduction` ("sum", "prod", "max",
    "min" or "mean") and returns the result, of `tensor`'s shape and dtype.

    With one rank that result is `tensor` itself: a tensor comes back through
    tf.identity, a tf.IndexedSlices unchanged. `fusion` (0: never fuse, 1: fuse
    by gradient split, 2: fuse ops of the same `fusion_id`) and `fusion_id` are
    HCCL scheduling hints, checked and without effect in one process. `group`
    must be the world group: dynemb creates no other.

    On several ranks it reduces float32, float64, int32 and int64 tensors (an
    IndexedSlices is made dense first) in rank order, so every rank gets the
    same bits ("mean" of integers raises TypeError).

    Raises ValueError for an unknown reduction, fusion or group.
    """
    if reduction not in REDUCTIONS:
        raise ValueError("allreduce(reduction=%r): unknown reduction; use one of %s"
                         % (reduction, ", ".join(REDUCTIONS)))
    if fusion not in (0, 1, 2):
        raise ValueError("allreduce(fusion=%r): use 0 (no fusion), 1 (fuse by gradient "
                         "split) or 2 (fuse by fusion_id)" % (fusion,))
    if not isinstance(fusion_id, int) or isinstance(fusion_id, bool):
        raise ValueError("allreduce(fusion_id=%r): must be an int (-1: none)" % (fusion_id,))
    if group != WORLD_GROUP:
        raise ValueError("allreduce(group=%r): no such group; dynemb runs one process, "
                         "whose only group is %r" % (group, WORLD_GROUP))
    if exchange.several_ranks():
        t = tf.convert_to_tensor(tensor)  # (an IndexedSlices becomes dense)
        return exchange.allreduce([t], reduction)[0]
    if isinstance(tensor, tf.IndexedSlices):
        return tensor
    return tf.identity(tensor)


__all__ = ["REDUCTIONS", "WORLD_GROUP", "allreduce", "get_local_rank_size", "get_rank_id",
           "get_rank_size"]
