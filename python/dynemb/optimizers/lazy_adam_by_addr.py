"""Lazy Adam for mxRec's by-address training (init(use_dynamic_expansion=True)):
apply_gradients(zip(tf.gradients(loss, rows), addresses)) with the collections
ASCEND_SPARSE_LOOKUP_LOCAL_EMB / _ID_OFFSET (dynemb.optimizers.base.ByAddressMixin)."""
from dynemb.optimizers.base import ByAddressMixin
from dynemb.optimizers.lazy_adam import CustomizedLazyAdam


class CustomizedLazyAdamByAddress(ByAddressMixin, CustomizedLazyAdam):
    optimizer_type = "lazy_adam_by_addr"


def create_hash_optimizer_by_address(learning_rate=0.001, beta1=0.9, beta2=0.999,
                                     epsilon=1e-8, name="LazyAdamByAddress"):
    return CustomizedLazyAdamByAddress(learning_rate, beta1, beta2, epsilon, False, name)
