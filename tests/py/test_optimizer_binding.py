"""The sparse optimizer applied to a table decides its optimizer state (slots),
whether the table was created without optimizer_list (as newer mxRec creates
tables) or with another optimizer, as long as the table holds no rows yet. The
reference: the same model with the table created with that optimizer."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.optimizers import adagrad, lazy_adam

from table_export import export_sorted

STEPS = 5


def _train(name, make_list, make_applied):
    """Trains one table for STEPS steps; returns its (keys, values)."""
    with tf.Graph().as_default():
        applied = make_applied()
        t = dynemb.create_table(tf.int64, 3, name, tf.compat.v1.random_uniform_initializer(
            -0.5, 0.5, seed=4), **({"optimizer_list": [make_list()]} if make_list else {}))
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        emb = dynemb.sparse_lookup(t, ids)
        loss = tf.reduce_sum(tf.square(emb - 1.0))
        _, sparse = dynemb.get_dense_and_sparse_variable()
        train = applied.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
        with tf.compat.v1.Session() as s:
            for step in range(STEPS):
                s.run(train, {ids: [1, 2, 2, 5 + step]})
    return export_sorted(name)


ADAM = lambda: lazy_adam.create_hash_optimizer(learning_rate=0.05)  # noqa: E731


@pytest.mark.parametrize("created_with", [None, lambda: adagrad.create_hash_optimizer(0.1)],
                         ids=["no_optimizer_list", "another_optimizer"])
def test_the_applied_optimizer_decides_the_slots(created_with):
    ref_keys, ref_values = _train("ref", ADAM, ADAM)
    keys, values = _train("late", created_with, ADAM)
    assert values.shape == ref_values.shape == (STEPS + 2, 9)  # embedding + Adam's m, v
    np.testing.assert_array_equal(keys, ref_keys)
    np.testing.assert_allclose(values, ref_values, rtol=1e-6)
