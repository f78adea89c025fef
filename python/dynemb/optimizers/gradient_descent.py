"""Sparse SGD (TF's GradientDescentOptimizer on the looked-up rows), with
mxRec's weight decay: each row moves by -lr * (gradient + weight_decay * row)."""
import math
from typing import Optional

from dynemb import _lib
from dynemb.optimizers.base import SparseOptimizer


class CustomizedGradientDescent(SparseOptimizer):
    KIND = _lib.OPT_SGD
    optimizer_type = "gradient_descent"

    def __init__(self, learning_rate, use_locking, name, weight_decay: Optional[float] = None):
        super().__init__(learning_rate, use_locking, name)
        wd = 0.0 if weight_decay is None else weight_decay
        if isinstance(wd, bool) or not (isinstance(wd, (int, float)) and math.isfinite(wd)
                                        and wd >= 0):
            raise ValueError("%s: weight_decay must be a finite number >= 0 (mxRec: 1e-5 "
                             "to 1e-2), got %r" % (name, weight_decay))
        self.weight_decay = float(wd)


def create_hash_optimizer(learning_rate, use_locking=False, name="GradientDescent",
                          use_fusion_optim=False, weight_decay=None):
    """use_fusion_optim (mxRec: a fused Ascend operator) changes nothing here:
    the engine's update is one pass already."""
    del use_fusion_optim
    return CustomizedGradientDescent(learning_rate, use_locking, name, weight_decay)
