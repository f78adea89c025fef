"""Misuse gives clear errors that name the table and the fix, and leaves
nothing half-built."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.optimizers import adagrad, gradient_descent


def _t(name="e", dim=2, **kw):
    return dynemb.create_table(tf.int64, dim, name, tf.compat.v1.zeros_initializer(), **kw)


def test_float_ids():
    t = _t()
    with pytest.raises(TypeError, match=r"'e'.*int32 or int64.*tf.cast"):
        dynemb.sparse_lookup(t, tf.constant([1.0, 2.0]))


def test_create_and_lookup_before_init():
    t = _t()
    dynemb.terminate_config_initializer()
    with pytest.raises(RuntimeError, match="init"):
        _t(name="other")
    with pytest.raises(RuntimeError, match="init"):
        dynemb.sparse_lookup(t, tf.constant([1], tf.int64))


def test_name_twice_in_one_graph():
    _t()
    with pytest.raises(ValueError, match="'e' was already created in this graph"):
        _t()


def test_same_name_different_config_in_new_graph():
    _t(dim=2)
    with tf.Graph().as_default():
        with pytest.raises(ValueError, match=r"'e' already exists.*dim.*drop_table"):
            _t(dim=3)
        dynemb.drop_table("e")
        assert _t(dim=3).dim == 3


def test_bad_table_arguments():
    with pytest.raises(ValueError, match="dim"):
        _t(dim=0)
    with pytest.raises(TypeError, match="not supported"):
        dynemb.create_table(tf.int64, 2, "x", tf.compat.v1.orthogonal_initializer())
    with pytest.raises(TypeError, match="key_dtype"):
        dynemb.create_table(tf.float32, 2, "x", tf.compat.v1.zeros_initializer())
    assert dynemb._lib.find_table("x") is None  # nothing half-built


def test_dropped_table_at_run_time():
    t = _t()
    out = dynemb.sparse_lookup(t, tf.constant([1], tf.int64))
    dynemb.drop_table("e")
    with tf.compat.v1.Session() as s:
        with pytest.raises(tf.errors.NotFoundError, match=r"table 'e'.*create_table"):
            s.run(out)


def test_another_optimizer_for_a_table_that_holds_rows():
    # The optimizer applied decides a table's slots only while it is empty
    # (tests/py/test_optimizer_binding.py); once Adagrad trained rows, SGD is
    # refused with both names, and so is a second optimizer in one graph.
    ada = adagrad.create_hash_optimizer(0.1)
    t = _t(optimizer_list=[ada])
    out = dynemb.sparse_lookup(t, tf.constant([1], tf.int64))
    _, sparse = dynemb.get_dense_and_sparse_variable()
    g = tf.gradients(tf.reduce_sum(out), sparse)
    train = ada.apply_gradients(zip(g, sparse))
    with pytest.raises(ValueError, match="'e' is already trained by sparse optimizer"):
        gradient_descent.create_hash_optimizer(0.1).apply_gradients(zip(g, sparse))
    with tf.compat.v1.Session() as s:
        s.run(train)
    with tf.Graph().as_default():
        t2 = _t(optimizer_list=[ada])
        out = dynemb.sparse_lookup(t2, tf.constant([1], tf.int64))
        _, sparse = dynemb.get_dense_and_sparse_variable()
        g = tf.gradients(tf.reduce_sum(out), sparse)
        with pytest.raises(dynemb.DynembError, match="holds 1 rows with adagrad state"):
            gradient_descent.create_hash_optimizer(0.1).apply_gradients(zip(g, sparse))


def test_dense_variable_given_to_sparse_optimizer():
    v = tf.Variable(1.0)
    with pytest.raises(ValueError, match="not a dynemb sparse variable"):
        gradient_descent.create_hash_optimizer(0.1).apply_gradients([(tf.constant(1.0), v)])


def test_nonfinite_gradient_rejected():
    opt = gradient_descent.create_hash_optimizer(0.1)
    t = _t(optimizer_list=[opt])
    ids = tf.constant([3], tf.int64)
    out = dynemb.sparse_lookup(t, ids)
    scale = tf.compat.v1.placeholder(tf.float32, [])
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(tf.reduce_sum(out) * scale, sparse), sparse))
    with tf.compat.v1.Session() as s:
        with pytest.raises(tf.errors.InvalidArgumentError, match="'e'"):
            s.run(train, {scale: np.nan})
        s.run(train, {scale: 1.0})


def test_capacity_budget_exhausted():
    dynemb.init(use_dynamic_expansion=False)
    t = dynemb.create_table(tf.int64, 2, "small", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=2, host_vocabulary_size=0)
    out = dynemb.sparse_lookup(t, tf.constant([1, 2, 3], tf.int64))
    with tf.compat.v1.Session() as s:
        with pytest.raises(tf.errors.ResourceExhaustedError, match="'small'"):
            s.run(out)
