"""Lazy AdamW: the sparse optimizer of mxRec's second API generation
(``mxrec.AdamWOptimizer``, here ``dynemb.v2.AdamWOptimizer``).

The engine does the math (DYNEMB_OPT_ADAMW, src/optim.c): lazy Adam plus
Loshchilov & Hutter's decoupled weight decay, each row in a batch first
shrinking by learning_rate * weight_decay times its value, then taking the
Adam step. Rows absent from a batch neither step nor decay; the bias
correction counts the table's apply calls, as lazy Adam's does. The class
lives here, beside the first generation's optimizers, because it is one of
them in every respect but its constructor's argument names.
"""
from __future__ import annotations

import math
from typing import Any

import tensorflow as tf

from dynemb import _lib
from dynemb.optimizers.base import SparseOptimizer

# mxRec's documented ranges (api/optimizers_apis.md), as (low, high, high
# included). epsilon must also be > 0 here: the engine divides by
# sqrt(v) + epsilon, and a row whose v is still 0 would read 0 / 0.
_RANGES = {"learning_rate": (0.0, 10.0, True), "weight_decay": (0.0, 10.0, True),
           "beta_1": (0.0, 1.0, False), "beta_2": (0.0, 1.0, False),
           "epsilon": (0.0, 1.0, False)}


def _number(value: Any, arg: str, name: str) -> float:
    """`value` (a number, or a tensor TensorFlow can evaluate while building
    the graph) as a float in its documented range."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        static = tf.get_static_value(value)
        if static is None or getattr(static, "size", 1) != 1:
            raise TypeError(
                "%s: %s must be a number or a constant scalar tensor (the engine takes "
                "it when the optimizer first trains a table); got %r. Pass a Python float"
                % (name, arg, value))
        value = static
    if isinstance(value, bool) or not isinstance(value, (int, float)) and not hasattr(
            value, "__float__"):
        raise TypeError("%s: %s must be a number, got %r" % (name, arg, value))
    v = float(value)
    low, high, high_in = _RANGES[arg]
    if not (math.isfinite(v) and low <= v and (v <= high if high_in else v < high)):
        raise ValueError("%s: %s = %r is out of range; it must be in [%g, %g%s"
                         % (name, arg, value, low, high, "]" if high_in else ")"))
    if arg == "epsilon" and v == 0.0:
        raise ValueError("%s: epsilon = 0 is not supported (a row whose second moment is "
                         "still 0 would divide 0 by 0); pass a small positive epsilon such "
                         "as 1e-8" % name)
    return v


class AdamWOptimizer(SparseOptimizer):
    """tf.compat.v1.train.Optimizer for tables: apply_gradients / minimize /
    compute_gradients as the first generation's sparse optimizers.
    learning_rate may be a tensor or a schedule (read at every step, the
    decay scales with it); the other hyper-parameters are fixed numbers."""
    KIND = _lib.OPT_ADAMW
    optimizer_type = "adamw"
    SLOT_NAMES = ("m", "v")

    def __init__(self, learning_rate: Any = 0.01, weight_decay: Any = 0.004,
                 beta_1: Any = 0.9, beta_2: Any = 0.999, epsilon: Any = 1e-8,
                 name: str = "AdamWOptimizer"):
        if not isinstance(name, str) or not 1 <= len(name) <= 128:
            raise ValueError("AdamWOptimizer: name must be a string of 1 to 128 "
                             "characters, got %r" % (name,))
        if isinstance(learning_rate, (int, float)) and not isinstance(learning_rate, bool):
            _number(learning_rate, "learning_rate", name)
        super().__init__(learning_rate, False, name)
        # (not SparseOptimizer.weight_decay: that one adds an L2 term to the
        # gradients; this one is the engine's decoupled decay)
        self.decoupled_weight_decay = _number(weight_decay, "weight_decay", name)
        self.beta_1 = _number(beta_1, "beta_1", name)
        self.beta_2 = _number(beta_2, "beta_2", name)
        self.epsilon = _number(epsilon, "epsilon", name)

    def _hyper(self) -> dict[str, float]:
        return {"beta1": self.beta_1, "beta2": self.beta_2, "epsilon": self.epsilon,
                "weight_decay": self.decoupled_weight_decay}
