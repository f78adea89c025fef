"""SGD for mxRec's by-address training (init(use_dynamic_expansion=True)):
apply_gradients(zip(tf.gradients(loss, rows), addresses)) with the collections
ASCEND_SPARSE_LOOKUP_LOCAL_EMB / _ID_OFFSET, and weight decay: each row moves
by -lr * (gradient + weight_decay * row) (dynemb.optimizers.base.ByAddressMixin)."""
from dynemb.optimizers.base import ByAddressMixin
from dynemb.optimizers.gradient_descent import CustomizedGradientDescent


class CustomizedGradientDescentByAddr(ByAddressMixin, CustomizedGradientDescent):
    optimizer_type = "gradient_descent_by_addr"


def create_hash_optimizer_by_addr(learning_rate, weight_decay=0.0001, use_locking=False,
                                  name="GradientDescentByAddr"):
    return CustomizedGradientDescentByAddr(learning_rate, use_locking, name, weight_decay)
