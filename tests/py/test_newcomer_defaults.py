"""The defaults a newcomer meets: a table created without a size grows on
demand (with or without dynamic expansion); a fixed capacity is only where the
user set one, and its "full" error names that argument;
terminate_config_initializer() ends what init() began, so init() and a table of
the same name with another configuration work again in the same process;
configuration mismatches read as sentences."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.core.embedding import create_table, sparse_lookup
from dynemb.util.initialize import init, terminate_config_initializer


def _lookup_rows(table, n):
    out = sparse_lookup(table, tf.range(n, dtype=tf.int64))
    with tf.compat.v1.Session() as s:
        return s.run(out)


@pytest.mark.parametrize("dynamic_expansion", [False, True])
def test_a_table_without_a_size_grows_on_demand(dynamic_expansion):
    init(use_dynamic_expansion=dynamic_expansion)
    t = create_table(tf.int64, 4, "grows", tf.compat.v1.ones_initializer())
    rows = _lookup_rows(t, 5000)
    np.testing.assert_array_equal(rows, np.ones([5000, 4], np.float32))
    assert t.size() == 5000


def test_a_fixed_capacity_names_the_argument_that_set_it():
    init(use_dynamic_expansion=False)
    t = create_table(tf.int64, 2, "fixed", tf.compat.v1.zeros_initializer(),
                     device_vocabulary_size=3)
    with pytest.raises(tf.errors.ResourceExhaustedError) as e:
        _lookup_rows(t, 4)
    msg = str(e.value)
    assert "'fixed'" in msg and "device_vocabulary_size = 3 rows is full" in msg
    assert "raise device_vocabulary_size" in msg and "host_vocabulary_size" not in msg
    assert t.size() == 3


def test_terminate_ends_what_init_began():
    init(use_dynamic_expansion=True)
    t = create_table(tf.int64, 2, "again", tf.compat.v1.ones_initializer())
    _lookup_rows(t, 10)
    assert t.size() == 10
    terminate_config_initializer()
    with pytest.raises(RuntimeError, match="before init"):
        create_table(tf.int64, 2, "again", tf.compat.v1.ones_initializer())
    init(use_dynamic_expansion=True)
    # The same name, another configuration, in the same process and graph.
    t2 = create_table(tf.int64, 8, "again", tf.compat.v1.zeros_initializer())
    rows = _lookup_rows(t2, 3)
    np.testing.assert_array_equal(rows, np.zeros([3, 8], np.float32))
    assert t2.size() == 3  # a new table: the old rows are gone


def test_estimator_style_rebuilds_reuse_the_table():
    # Estimator builds a new graph per train/evaluate call within one init():
    # create_table with the same configuration finds the rows trained before.
    init(use_dynamic_expansion=True)
    with tf.Graph().as_default():
        t = create_table(tf.int64, 2, "reused", tf.compat.v1.ones_initializer())
        _lookup_rows(t, 7)
    with tf.Graph().as_default():
        t = create_table(tf.int64, 2, "reused", tf.compat.v1.ones_initializer())
        assert t.size() == 7


def test_a_configuration_mismatch_reads_as_a_sentence():
    init(use_dynamic_expansion=True)
    with tf.Graph().as_default():
        create_table(tf.int64, 2, "mism", tf.compat.v1.random_uniform_initializer(-1, 1, seed=3))
    with tf.Graph().as_default():
        with pytest.raises(ValueError) as e:
            create_table(tf.int64, 4, "mism", tf.compat.v1.zeros_initializer())
    msg = str(e.value)
    assert "its dim is 2, this call asks for 4" in msg
    assert "its initializer is uniform (a=-1, b=1, seed 3), this call asks for zeros" in msg
    assert "drop_table('mism')" in msg and "terminate_config_initializer()" in msg
    assert "(" not in msg.split("configuration:")[0]  # no tuple dump before the facts
