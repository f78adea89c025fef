"""Sparse SGD (TF's GradientDescentOptimizer on the looked-up rows)."""
from dynemb import _lib
from dynemb.optimizers.base import SparseOptimizer


class CustomizedGradientDescent(SparseOptimizer):
    KIND = _lib.OPT_SGD
    optimizer_type = "gradient_descent"


def create_hash_optimizer(learning_rate, use_locking=False, name="GradientDescent"):
    return CustomizedGradientDescent(learning_rate, use_locking, name)
