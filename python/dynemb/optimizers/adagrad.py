"""Sparse Adagrad (TF's AdagradOptimizer: accum += g^2; w -= lr g / sqrt(accum)).

The engine checks the hyper-parameters when a table is created with the
optimizer (dynemb_table_create names the table, the value and the rule)."""
from dynemb import _lib
from dynemb.optimizers.base import SparseOptimizer


class CustomizedAdagrad(SparseOptimizer):
    KIND = _lib.OPT_ADAGRAD
    optimizer_type = "adagrad"
    SLOT_NAMES = ("accumulator",)

    def __init__(self, learning_rate, initial_accumulator_value, use_locking, name):
        super().__init__(learning_rate, use_locking, name)
        self.initial_accumulator_value = float(initial_accumulator_value)

    def _hyper(self):
        return {"initial_accumulator_value": self.initial_accumulator_value}


def create_hash_optimizer(learning_rate=0.001, initial_accumulator_value=0.9,
                          use_locking=False, name="Adagrad"):
    return CustomizedAdagrad(learning_rate, initial_accumulator_value, use_locking, name)
