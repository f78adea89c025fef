"""Lazy Adam: TF's Adam update applied only to the rows in the batch; the
bias-correction step counts the table's apply calls.

The engine checks beta1, beta2 and epsilon when a table is created with the
optimizer (dynemb_table_create names the table, the value and the rule)."""
from dynemb import _lib
from dynemb.optimizers.base import SparseOptimizer


class CustomizedLazyAdam(SparseOptimizer):
    KIND = _lib.OPT_ADAM
    optimizer_type = "lazy_adam"
    SLOT_NAMES = ("m", "v")

    def __init__(self, learning_rate, beta1, beta2, epsilon, use_locking, name):
        super().__init__(learning_rate, use_locking, name)
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def _hyper(self):
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}


def create_hash_optimizer(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                          name="LazyAdam", use_fusion_optim=False, use_locking=False):
    """mxRec's argument order. use_fusion_optim (a fused Ascend operator)
    changes nothing here: the engine's update is one pass already."""
    if not isinstance(name, str):  # (earlier dynemb had use_locking fifth)
        raise TypeError("lazy_adam.create_hash_optimizer: name must be a string, got %r; "
                        "pass use_locking by keyword" % (name,))
    del use_fusion_optim
    return CustomizedLazyAdam(learning_rate, beta1, beta2, epsilon, use_locking, name)
