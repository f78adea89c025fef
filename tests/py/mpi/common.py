"""What the scripts of tests/py/mpi share: the rank and size of this
process, and each rank's slice of a global batch."""
import tensorflow as tf

import dynemb
from dynemb.util.communication import hccl_ops


def start(**init_kwargs):
    """Graph mode, init(), and (rank, size) of this process."""
    tf.compat.v1.disable_eager_execution()
    dynemb.init(**init_kwargs)
    return hccl_ops.get_rank_id(), hccl_ops.get_rank_size()


def rank_slice(rank, size, label="y"):
    """A dataset map: this rank's rows [r*n/N, (r+1)*n/N) of every global
    batch (a dict), with the global batch's size as "n"."""
    def take(x):
        n = tf.shape(x[label], out_type=tf.int64)[0]
        lo, hi = n * rank // size, n * (rank + 1) // size
        return dict({k: v[lo:hi] for k, v in x.items()}, n=n)
    return take
