"""Adagrad for mxRec's by-address training (init(use_dynamic_expansion=True)):
apply_gradients(zip(tf.gradients(loss, rows), addresses)) with the collections
ASCEND_SPARSE_LOOKUP_LOCAL_EMB / _ID_OFFSET (dynemb.optimizers.base.ByAddressMixin)."""
from dynemb.optimizers.adagrad import CustomizedAdagrad
from dynemb.optimizers.base import ByAddressMixin


class CustomizedAdagradByAddress(ByAddressMixin, CustomizedAdagrad):
    optimizer_type = "adagrad_by_addr"


def create_hash_optimizer_by_address(learning_rate=0.001, initial_accumulator_value=0.9,
                                     name="Adagrad"):
    return CustomizedAdagradByAddress(learning_rate, initial_accumulator_value, False, name)
