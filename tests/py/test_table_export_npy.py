"""Tables for other systems: dynemb.export_tables and mxRec's
saver.sparse.export write keys and embeddings (no optimizer state) as NumPy
files. The reference: the table's own export op (DynembExport) in the same
process, and the rows of the checkpoint the Saver wrote."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.optimizers import lazy_adam
from dynemb.saver.sparse import export

from table_export import checkpoint_rows, export_sorted


def _trained(tmp_path, save=True):
    opt = lazy_adam.create_hash_optimizer(0.05)
    t = dynemb.create_table(tf.int64, 3, "npy_t", tf.compat.v1.random_uniform_initializer(
        -1, 1, seed=3), optimizer_list=[opt])
    step = tf.compat.v1.placeholder(tf.int64, [])
    train = opt.minimize(tf.reduce_sum(dynemb.sparse_lookup(t, tf.stack([5, -2, 7 + step, 5]))))
    with tf.compat.v1.Session() as s:
        for k in range(3):
            s.run(train, {step: k})
        if save:
            tf.compat.v1.train.Saver().save(s, str(tmp_path / "model"), global_step=3)
    return t


def test_export_tables_writes_keys_and_embeddings(tmp_path):
    _trained(tmp_path, save=False)
    assert dynemb.export_tables(tmp_path / "out") == ["npy_t"]
    keys = np.load(tmp_path / "out" / "npy_t" / "keys.npy")
    emb = np.load(tmp_path / "out" / "npy_t" / "embeddings.npy")
    ref_keys, ref_values = export_sorted("npy_t")
    np.testing.assert_array_equal(keys, ref_keys)
    np.testing.assert_array_equal(emb, ref_values[:, :3])  # no Adam slots
    assert emb.dtype == np.float32 and keys.dtype == np.int64
    with pytest.raises(dynemb.DynembError, match="'nope' does not exist"):
        dynemb.export_tables(tmp_path / "out2", ["nope"])


def test_mxrec_export_reads_the_checkpoint_of_the_current_step(tmp_path):
    _trained(tmp_path)
    export(table_list=["npy_t"])
    d = tmp_path / "sparse-model-3" / "npy" / "npy_t"
    keys, values = checkpoint_rows(tmp_path / "model-3", "npy_t")
    np.testing.assert_array_equal(np.load(d / "keys.npy"), keys)
    np.testing.assert_array_equal(np.load(d / "embeddings.npy"), values[:, :3])
    with pytest.raises(ValueError, match="non-empty list"):
        export(table_list=[])
    with pytest.raises(dynemb.DynembError, match="nope"):
        export(table_list=["nope"])


def test_mxrec_export_before_any_save_is_a_clear_error():
    with pytest.raises(ValueError, match="no checkpoint was saved in this process"):
        export()


def test_ckpt_export_command_writes_the_same_files(tmp_path):
    # `dynemb ckpt export` (C, no TensorFlow) writes what export_tables writes.
    import os
    import subprocess
    _trained(tmp_path)
    dynemb.export_tables(tmp_path / "py")
    cli = os.path.join(os.path.dirname(__file__), "..", "..", "build", "dynemb")
    r = subprocess.run([cli, "ckpt", "export", str(tmp_path / "sparse-model-3"),
                        str(tmp_path / "c")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "npy_t: 5 rows x 3" in r.stdout  # ids 5, -2, 7, 8, 9
    for f in ("keys.npy", "embeddings.npy"):
        a, b = np.load(tmp_path / "py" / "npy_t" / f), np.load(tmp_path / "c" / "npy_t" / f)
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    r = subprocess.run([cli, "ckpt", "export", str(tmp_path / "sparse-model-3"),
                        str(tmp_path / "c"), "nope"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "nope" in r.stderr
    assert sorted(os.listdir(tmp_path / "c")) == ["npy_t"]  # nothing half written
