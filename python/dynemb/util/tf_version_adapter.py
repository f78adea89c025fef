"""Collective-op shims (mxRec: ``mx_rec.util.tf_version_adapter``).

dynemb trains on one worker per process group here, so the all-reduce of
dense gradients is the identity; a multi-worker run must bring its own
collective (e.g. Horovod) and is refused with a clear error until then.
"""
import tensorflow as tf

from dynemb import _state


class _HcclOps:
    @staticmethod
    def allreduce(tensor, reduction="sum", fusion=1, fusion_id=-1, group="hccl_world_group"):
        del fusion, fusion_id, group
        if reduction not in ("sum", "mean", "max", "min", "prod"):
            raise ValueError("allreduce: unknown reduction %r" % (reduction,))
        if _state.get_rank_size() != 1:
            raise NotImplementedError(
                "dynemb: allreduce across %d workers is not available; run one "
                "worker (rank_size 1)" % _state.get_rank_size())
        return tf.identity(tensor)


hccl_ops = _HcclOps()
