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


def test_saving_again_to_a_remote_directory_keeps_only_the_new_files(tmp_path):
    # The engine deletes the files of the previous save's tables; the copy
    # there deletes them too, so a directory saved to N times holds one save.
    t, ids, train, read = _model("resave")
    d = "ram://dynemb_test/resave"
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        for k in range(3):
            _steps(s, ids, train, 3 * k, 3 * k + 3)
            dynemb.save_tables(d)
            dynemb.save_tables(str(tmp_path / "local"))
        want = s.run(read)
        assert sorted(tf.io.gfile.listdir(d)) == sorted(os.listdir(tmp_path / "local"))
        _steps(s, ids, train, 20, 23)
        dynemb.restore_tables(d)
        np.testing.assert_array_equal(s.run(read), want)


def test_prune_keeps_other_prefixes_and_checkpoints_the_saver_keeps(tmp_path):
    # max_to_keep=1: the Saver's older steps go, and their sparse directories
    # with them; another Saver's prefix that starts alike ("model-best") and
    # a step whose checkpoint files are still there are kept, locally and
    # on a remote file system alike.
    t, ids, train, read = _model("prune")
    for root in (str(tmp_path), "ram://dynemb_test/prune"):
        saver = tf.compat.v1.train.Saver(max_to_keep=1)
        best = tf.compat.v1.train.Saver(max_to_keep=5)
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            best.save(s, root + "/model-best", global_step=100)
            saver.save(s, root + "/model", global_step=1)
            for f in tf.io.gfile.glob(root + "/model-1.*"):  # (kept by its user, say)
                tf.io.gfile.copy(f, f.replace("model-1", "model-7"))
            tf.io.gfile.makedirs(root + "/sparse-model-7")
            saver.save(s, root + "/model", global_step=2)
            saver.save(s, root + "/model", global_step=3)
        names = {n.rstrip("/") for n in tf.io.gfile.listdir(root)}
        assert {"sparse-model-best-100", "sparse-model-7", "sparse-model-3"} <= names, root
        assert not {"sparse-model-1", "sparse-model-2"} & names, root


def test_file_scheme_paths_are_local_and_remote_exports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    t, ids, train, read = _model("scheme")
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        _steps(s, ids, train, 0, 6)
        path = saver.save(s, "file://" + str(tmp_path / "ck" / "model"), global_step=1)
        assert (tmp_path / "ck" / "sparse-model-1" / "MANIFEST").is_file()
        assert not (tmp_path / "file:").exists()
        saver.restore(s, path)
        # mxRec's saver.sparse.export of a checkpoint on a remote file system
        saver.save(s, "ram://dynemb_test/exp/model", global_step=2)
        from dynemb.saver.sparse import export
        assert export() == ["scheme"]
        keys = "ram://dynemb_test/exp/sparse-model-2/npy/scheme/keys.npy"
        with tf.io.gfile.GFile(keys, "rb") as f:
            got = np.load(f)
    assert len(got) == t.size() and not (tmp_path / "ram:").exists()


def test_a_full_remote_save_after_local_incremental_ones(tmp_path):
    # Tables saved incrementally before (locally) still save in full to a
    # remote path; a delta there is the explicit error.
    t, ids, train, read = _model("mixed")
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        _steps(s, ids, train, 0, 3)
        dynemb.save_tables(str(tmp_path / "full"), incremental=True)
        _steps(s, ids, train, 3, 6)
        dynemb.save_tables(str(tmp_path / "delta"), incremental=True)
        want = s.run(read)
        dynemb.save_tables("ram://dynemb_test/mixed")
        with pytest.raises(ValueError, match="incremental checkpoints"):
            dynemb.save_tables("ram://dynemb_test/mixed2", incremental=True)
        _steps(s, ids, train, 6, 9)
        dynemb.restore_tables("ram://dynemb_test/mixed")
        np.testing.assert_array_equal(s.run(read), want)
