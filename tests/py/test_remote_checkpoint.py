"""Checkpoints on TensorFlow's file systems (hdfs://, s3://, ...): the tables
are staged locally and copied there (dynemb.core.remote). TensorFlow's
in-memory file system (ram://) stands in for a remote one. The reference:
the same saves to a local directory."""
import os

import numpy as np
import pytest
import tensorflow as tf

import dynemb


def _model(name):
    t = dynemb.create_table(tf.int64, 3, name, tf.compat.v1.random_uniform_initializer(seed=4))
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = dynemb.sparse_lookup(t, ids, access_and_evict_config={"access_threshold": 2})
    opt = dynemb.optimizers.adagrad.create_hash_optimizer(0.1, 0.1)
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(tf.reduce_sum(emb * emb), sparse), sparse))
    read = dynemb.sparse_lookup(t, tf.range(12, dtype=tf.int64), is_train=False)
    return t, ids, train, read


def _steps(s, ids, train, lo, hi):
    for step in range(lo, hi):
        s.run(train, {ids: [step % 7, (step * 3) % 11, 5]})


def test_saver_on_a_remote_file_system_saves_prunes_and_restores(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (nothing may land in a local "ram:" directory)
    t, ids, train, read = _model("remote")
    saver = tf.compat.v1.train.Saver(max_to_keep=2)
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        for step in (1, 2, 3):
            _steps(s, ids, train, 3 * step, 3 * step + 3)
            path = saver.save(s, "ram://dynemb_test/ck/model", global_step=step)
        saved = s.run(read)
        local = saver.save(s, str(tmp_path / "local" / "model"), global_step=3)
        _steps(s, ids, train, 20, 26)  # the table moves on
        assert not np.array_equal(s.run(read), saved)
        saver.restore(s, path)
        np.testing.assert_array_equal(s.run(read), saved)
        names = sorted(n.rstrip("/") for n in tf.io.gfile.listdir("ram://dynemb_test/ck"))
        assert [n for n in names if n.startswith("sparse-")] == ["sparse-model-2",
                                                                  "sparse-model-3"]
        # training on from the restored state equals training on from the local copy
        _steps(s, ids, train, 30, 33)
        after_remote = s.run(read)
        saver.restore(s, local)
        _steps(s, ids, train, 30, 33)
        np.testing.assert_array_equal(s.run(read), after_remote)
    assert not os.path.exists(tmp_path / "ram:")
    assert t.size() > 0


def test_save_and_restore_tables_on_a_remote_path_and_their_errors(tmp_path):
    t, ids, train, read = _model("remote_api")
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        _steps(s, ids, train, 0, 6)
        want = s.run(read)
        dynemb.save_tables("ram://dynemb_test/api/ckpt")
        _steps(s, ids, train, 6, 9)
        dynemb.restore_tables("ram://dynemb_test/api/ckpt")
        np.testing.assert_array_equal(s.run(read), want)
        # the manifest is there, and copied last (a cut-short copy has none)
        files = tf.io.gfile.listdir("ram://dynemb_test/api/ckpt")
        assert "MANIFEST" in files and len(files) > 1
        with pytest.raises(ValueError, match="no such checkpoint directory"):
            dynemb.restore_tables("ram://dynemb_test/api/none")
        with pytest.raises(ValueError, match="incremental checkpoints .* local directory"):
            dynemb.save_tables("ram://dynemb_test/api/delta", incremental=True)
