"""Lazy Adam: TF's Adam update applied only to the rows in the batch; the
bias-correction step counts the table's apply calls."""
from dynemb import _lib
from dynemb.optimizers.base import SparseOptimizer


class CustomizedLazyAdam(SparseOptimizer):
    KIND = _lib.OPT_ADAM
    optimizer_type = "lazy_adam"

    def __init__(self, learning_rate, beta1, beta2, epsilon, use_locking, name):
        super().__init__(learning_rate, use_locking, name)
        for k, v in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= v < 1.0:
                raise ValueError("%s: %s must be in [0, 1), got %r" % (name, k, v))
        if not epsilon > 0:
            raise ValueError("%s: epsilon must be > 0, got %r" % (name, epsilon))
        self.beta1, self.beta2, self.epsilon = float(beta1), float(beta2), float(epsilon)

    def _hyper(self):
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}


def create_hash_optimizer(learning_rate=0.001, beta1=0.9, beta2=0.999, epsilon=1e-8,
                          use_locking=False, name="LazyAdam"):
    return CustomizedLazyAdam(learning_rate, beta1, beta2, epsilon, use_locking, name)
