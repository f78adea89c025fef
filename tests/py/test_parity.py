"""Numerical parity: the same small model trained (a) with a dense
tf.Variable table and TensorFlow's optimizer and (b) with a dynemb table and
the matching sparse optimizer gives the same losses and embeddings.

The model looks the table up twice per step (two id features, repeated ids
inside a batch), sums the embeddings of each feature, and feeds a dense
layer trained by plain TF SGD in both variants. Both variants start from
the same rows: the dynemb rows are read first and copied into the dense
variable.
"""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.optimizers import adagrad, ftrl, gradient_descent, lazy_adam

DIM, VOCAB, BATCH, STEPS = 4, 24, 16, 50
KEYS = (np.arange(VOCAB, dtype=np.int64) * 1000003 + 17) * (-1) ** np.arange(VOCAB)


def _batches(seed, every_row):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(STEPS):
        a = rng.integers(0, VOCAB, size=(BATCH, 3))
        b = rng.integers(0, VOCAB, size=(BATCH, 2))
        if every_row:
            a[: VOCAB // 3 + 1].flat[:VOCAB] = np.arange(VOCAB)
        a[-1, 1] = a[-1, 0]  # a repeated id inside one batch
        y = rng.integers(0, 2, size=(BATCH, 1)).astype(np.float32)
        out.append((a, b, y))
    return out


def _head(ea, eb, y):
    x = tf.concat([tf.reduce_sum(ea, 1), tf.reduce_sum(eb, 1)], 1)
    w = tf.compat.v1.get_variable("w", [2 * DIM, 1], initializer=tf.compat.v1.constant_initializer(
        np.linspace(-0.5, 0.5, 2 * DIM).reshape(-1, 1)))
    logits = tf.matmul(x, w)
    return tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits))


def _dynemb_run(make_opt, batches):
    g = tf.Graph()
    with g.as_default():
        opt = make_opt()
        t = dynemb.create_table(tf.int64, DIM, "parity", tf.compat.v1.truncated_normal_initializer(
            stddev=0.3, seed=7), optimizer_list=[opt])
        pa = tf.compat.v1.placeholder(tf.int64, [None, 3])
        pb = tf.compat.v1.placeholder(tf.int64, [None, 2])
        py = tf.compat.v1.placeholder(tf.float32, [None, 1])
        loss = _head(dynemb.sparse_lookup(t, pa), dynemb.sparse_lookup(t, pb), py)
        dense, sparse = dynemb.get_dense_and_sparse_variable()
        dense_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense)
        sparse_grads = tf.gradients(loss, sparse)
        train = tf.group(dense_op, opt.apply_gradients(zip(sparse_grads, sparse)))
        init_rows = dynemb.sparse_lookup(t, tf.constant(KEYS))
        final_rows = dynemb.sparse_lookup(t, tf.constant(KEYS), is_train=False)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            rows0 = s.run(init_rows)
            losses = [s.run([train, loss], {pa: KEYS[a], pb: KEYS[b], py: y})[1]
                      for a, b, y in batches]
            rows = s.run(final_rows)
    return rows0, np.array(losses), rows


def _dense_run(tf_opt, rows0, batches):
    g = tf.Graph()
    with g.as_default():
        table = tf.Variable(rows0, name="table")
        pa = tf.compat.v1.placeholder(tf.int64, [None, 3])
        pb = tf.compat.v1.placeholder(tf.int64, [None, 2])
        py = tf.compat.v1.placeholder(tf.float32, [None, 1])
        loss = _head(tf.nn.embedding_lookup(table, pa), tf.nn.embedding_lookup(table, pb), py)
        w = [v for v in tf.compat.v1.trainable_variables() if v.name.startswith("w")]
        dense_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=w)
        train = tf.group(dense_op, tf_opt().minimize(loss, var_list=[table]))
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            losses = [s.run([train, loss], {pa: a, pb: b, py: y})[1] for a, b, y in batches]
            rows = s.run(table)
    return np.array(losses), rows


