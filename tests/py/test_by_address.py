"""mxRec's by-address training path (init(use_dynamic_expansion=True)): train
lookups publish their rows and addresses in ASCEND_SPARSE_LOOKUP_LOCAL_EMB /
_ID_OFFSET, and a ByAddr optimizer applying tf.gradients(loss, rows) at those
addresses trains exactly as the plain optimizer with the sparse variables (the
reference), in plain and graph-modification mode; SGD's weight decay moves a
row by -lr * (gradient + weight_decay * row) once per step (a numpy reference)."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.constants.constants import (ASCEND_SPARSE_LOOKUP_ID_OFFSET,
                                        ASCEND_SPARSE_LOOKUP_LOCAL_EMB,
                                        ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS)
from dynemb.optimizers import lazy_adam
from dynemb.optimizers.adagrad_by_addr import create_hash_optimizer_by_address as adagrad_ba
from dynemb.optimizers.gradient_descent_by_addr import create_hash_optimizer_by_addr
from dynemb.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address
from dynemb.util.initialize import init

from table_export import export_sorted, run_pipeline

IDS = np.array([[3, 1, 3], [2, 3, 5], [1, 1, 4]], np.int64)


def _train(name, by_address, modify, make_opt):
    with tf.Graph().as_default():
        opt = make_opt()
        t = dynemb.create_table(tf.int64, 2, name, tf.compat.v1.random_uniform_initializer(
            -0.5, 0.5, seed=9))
        it = tf.compat.v1.data.make_initializable_iterator(
            tf.data.Dataset.from_tensor_slices(IDS).batch(1))
        emb = dynemb.sparse_lookup(t, it.get_next(), modify_graph=modify)
        loss = tf.reduce_sum(tf.square(emb - 1.0))
        if by_address:
            rows = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
            addrs = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
            assert len(rows) == len(addrs) == 1
            assert tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_UNIQUE_KEYS) == addrs
            train = opt.apply_gradients(zip(tf.gradients(loss, rows), addrs))
        else:
            _, sparse = dynemb.get_dense_and_sparse_variable()
            train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
        run_pipeline(it, train, modify, len(IDS))
    return export_sorted(name)


@pytest.mark.parametrize("modify", [False, True], ids=["plain", "modify_graph"])
@pytest.mark.parametrize("kind", ["lazy_adam", "adagrad"])
def test_by_address_trains_as_the_sparse_variables_do(modify, kind):
    init(use_dynamic_expansion=True)
    plain = {"lazy_adam": lambda: lazy_adam.create_hash_optimizer(0.05),
             "adagrad": lambda: dynemb.adagrad.create_hash_optimizer(0.05)}[kind]
    by_addr = {"lazy_adam": lambda: create_hash_optimizer_by_address(0.05),
               "adagrad": lambda: adagrad_ba(0.05)}[kind]
    ref_keys, ref_values = _train("ref", False, modify, plain)
    keys, values = _train("addr", True, modify, by_addr)
    np.testing.assert_array_equal(keys, ref_keys)
    np.testing.assert_allclose(values, ref_values, rtol=1e-6)


def test_sgd_by_address_weight_decay():
    init(use_dynamic_expansion=True)
    lr, wd = 0.1, 0.01
    with tf.Graph().as_default():
        opt = create_hash_optimizer_by_addr(lr, weight_decay=wd)
        t = dynemb.create_table(tf.int64, 2, "wd", tf.compat.v1.random_uniform_initializer(
            -0.5, 0.5, seed=9))
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        emb = dynemb.sparse_lookup(t, ids)
        loss = tf.reduce_sum(emb)  # gradient 1 per occurrence
        rows = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addrs = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        train = opt.apply_gradients(zip(tf.gradients(loss, rows), addrs))
        with tf.compat.v1.Session() as s:
            before = s.run(emb, {ids: [7, 8]})
            s.run(train, {ids: [7, 7, 7, 8]})
            after = s.run(emb, {ids: [7, 8]})
    counts = np.array([[3.0], [1.0]])
    np.testing.assert_allclose(after, before - lr * (counts + wd * before), rtol=1e-6)
    with pytest.raises(ValueError, match="weight_decay"):
        create_hash_optimizer_by_addr(0.1, weight_decay=-1)


def test_an_address_must_come_from_a_lookup():
    init(use_dynamic_expansion=True)
    with pytest.raises(ValueError, match="not an address of a dynemb lookup"):
        create_hash_optimizer_by_address(0.1).apply_gradients(
            [(tf.zeros([2, 2]), tf.constant([1, 2], tf.int64))])


def test_sgd_weight_decay_with_the_sparse_variables():
    # The plain optimizer gets the same decay (the rows are read back for it).
    lr, wd = 0.1, 0.01
    opt = dynemb.gradient_descent.create_hash_optimizer(lr, weight_decay=wd,
                                                        use_fusion_optim=True)
    t = dynemb.create_table(tf.int64, 2, "wd2", tf.compat.v1.random_uniform_initializer(
        -0.5, 0.5, seed=9), optimizer_list=[opt])
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = dynemb.sparse_lookup(t, ids)
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(tf.reduce_sum(emb), sparse), sparse))
    with tf.compat.v1.Session() as s:
        before = s.run(emb, {ids: [7, 8]})
        s.run(train, {ids: [7, 7, 8]})
        after = s.run(emb, {ids: [7, 8]})
    np.testing.assert_allclose(after, before - lr * (np.array([[2.0], [1.0]]) + wd * before),
                               rtol=1e-6)
    for bad in (-1, float("nan"), True):
        with pytest.raises(ValueError, match="weight_decay"):
            dynemb.gradient_descent.create_hash_optimizer(0.1, weight_decay=bad)


def test_lazy_adam_takes_mxrecs_argument_order():
    o = lazy_adam.create_hash_optimizer(0.01, 0.8, 0.99, 1e-7, "MyAdam", True)
    assert (o.name, o.beta1, o.beta2, o.epsilon) == ("MyAdam", 0.8, 0.99, 1e-7)
    with pytest.raises(TypeError, match="name must be a string"):
        lazy_adam.create_hash_optimizer(0.01, 0.9, 0.999, 1e-8, False)
