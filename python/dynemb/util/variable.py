"""Dense and sparse variables of the graph (mxRec: ``mx_rec.util.variable``)."""
from __future__ import annotations

import tensorflow as tf

from dynemb.core.tables import sparse_variables


def get_dense_and_sparse_variable() -> tuple[list, list]:
    """(dense trainable tf.Variables, sparse variables of dynemb tables).

    Train dense ones with any TF optimizer; take the sparse gradients with
    tf.gradients(loss, sparse_variables) and apply them with the tables'
    sparse optimizer.
    """
    return list(tf.compat.v1.trainable_variables()), sparse_variables()
