"""Checkpoints through tf.compat.v1.train.Saver include the tables (rows,
optimizer slots, admission candidates, Adam's step count)."""
import os

import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.optimizers import lazy_adam

DIM = 3


def _build(access_threshold=0, tiers=None):
    opt = lazy_adam.create_hash_optimizer(learning_rate=0.05)
    t = dynemb.create_table(tf.int64, DIM, "ckpt_t", tf.compat.v1.random_normal_initializer(
        stddev=0.2, seed=11), optimizer_list=[opt], **(tiers or {}))
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    y = tf.compat.v1.placeholder(tf.float32, [None])
    cfg = {"access_threshold": access_threshold} if access_threshold else None
    e = dynemb.sparse_lookup(t, ids, access_and_evict_config=cfg)
    w = tf.compat.v1.get_variable("w", [DIM], initializer=tf.compat.v1.ones_initializer())
    loss = tf.reduce_mean(tf.square(tf.reduce_sum(tf.reduce_sum(e, 1) * w, 1) - y))
    gs = tf.compat.v1.train.get_or_create_global_step()
    dense, sparse = dynemb.get_dense_and_sparse_variable()
    train = tf.group(
        tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, var_list=dense),
        opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse), global_step=gs))
    return t, ids, y, loss, train


def _data(n, seed):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, 40, size=(8, 2)) ** 2, rng.normal(size=8).astype(np.float32))
            for _ in range(n)]


@pytest.mark.parametrize("ssd", [False, True], ids=["memory", "ssd_tier"])
def test_save_restore_continue_equals_uninterrupted(tmp_path, ssd):
    # with an SSD tier, 8 rows stay in memory: most rows are saved from the
    # tier's file and restored into it
    tiers = ({"device_vocabulary_size": 4, "host_vocabulary_size": 4,
              "ssd_vocabulary_size": 10000, "ssd_data_path": str(tmp_path / "ssd")}
             if ssd else None)
    data = _data(20, 1)
    with tf.Graph().as_default():
        t, ids, y, loss, train = _build(access_threshold=2, tiers=tiers)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for a, b in data[:10]:
                s.run(train, {ids: a, y: b})
            path = saver.save(s, str(tmp_path / "model"), global_step=10)
            stats_at_save = t.stats()
            straight = [s.run([train, loss], {ids: a, y: b})[1] for a, b in data[10:]]
            rows_straight = s.run(t.export_op())
    assert stats_at_save["candidates"] > 0  # admission state is part of the checkpoint
    if ssd:
        assert stats_at_save["ssd_rows"] == stats_at_save["size"] - 8 > 20
        # the rows are in the engine's files next to the checkpoint, the TF
        # checkpoint holds a marker
        assert os.path.isfile(os.path.join(path + ".dynemb", "MANIFEST"))
        names = dict(tf.train.list_variables(path))
        assert "dynemb/ckpt_t/tiered" in names and "dynemb/ckpt_t/keys" not in names
    dynemb.clear_tables()
    with tf.Graph().as_default():
        t, ids, y, loss, train = _build(access_threshold=2, tiers=tiers)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as s:
            saver.restore(s, path)
            st = t.stats()
            if ssd:
                assert st["host_rows"] == 8 and st["ssd_rows"] == st["size"] - 8
            assert (st["size"], st["candidates"], st["apply_steps"]) == (
                stats_at_save["size"], stats_at_save["candidates"], stats_at_save["apply_steps"])
            resumed = [s.run([train, loss], {ids: a, y: b})[1] for a, b in data[10:]]
            rows_resumed = s.run(t.export_op())
    np.testing.assert_allclose(resumed, straight, rtol=1e-6)
    for field, a, b in zip(rows_straight._fields, rows_straight, rows_resumed):
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=field)


def test_checkpoint_holds_table_tensors_and_max_to_keep(tmp_path):
    t, ids, y, loss, train = _build()
    saver = tf.compat.v1.train.Saver(max_to_keep=2)
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        for step, (a, b) in enumerate(_data(4, 2)):
            s.run(train, {ids: a, y: b})
            saver.save(s, str(tmp_path / "m"), global_step=step)
    names = dict(tf.train.list_variables(str(tmp_path / "m-3")))
    assert names["dynemb/ckpt_t/values"] == [t.size(), DIM * 3]  # embedding + m + v
    assert "dynemb/ckpt_t/apply_steps" in names
    kept = sorted(f for f in os.listdir(tmp_path) if f.endswith(".index"))
    assert kept == ["m-2.index", "m-3.index"]


def test_restore_into_a_different_dim_is_a_clear_error(tmp_path):
    t = dynemb.create_table(tf.int64, 4, "dimtab", tf.compat.v1.zeros_initializer())
    out = dynemb.sparse_lookup(t, tf.constant([1, 2], tf.int64))
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as s:
        s.run(out)
        path = saver.save(s, str(tmp_path / "d"))
    dynemb.clear_tables()
    with tf.Graph().as_default():
        dynemb.create_table(tf.int64, 8, "dimtab", tf.compat.v1.zeros_initializer())
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as s:
            with pytest.raises(tf.errors.InvalidArgumentError, match="dimtab") as e:
                saver.restore(s, path)
    assert "4" in e.value.message and "8" in e.value.message


def test_tiered_table_checkpoints_follow_max_to_keep(tmp_path):
    tiers = {"host_vocabulary_size": 4, "device_vocabulary_size": 0,
             "ssd_vocabulary_size": 1000, "ssd_data_path": str(tmp_path / "ssd")}
    data = _data(6, 2)
    with tf.Graph().as_default():
        t, ids, y, loss, train = _build(tiers=tiers)
        saver = tf.compat.v1.train.Saver(max_to_keep=2)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for i, (a, b) in enumerate(data):
                s.run(train, {ids: a, y: b})
                saver.save(s, str(tmp_path / "model"), global_step=i)
            kept = sorted(p for p in os.listdir(tmp_path) if p.endswith(".dynemb"))
            assert kept == ["model-4.dynemb", "model-5.dynemb"]
            # restoring a checkpoint whose rows are gone is a clear error
            import shutil
            shutil.rmtree(tmp_path / "model-4.dynemb")
            with pytest.raises(ValueError, match="model-4.dynemb.*ckpt_t"):
                saver.restore(s, str(tmp_path / "model-4"))
