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
from estimator_models import cmp_model_fn
from table_export import checkpoint_rows
from table_export import export_sorted as _export_sorted


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
    # the rows are in the checkpoint's sparse directory (mxRec's layout)
    keys, _ = checkpoint_rows(tmp_path, "est_t")
    assert len(keys) > 0
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


def test_exit_with_unclosed_session_lets_a_generator_pipeline_finish():
    # mxRec's demos read a Python generator (from_generator) and may leave the
    # session open. Graph modification prefetches batches, so at exit a
    # tf.data thread is inside the generator (here: its next element sleeps
    # past the script's end). Deleted during Python's finalization, the
    # session waited for a thread that dies at the GIL: the element was never
    # made, and sometimes the process never exited. dynemb deletes such
    # sessions at exit while Python is whole: the element is made, then the
    # process exits. Several runs, each bounded.
    code = textwrap.dedent("""
        import os, sys, time; os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        import numpy as np, tensorflow as tf
        tf.compat.v1.disable_eager_execution()
        import dynemb
        from dynemb.graph.modifier import get_initializer, modify_graph_and_start_emb_cache
        dynemb.init()
        def gen():
            for i in range(1000):
                if i == 14:
                    time.sleep(2)
                    print("element", i, "made", file=sys.stderr, flush=True)
                yield np.arange(i, i + 8, dtype=np.int64)
        ds = tf.data.Dataset.from_generator(
            gen, output_signature=tf.TensorSpec([8], tf.int64)).batch(4)
        ids = tf.compat.v1.data.make_initializable_iterator(ds).get_next()
        t = dynemb.create_table(tf.int64, 4, "g", tf.compat.v1.zeros_initializer())
        opt = dynemb.optimizers.gradient_descent.create_hash_optimizer(learning_rate=0.1)
        train = opt.minimize(tf.reduce_sum(dynemb.sparse_lookup(t, ids, modify_graph=True)))
        modify_graph_and_start_emb_cache()
        sess = tf.compat.v1.Session()
        sess.run(get_initializer(True))
        for _ in range(3):
            sess.run(train)
        print("trained", file=sys.stderr, flush=True)
    """)
    for _ in range(2):
        r = subprocess.run(["timeout", "-k", "5", "60", sys.executable, "-c", code],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stderr.index("trained") < r.stderr.index("element 14 made"), r.stderr[-2000:]


# --------------------------------------------------------------------------
# Estimator vs sess.run, train_and_evaluate, EvictHook, missing hook
# --------------------------------------------------------------------------

from dynemb.core import embedding  # noqa: E402
from dynemb.graph.modifier import (GraphModifierHook, get_initializer,  # noqa: E402
                                   modify_graph_and_start_emb_cache)

def _drift_data(steps=12, batch=8):
    """Ids drift over time (old ones stop appearing), so eviction has work."""
    rng = np.random.RandomState(3)
    ids = np.stack([k * 4 + rng.randint(0, 10, size=[batch, 3]) for k in range(steps)])
    ids = (ids.reshape([-1, 3]) * 7).astype(np.int64)
    y = (ids[:, :1] % 3 == 0).astype(np.float32)
    return ids, y


def _drift_input_fn():
    ids, y = _drift_data()
    return tf.compat.v1.data.Dataset.from_tensor_slices(({"ids": ids}, y)).batch(8)


def _sessrun_reference(modify, cfg=None, evict_hook=None):
    """The same model_fn and data, trained with sess.run (no Estimator)."""
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    gs = tf.compat.v1.train.get_or_create_global_step()
    it = tf.compat.v1.data.make_initializable_iterator(_drift_input_fn())
    features, labels = it.get_next()
    spec = cmp_model_fn(modify, cfg)(features, labels, tf.estimator.ModeKeys.TRAIN)
    losses = []
    if evict_hook is None:
        if modify:
            modify_graph_and_start_emb_cache()
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            s.run(get_initializer(True) if modify else it.initializer)
            while True:
                try:
                    losses.append(s.run([spec.loss, spec.train_op])[0])
                except tf.errors.OutOfRangeError:
                    break
    else:  # MonitoredTrainingSession, as mxRec's sess.run scripts with hooks
        scaffold = tf.compat.v1.train.Scaffold(local_init_op=it.initializer)
        with tf.compat.v1.train.MonitoredTrainingSession(
                scaffold=scaffold, hooks=[evict_hook], save_checkpoint_secs=None,
                save_summaries_steps=None, log_step_count_steps=None) as s:
            while not s.should_stop():
                losses.append(s.run([spec.loss, spec.train_op])[0])
    assert int(gs.graph is not None)
    return np.array(losses), _export_sorted("cmp_t")


@pytest.mark.parametrize("modify", [False, True])
def test_estimator_training_equals_sess_run(tmp_path, modify):
    cfg = {"access_threshold": 2}
    ref_losses, ref_table = _sessrun_reference(modify, cfg)
    dynemb.clear_tables()
    losses = []
    est = tf.estimator.Estimator(cmp_model_fn(modify, cfg, losses), str(tmp_path))
    est.train(_drift_input_fn, hooks=[GraphModifierHook()] if modify else [])
    keys, values = _export_sorted("cmp_t")
    assert len(losses) == 12
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    np.testing.assert_array_equal(keys, ref_table[0])
    np.testing.assert_allclose(values, ref_table[1], rtol=1e-6)
    assert 0 < len(keys) < len(np.unique(_drift_data()[0]))  # admission left ids out


def test_estimator_with_evict_hook_equals_monitored_training_session(tmp_path):
    # Eviction without admission, by global step, every 2 steps.
    cfg = {"eviction_threshold": 3}
    hook = dynemb.EvictHook(evict_enable=True, evict_step_interval=2, evict_time_interval=None)
    ref_losses, ref_table = _sessrun_reference(False, cfg, evict_hook=hook)
    ref_evicted = dynemb._lib.table_stats("cmp_t")["evicted"]
    assert ref_evicted > 0 and hook.evicted_total == ref_evicted
    dynemb.clear_tables()
    losses = []
    hook = dynemb.EvictHook(evict_enable=True, evict_step_interval=2, evict_time_interval=None)
    est = tf.estimator.Estimator(cmp_model_fn(False, cfg, losses), str(tmp_path))
    est.train(_drift_input_fn, hooks=[hook])
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    keys, values = _export_sorted("cmp_t")
    np.testing.assert_array_equal(keys, ref_table[0])
    np.testing.assert_allclose(values, ref_table[1], rtol=1e-6)
    assert dynemb._lib.table_stats("cmp_t")["evicted"] == ref_evicted


def test_estimator_graph_modifier_hook_with_evict_hook(tmp_path):
    cfg = {"eviction_threshold": 3, "access_threshold": 1}
    est = tf.estimator.Estimator(cmp_model_fn(True, cfg), str(tmp_path))
    hook = dynemb.EvictHook(evict_enable=True, evict_step_interval=1, evict_time_interval=None)
    est.train(_drift_input_fn, hooks=[GraphModifierHook(), hook])
    st = dynemb._lib.table_stats("cmp_t")
    # Ids of the first batches (4 steps apart per window) were evicted.
    assert st["evicted"] > 0 and hook.evicted_total == st["evicted"]
    first_ids = set((_drift_data()[0][:8] // 7).ravel().tolist())
    last_ids = set((_drift_data()[0][-8:] // 7).ravel().tolist())
    keys = set(_export_sorted("cmp_t")[0].tolist())
    assert last_ids <= keys and not (first_ids - last_ids) & keys


def test_train_and_evaluate_with_graph_modifier_hook(tmp_path):
    cfg = {"access_threshold": 2}
    # Reference: plain lookups, est.train then est.evaluate.
    ref = tf.estimator.Estimator(cmp_model_fn(False, cfg, name="ref_t"), str(tmp_path / "ref"))
    ref.train(_drift_input_fn)
    ref_loss = ref.evaluate(_drift_input_fn)["loss"]
    est = tf.estimator.Estimator(cmp_model_fn(True, cfg), str(tmp_path / "mod"))
    metrics, _ = tf.estimator.train_and_evaluate(
        est,
        tf.estimator.TrainSpec(_drift_input_fn, max_steps=12, hooks=[GraphModifierHook()]),
        tf.estimator.EvalSpec(_drift_input_fn, steps=None, hooks=[GraphModifierHook()],
                              throttle_secs=0))
    assert metrics["global_step"] == 12
    assert metrics["loss"] == pytest.approx(ref_loss, rel=1e-6)
    k1, v1 = _export_sorted("cmp_t")
    k0, v0 = _export_sorted("ref_t")
    np.testing.assert_array_equal(k1, k0)
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    preds = list(est.predict(_drift_input_fn, hooks=[GraphModifierHook()]))
    assert len(preds) == len(_drift_data()[0])


@pytest.mark.parametrize("call", ["train", "evaluate", "predict"])
def test_modify_graph_without_the_hook_is_a_clear_error(tmp_path, call):
    est = tf.estimator.Estimator(cmp_model_fn(True), str(tmp_path))
    if call != "train":
        est.train(_drift_input_fn, steps=1, hooks=[GraphModifierHook()])
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        if call == "train":
            est.train(_drift_input_fn, steps=1)
        elif call == "evaluate":
            est.evaluate(_drift_input_fn, steps=1)
        else:
            next(iter(est.predict(_drift_input_fn)))
    msg = e.value.message
    assert "table cmp_t is waiting" in msg and "add GraphModifierHook()" in msg, msg
    assert embedding is not None
