"""dynemb's sparse optimizers are tf.compat.v1.train.Optimizer subclasses
(as mxRec's are): a loss-scaling wrapper of the kind mxRec's WideDeep and DCNv2
examples put around their optimizer (it refuses anything that is not an
Optimizer, scales the loss, unscales the gradients and hands them to the
optimizer's apply_gradients) trains a table exactly as the bare optimizer
does, for every sparse optimizer; and compute_gradients, apply_gradients,
minimize, get_slot_names, get_slot, variables and get_name keep TensorFlow's
contract while the engine does the math."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.constants.constants import (ASCEND_SPARSE_LOOKUP_ID_OFFSET,
                                        ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
from dynemb.optimizers import (adagrad, adagrad_by_addr, ftrl, gradient_descent,
                               gradient_descent_by_addr, lazy_adam, lazy_adam_by_addr)
from dynemb.util.initialize import init

from table_export import export_sorted

# kind -> (a fresh optimizer, by address?, TensorFlow's slot names)
OPTIMIZERS = {
    "lazy_adam": (lambda: lazy_adam.create_hash_optimizer(0.05), False, ["m", "v"]),
    "adagrad": (lambda: adagrad.create_hash_optimizer(0.1), False, ["accumulator"]),
    "sgd": (lambda: gradient_descent.create_hash_optimizer(0.1, weight_decay=0.01), False,
            []),
    "ftrl": (lambda: ftrl.create_hash_optimizer(0.1, l1_regularization_strength=0.001),
             False, ["accum", "linear"]),
    "lazy_adam_by_addr": (lambda: lazy_adam_by_addr.create_hash_optimizer_by_address(0.05),
                          True, ["m", "v"]),
    "adagrad_by_addr": (lambda: adagrad_by_addr.create_hash_optimizer_by_address(0.1), True,
                        ["accumulator"]),
    "sgd_by_addr": (lambda: gradient_descent_by_addr.create_hash_optimizer_by_addr(0.1), True,
                    []),
}
BATCHES = np.array([[3, 1, 3, 7], [2, 3, 5, 5], [1, 1, 4, 9]], np.int64)
SCALE = 1024.0  # a power of two: scaling and unscaling are exact


class ScaledLossOptimizer(tf.compat.v1.train.Optimizer):
    """Multiplies the loss by a constant before the gradients are taken and
    divides the gradients by it afterwards; the wrapped optimizer applies
    them. Only TensorFlow optimizers are accepted."""

    def __init__(self, opt, scale):
        assert isinstance(opt, tf.compat.v1.train.Optimizer), (
            "opt is not a tf.compat.v1.train.Optimizer: %s" % type(opt).__name__)
        super().__init__(opt._use_locking, opt.get_name())
        self._wrapped, self._scale = opt, scale

    def _unscaled(self, grad):
        if grad is None:
            return None
        if isinstance(grad, tf.IndexedSlices):
            return tf.IndexedSlices(grad.values / self._scale, grad.indices, grad.dense_shape)
        return grad / self._scale

    def compute_gradients(self, loss, var_list=None, **kwargs):
        pairs = self._wrapped.compute_gradients(loss * self._scale, var_list=var_list, **kwargs)
        return [(self._unscaled(g), v) for g, v in pairs]

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        return self._wrapped.apply_gradients(grads_and_vars, global_step, name)

    def get_slot_names(self):
        return self._wrapped.get_slot_names()

    def variables(self):
        return self._wrapped.variables()


def _model(name):
    """A table of 4 columns, a dense layer on its rows; (ids, loss, w, table)."""
    t = dynemb.create_table(tf.int64, 4, name, tf.compat.v1.random_uniform_initializer(
        -0.5, 0.5, seed=11))
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = dynemb.sparse_lookup(t, ids)
    w = tf.compat.v1.get_variable("w", initializer=tf.constant([[0.5], [-1.0], [0.25], [2.0]]))
    loss = tf.reduce_mean(tf.square(tf.matmul(emb, w) - 1.0))
    return ids, loss, w, t


def _train(kind, wrapped):
    """Trains the model three steps with the sparse optimizer `kind` (in the
    wrapper or bare; dense layer: TF's SGD); returns (table rows, w, global step)."""
    make, by_address, _ = OPTIMIZERS[kind]
    name = "wrapped" if wrapped else "bare"
    with tf.Graph().as_default():
        ids, loss, w, _ = _model(name)
        gs = tf.compat.v1.train.get_or_create_global_step()
        dense = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=[w])
        opt = make()
        if by_address:
            rows = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
            addresses = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        if wrapped:
            opt = ScaledLossOptimizer(opt, SCALE)
            if by_address:  # mxRec's dynamic-expansion scripts: rows' gradients at addresses
                grads = [g for g, _ in opt.compute_gradients(loss, var_list=rows)]
                sparse = opt.apply_gradients(zip(grads, addresses), global_step=gs)
            else:
                sparse = opt.minimize(loss, global_step=gs)
        else:
            if by_address:
                sparse = opt.apply_gradients(zip(tf.gradients(loss, rows), addresses))
            else:
                _, tables = dynemb.get_dense_and_sparse_variable()
                sparse = opt.apply_gradients(zip(tf.gradients(loss, tables), tables))
            sparse = tf.group(sparse, tf.compat.v1.assign_add(gs, 1))
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for batch in BATCHES:
                s.run([dense, sparse], {ids: batch})
            return export_sorted(name), s.run(w), s.run(gs)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_a_loss_scaling_wrapper_trains_as_the_bare_optimizer(kind):
    if OPTIMIZERS[kind][1]:
        init(use_dynamic_expansion=True)
    (ref_keys, ref_values), ref_w, ref_step = _train(kind, wrapped=False)
    (keys, values), w, step = _train(kind, wrapped=True)
    assert step == ref_step == len(BATCHES)
    np.testing.assert_array_equal(keys, ref_keys)
    np.testing.assert_allclose(values, ref_values, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(w, ref_w, rtol=1e-6)
    assert not np.allclose(w, [[0.5], [-1.0], [0.25], [2.0]])  # both parts trained


def test_tensorflows_own_loss_scale_optimizer_takes_a_sparse_optimizer():
    """The class whose refusal the issue quotes ("opt" must be an instance of
    Optimizer), where this TensorFlow has it."""
    wrapper = getattr(getattr(tf.compat.v1.train, "experimental", None),
                      "MixedPrecisionLossScaleOptimizer", None)
    if wrapper is None:
        pytest.skip("this TensorFlow has no tf.compat.v1 loss-scale optimizer")
    results = []
    for scale in (None, 256.0):
        with tf.Graph().as_default():
            ids, loss, _, _ = _model("t%d" % len(results))
            gs = tf.compat.v1.train.get_or_create_global_step()
            opt = lazy_adam.create_hash_optimizer(0.05)
            train = (opt if scale is None else wrapper(opt, scale)).minimize(loss, gs)
            with tf.compat.v1.Session() as s:
                s.run(tf.compat.v1.global_variables_initializer())
                for batch in BATCHES:
                    s.run(train, {ids: batch})
                assert s.run(gs) == len(BATCHES)
            results.append(export_sorted("t%d" % len(results)))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6)


