"""Estimator (graphs rebuilt for train and evaluate, checkpoints through its
sharded Saver) and clean process exit with an unclosed session."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.optimizers import adagrad


def _input_fn():
    rng = np.random.default_rng(0)
    ids = (rng.integers(0, 50, size=(64, 3)) * 7919).astype(np.int64)
    y = (ids[:, :1] % 3 == 0).astype(np.float32)
    return tf.compat.v1.data.Dataset.from_tensor_slices(({"ids": ids}, y)).batch(16)


def _model_fn(features, labels, mode):
    opt = adagrad.create_hash_optimizer(learning_rate=0.1, initial_accumulator_value=0.1)
    t = dynemb.create_table(tf.int64, 4, "est_t", tf.compat.v1.random_uniform_initializer(
        -0.05, 0.05, seed=2), optimizer_list=[opt])
    is_train = mode == tf.estimator.ModeKeys.TRAIN
    e = dynemb.sparse_lookup(t, features["ids"], is_train=is_train)
    w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.ones_initializer())
    logits = tf.matmul(tf.reduce_sum(e, 1), w)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    dense, sparse = dynemb.get_dense_and_sparse_variable()
    gs = tf.compat.v1.train.get_global_step()
    train_op = tf.group(
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense),
        opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse), global_step=gs))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_estimator_train_evaluate_restore(tmp_path):
    est = tf.estimator.Estimator(_model_fn, model_dir=str(tmp_path))
    est.train(_input_fn, steps=4)
    names = dict(tf.train.list_variables(str(tmp_path)))
    assert names["dynemb/est_t/keys"][0] > 0
    size = dynemb._lib.table_stats("est_t")["size"]
    ev = est.evaluate(_input_fn, steps=2)
    assert np.isfinite(ev["loss"]) and ev["global_step"] == 4
    # A fresh process has no table: restoring from the checkpoint brings it back.
    dynemb.clear_tables()
    ev2 = est.evaluate(_input_fn, steps=2)
    assert ev2["loss"] == pytest.approx(ev["loss"], rel=1e-6)
    assert dynemb._lib.table_stats("est_t")["size"] == size


def test_exit_with_unclosed_session_is_clean():
    code = textwrap.dedent("""
        import os; os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        import tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        import dynemb
        dynemb.init()
        t = dynemb.create_table(tf.int64, 8, "x", tf.compat.v1.zeros_initializer(),
                                device_vocabulary_size=10, host_vocabulary_size=100)
        s = tf.compat.v1.Session()
        s.run(dynemb.sparse_lookup(t, tf.constant(list(range(1000)), tf.int64)))
        print("ok", t.size())
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "ok 1000" in r.stdout
