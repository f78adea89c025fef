"""hccl_ops.allreduce on several ranks (tests/py/test_allreduce.py): every
reduction of every dtype, of tensors whose values depend on the rank, in one
step; writes $RESULTS/<rank>.npz with the results by name."""
import os

import numpy as np
import tensorflow as tf

from common import start
from dynemb.util.communication import hccl_ops
from dynemb.util.tf_version_adapter import hccl_ops as adapter_ops

rank, size = start()
assert adapter_ops.allreduce is hccl_ops.allreduce


def values(dtype):
    """What rank `rank` contributes (the test computes the same)."""
    base = np.array([3, -2, 7, 1, 40000, -5], np.int64) * (rank + 1) + rank
    if dtype in ("float32", "float64"):
        return (base / 3.0).astype(dtype)
    if dtype == "int64":
        return base * (1 << 40)
    return base.astype(np.int32) * 50000        # int32 products and sums wrap


out = {}
for dtype in ("float32", "float64", "int32", "int64"):
    t = tf.constant(values(dtype).reshape([2, 3]))
    for red in ("sum", "mean", "prod", "max", "min"):
        if red == "mean" and dtype.startswith("int"):
            continue
        out[f"{dtype}_{red}"] = hccl_ops.allreduce(t, red)
with tf.compat.v1.Session() as s:
    got = s.run(out)
np.savez(os.path.join(os.environ["RESULTS"], "%d.npz" % rank), **got)