@pytest.mark.parametrize("kind", sorted(OPTIMIZERS))
def test_tensorflows_optimizer_contract(kind):
    make, by_address, slots = OPTIMIZERS[kind]
    if by_address:
        init(use_dynamic_expansion=True)
    opt = make()
    assert isinstance(opt, tf.compat.v1.train.Optimizer)
    assert opt.get_name() == opt.name and opt.get_name()
    assert opt.get_slot_names() == slots
    ids, loss, w, t = _model("c")
    # var_list=None: the tables' sparse variables (by address: the looked-up
    # rows); the gradient of a table is an IndexedSlices of its ids
    pairs = opt.compute_gradients(loss)
    assert len(pairs) == 1
    grad, var = pairs[0]
    if by_address:
        assert var is tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)[0]
        assert isinstance(grad, tf.Tensor)
    else:
        assert var is t.anchor
        assert isinstance(grad, tf.IndexedSlices) and grad.indices.dtype == tf.int64
    # a dense variable in var_list: the same clear error as before, raised
    # before any table is bound to this optimizer
    with pytest.raises(ValueError, match="not a(n address of a)? dynemb"):
        opt.minimize(loss, var_list=[var, w])
    assert t.applied_by is None
    # TensorFlow's per-variable hooks refuse both kinds of variable
    with pytest.raises(RuntimeError, match="per-variable update _apply_sparse was reached for "
                                           "table 'c'"):
        opt._apply_sparse(tf.IndexedSlices(tf.ones([1, 4]), tf.constant([1], tf.int64)),
                          t.anchor)
    with pytest.raises(RuntimeError, match="per-variable update .*'w:0'.*TensorFlow optimizer"):
        tf.compat.v1.train.Optimizer.apply_gradients(opt, [(tf.ones([4, 1]), w)])
    with pytest.raises(ValueError, match="grads_and_vars is empty"):
        opt.apply_gradients([])
    gs = tf.compat.v1.train.get_or_create_global_step()
    train = opt.minimize(loss, global_step=gs)
    assert train in tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
    assert t.applied_by is opt
    assert opt.variables() == []  # beta powers and slots are the engine's
    assert opt.get_slot(var, slots[0] if slots else "m") is None
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        w0 = s.run(w)
        for step, batch in enumerate(BATCHES, 1):
            s.run(train, {ids: batch})
            assert s.run(gs) == step  # once per apply
        np.testing.assert_array_equal(s.run(w), w0)  # minimize(loss) trains the tables only
    keys, _ = export_sorted("c")
    np.testing.assert_array_equal(keys, np.unique(BATCHES))


def test_compute_gradients_without_tables_names_var_list():
    tf.Variable(1.0)
    with pytest.raises(ValueError, match="var_list is None and the graph has no dynemb tables"):
        lazy_adam.create_hash_optimizer().compute_gradients(tf.constant(1.0))


def test_sgd_weight_decay_reads_the_rows_this_step_creates():
    """SGD's weight decay reads the rows of the batch's ids; for ids seen for
    the first time it must read them after the step's lookup created them (a
    read before that finds no row, and the decay term is lost)."""
    lr, decay, start = 0.1, 0.5, 0.5
    opt = gradient_descent.create_hash_optimizer(lr, weight_decay=decay)
    t = dynemb.create_table(tf.int64, 2, "wd", tf.compat.v1.constant_initializer(start))
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    loss = tf.reduce_sum(dynemb.sparse_lookup(t, ids))  # every gradient row is 1
    train = opt.minimize(loss)
    with tf.compat.v1.Session() as s:
        for step in range(40):  # fresh ids each step
            s.run(train, {ids: np.arange(4) + 10 * step})
    _, values = export_sorted("wd")
    np.testing.assert_allclose(values, start - lr * (1 + decay * start), rtol=1e-6)
