"""Sparse FTRL-Proximal (TF's FtrlOptimizer / ApplyFtrlV2 math).

The engine checks the hyper-parameters' ranges when a table is created with
the optimizer (dynemb_table_create names the table, the value and the rule)."""
from dynemb import _lib
from dynemb.optimizers.base import SparseOptimizer


class CustomizedFtrl(SparseOptimizer):
    KIND = _lib.OPT_FTRL
    optimizer_type = "ftrl"
    SLOT_NAMES = ("accum", "linear")

    def __init__(self, learning_rate, use_locking=False, name="Ftrl", **kwargs):
        super().__init__(learning_rate, use_locking, name)
        known = {"learning_rate_power": -0.5, "initial_accumulator_value": 0.1,
                 "l1_regularization_strength": 0.0, "l2_regularization_strength": 0.0,
                 "l2_shrinkage_regularization_strength": 0.0, "beta": None,
                 "accum_name": None, "linear_name": None}
        bad = sorted(set(kwargs) - set(known))
        if bad:
            raise TypeError("%s: unknown FTRL arguments %s; known: %s" % (name, bad, sorted(known)))
        known.update(kwargs)
        if known["beta"]:
            raise ValueError("%s: FTRL beta is not supported by dynemb (use 0)" % name)
        self.learning_rate_power = float(known["learning_rate_power"])
        self.initial_accumulator_value = float(known["initial_accumulator_value"])
        self.l1 = float(known["l1_regularization_strength"])
        self.l2 = float(known["l2_regularization_strength"])
        self.l2_shrinkage = float(known["l2_shrinkage_regularization_strength"])

    def _hyper(self):
        return {"learning_rate_power": self.learning_rate_power,
                "initial_accumulator_value": self.initial_accumulator_value,
                "l1": self.l1, "l2": self.l2, "l2_shrinkage": self.l2_shrinkage}


def create_hash_optimizer(learning_rate, use_locking=False, name="Ftrl", **kwargs):
    return CustomizedFtrl(learning_rate, use_locking, name, **kwargs)
