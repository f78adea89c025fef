"""mxRec's ``mx_rec.util.tf_version_adapter``: where scripts import the HCCL
op module (``from mx_rec.util.tf_version_adapter import hccl_ops``) and the
NPU op module (``npu_ops``).

Here ``hccl_ops`` is ``dynemb.util.communication.hccl_ops``: the rank queries
and ``allreduce``. ``npu_ops`` holds what mxRec's examples call from
npu_bridge's module, with its host effect: ``dropout(x, keep_prob, ...)`` is
TensorFlow's dropout.
"""
from types import SimpleNamespace
from typing import Any, Optional

import tensorflow as tf

from dynemb.util.communication import hccl_ops


def _dropout(x: Any, keep_prob: Any = None, noise_shape: Any = None, seed: Optional[int] = None,
             name: Optional[str] = None) -> tf.Tensor:
    """npu_ops.dropout: keeps each element with probability keep_prob, scaled
    by 1 / keep_prob (tf.nn.dropout with rate = 1 - keep_prob)."""
    if keep_prob is None:
        raise ValueError("npu_ops.dropout: keep_prob is required (the probability of "
                         "keeping an element)")
    return tf.nn.dropout(x, rate=1 - keep_prob, noise_shape=noise_shape, seed=seed, name=name)


npu_ops = SimpleNamespace(dropout=_dropout)

__all__ = ["hccl_ops", "npu_ops"]