CASES = {
    "sgd": (lambda: gradient_descent.create_hash_optimizer(learning_rate=0.3),
            lambda: tf.compat.v1.train.GradientDescentOptimizer(0.3)),
    "adagrad": (lambda: adagrad.create_hash_optimizer(learning_rate=0.2, initial_accumulator_value=0.1),
                lambda: tf.compat.v1.train.AdagradOptimizer(0.2, initial_accumulator_value=0.1)),
    "ftrl": (lambda: ftrl.create_hash_optimizer(0.2, l1_regularization_strength=0.001,
                                                l2_regularization_strength=0.01),
             lambda: tf.compat.v1.train.FtrlOptimizer(0.2, l1_regularization_strength=0.001,
                                                      l2_regularization_strength=0.01)),
    "ftrl_v2_shrinkage": (
        lambda: ftrl.create_hash_optimizer(0.2, learning_rate_power=-0.6, initial_accumulator_value=0.2,
                                           l1_regularization_strength=0.001,
                                           l2_regularization_strength=0.01,
                                           l2_shrinkage_regularization_strength=0.02),
        lambda: tf.compat.v1.train.FtrlOptimizer(0.2, learning_rate_power=-0.6, initial_accumulator_value=0.2,
                                                 l1_regularization_strength=0.001,
                                                 l2_regularization_strength=0.01,
                                                 l2_shrinkage_regularization_strength=0.02)),
    "lazy_adam_every_row": (
        lambda: lazy_adam.create_hash_optimizer(learning_rate=0.05, beta1=0.8, beta2=0.95, epsilon=1e-6),
        lambda: tf.compat.v1.train.AdamOptimizer(0.05, beta1=0.8, beta2=0.95, epsilon=1e-6)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_parity_with_dense_tensorflow(case):
    make_sparse, make_dense = CASES[case]
    batches = _batches(seed=hash(case) % 1000, every_row=case.startswith("lazy_adam"))
    rows0, loss_a, rows_a = _dynemb_run(make_sparse, batches)
    loss_b, rows_b = _dense_run(make_dense, rows0, batches)
    np.testing.assert_allclose(loss_a, loss_b, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(rows_a, rows_b, rtol=1e-5, atol=1e-6)
    assert np.abs(rows_a - rows0).max() > 1e-3  # it did train


def _lazy_adam_reference(rows0, grads_per_step, lr, b1, b2, eps):
    """Lazy Adam in numpy: only rows in the batch move; the step count t is
    global (TensorFlow's beta powers)."""
    w = rows0.astype(np.float64).copy()
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    for t, (idx, g) in enumerate(grads_per_step, start=1):
        summed = {}
        for i, gi in zip(idx, g):
            summed[i] = summed.get(i, 0) + gi.astype(np.float64)
        lr_t = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        for i, gi in summed.items():
            m[i] = b1 * m[i] + (1 - b1) * gi
            v[i] = b2 * v[i] + (1 - b2) * gi * gi
            w[i] -= lr_t * m[i] / (np.sqrt(v[i]) + eps)
    return w


def test_lazy_adam_matches_reference_on_sparse_batches():
    """Batches touch few rows: rows not in a batch keep their moments."""
    g = tf.Graph()
    with g.as_default():
        opt = lazy_adam.create_hash_optimizer(learning_rate=0.01, beta1=0.9, beta2=0.99, epsilon=1e-7)
        t = dynemb.create_table(tf.int64, DIM, "lazy", tf.compat.v1.random_uniform_initializer(
            -0.1, 0.1, seed=1), optimizer_list=[opt])
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        gv = tf.compat.v1.placeholder(tf.float32, [None, DIM])
        out = dynemb.sparse_lookup(t, ids)
        loss = tf.reduce_sum(out * gv)  # d loss / d row = gv
        _, sparse = dynemb.get_dense_and_sparse_variable()
        train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
        rng = np.random.default_rng(5)
        steps = []
        for _ in range(30):
            idx = rng.integers(0, 6, size=3)
            steps.append((idx, rng.normal(size=(3, DIM)).astype(np.float32)))
        with tf.compat.v1.Session() as s:
            rows0 = s.run(out, {ids: np.arange(6)})
            for idx, grad in steps:
                s.run(train, {ids: idx, gv: grad})
            rows = s.run(out, {ids: np.arange(6)})
    ref = _lazy_adam_reference(rows0, steps, 0.01, 0.9, 0.99, 1e-7)
    np.testing.assert_allclose(rows, ref, rtol=1e-4, atol=1e-6)
