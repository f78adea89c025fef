"""Checkpoints through tf.compat.v1.train.Saver include the tables (rows,
optimizer slots, admission candidates, Adam's step count)."""
import ctypes
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb import _lib
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
    # the rows are in the engine's files in mxRec's sparse directory next to
    # the checkpoint (model-10 -> sparse-model-10), the TF checkpoint holds a
    # marker
    assert os.path.isfile(tmp_path / "sparse-model-10" / "MANIFEST")
    names = dict(tf.train.list_variables(path))
    assert "dynemb/ckpt_t/keys" not in names
    assert ("dynemb/ckpt_t/tiered" if ssd else "dynemb/ckpt_t/meta") in names
    if ssd:
        assert stats_at_save["ssd_rows"] == stats_at_save["size"] - 8 > 20
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


def test_checkpoint_holds_the_table_in_its_sparse_directory_and_max_to_keep(tmp_path):
    t, ids, y, loss, train = _build()
    saver = tf.compat.v1.train.Saver(max_to_keep=2)
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        for step, (a, b) in enumerate(_data(4, 2)):
            s.run(train, {ids: a, y: b})
            saver.save(s, str(tmp_path / "m"), global_step=step)
    names = dict(tf.train.list_variables(str(tmp_path / "m-3")))
    assert names["dynemb/ckpt_t/meta"] == [3]
    entries = ctypes.POINTER(_lib.CkptEntry)()
    n = ctypes.c_size_t()
    _lib.check(_lib.clib.dynemb_checkpoint_inspect(str(tmp_path / "sparse-m-3").encode(),
                                                   ctypes.byref(entries), ctypes.byref(n)),
               "inspect")
    e = entries[0]
    assert (n.value, e.name, e.rows, e.row_floats) == (1, b"ckpt_t", t.size(), DIM * 3)
    _lib.clib.dynemb_ckpt_entries_free(entries, n)
    kept = sorted(f for f in os.listdir(tmp_path) if f.endswith(".index"))
    assert kept == ["m-2.index", "m-3.index"]
    assert sorted(f for f in os.listdir(tmp_path) if f.startswith("sparse-")) == \
        ["sparse-m-2", "sparse-m-3"]


@pytest.mark.parametrize("ssd", [False, True], ids=["memory", "ssd_tier"])
def test_checkpoints_of_earlier_versions_restore(tmp_path, ssd):
    # Earlier versions kept a memory table's rows as tensors in the Saver's
    # files (TableSaveable) and a tiered table's in <prefix>.dynemb.
    from dynemb.core.embedding import TableSaveable
    tiers = ({"host_vocabulary_size": 4, "ssd_vocabulary_size": 1000,
              "ssd_data_path": str(tmp_path / "ssd")} if ssd else None)
    data = _data(4, 2)
    with tf.Graph().as_default():
        t, ids, y, loss, train = _build(tiers=tiers)
        old = [TableSaveable(t)] if not ssd else None
        saver = tf.compat.v1.train.Saver(var_list=old + tf.compat.v1.global_variables()
                                         if old else None)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for a, b in data:
                s.run(train, {ids: a, y: b})
            path = saver.save(s, str(tmp_path / "old"))
            want = s.run(t.export_op())
    if ssd:  # as an earlier version laid it out
        os.rename(tmp_path / "sparse-old", tmp_path / "old.dynemb")
    else:
        assert "dynemb/ckpt_t/keys" in dict(tf.train.list_variables(path))
        shutil.rmtree(tmp_path / "sparse-old")
    dynemb.clear_tables()
    with tf.Graph().as_default():
        t, ids, y, loss, train = _build(tiers=tiers)
        with tf.compat.v1.Session() as s:
            tf.compat.v1.train.Saver().restore(s, path)
            got = s.run(t.export_op())
    for field, a, b in zip(want._fields, want, got):
        np.testing.assert_array_equal(a, b, err_msg=field)


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
            with pytest.raises(dynemb.DynembError, match="dimtab") as e:
                saver.restore(s, path)
    assert "dim 4" in str(e.value) and "dim 8" in str(e.value)


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
            kept = sorted(p for p in os.listdir(tmp_path) if p.startswith("sparse-"))
            assert kept == ["sparse-model-4", "sparse-model-5"]
            # restoring a checkpoint whose rows are gone is a clear error
            shutil.rmtree(tmp_path / "sparse-model-4")
            with pytest.raises(ValueError, match="ckpt_t.*sparse-model-4.*is missing"):
                saver.restore(s, str(tmp_path / "model-4"))


def _saved_once(tmp_path):
    """A Saver checkpoint of _build's model; its prefix."""
    t, ids, y, loss, train = _build()
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        for a, b in _data(3, 5):
            s.run(train, {ids: a, y: b})
        return saver.save(s, str(tmp_path / "model"), global_step=3)


def _restore_error(path):
    """The error of Saver.restore(path) in a new process's graph."""
    dynemb.clear_tables()
    with tf.Graph().as_default():
        _build()
        with tf.compat.v1.Session() as s:
            with pytest.raises(dynemb.DynembError) as e:
                tf.compat.v1.train.Saver().restore(s, path)
    return str(e.value)


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("ranks", [1, 2], ids=["one_process", "two_parts"])
def test_a_damaged_manifest_is_named_not_taken_for_a_missing_table(tmp_path, ranks):
    """Saver.restore of a checkpoint whose sparse directory (or one rank's
    part of it) has a damaged MANIFEST names that file, says it is damaged
    and what to do, and does not send the user looking for a table."""
    path = _saved_once(tmp_path)
    sparse = tmp_path / "sparse-model-3"
    if ranks > 1:  # (two parts, as two ranks lay a checkpoint out)
        os.rename(sparse, tmp_path / "one")
        for r in range(ranks):
            shutil.copytree(tmp_path / "one", sparse / ("rank-%d-of-%d" % (r, ranks)))
        sparse = sparse / "rank-1-of-2"
    _flip(sparse / "MANIFEST")
    msg = _restore_error(path)
    assert str(sparse / "MANIFEST") in msg and "damaged" in msg, msg
    assert "restore an earlier checkpoint" in msg and "backup" in msg, msg
    assert "lacks" not in msg, msg


def test_a_damaged_table_file_is_named(tmp_path):
    path = _saved_once(tmp_path)
    sparse = tmp_path / "sparse-model-3"
    (victim,) = [p for p in sparse.iterdir() if p.suffix == ".dtab"]
    _flip(victim)
    msg = _restore_error(path)
    assert victim.name in msg and str(sparse) in msg and "damaged" in msg, msg
    assert "'ckpt_t'" in msg and "restore an earlier checkpoint" in msg, msg


def test_a_sparse_directory_without_manifest_says_so(tmp_path):
    path = _saved_once(tmp_path)
    os.remove(tmp_path / "sparse-model-3" / "MANIFEST")
    dynemb.clear_tables()
    with tf.Graph().as_default():
        _build()
        with tf.compat.v1.Session() as s:
            with pytest.raises(ValueError, match="ckpt_t.*sparse-model-3.*has no MANIFEST"):
                tf.compat.v1.train.Saver().restore(s, path)
