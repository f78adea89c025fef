"""SavedModels for serving (dynemb.core.serving): what the exported graph
computes, against the training graph's own eval lookups in the same process
and against the table's rows read another way (export_tables); the export
paths (dynemb.export_saved_model, simple_save, a MonitoredSession's
finalized graph); tables on the SSD tier; and the errors. Loading in a
process without dynemb, and the Criteo demo's models, are in
test_examples.py."""
import os

import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.optimizers import adagrad

SERVE = tf.compat.v1.saved_model.tag_constants.SERVING


def _load_and_run(export_dir, feeds, output="out"):
    """The served output for `feeds` (input name -> array), with stock ops:
    TensorFlow's own loader, in a graph of its own."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        mg = tf.compat.v1.saved_model.loader.load(s, [SERVE], export_dir)
        ops = {n.op for n in mg.graph_def.node}
        sig = mg.signature_def["serving_default"]
        out = s.run(sig.outputs[output].name,
                    {sig.inputs[k].name: v for k, v in feeds.items()})
    assert not [o for o in ops if o.startswith("Dynemb")], ops
    return out, ops


def _table(name="serve_t", dim=3, **kw):
    opt = adagrad.create_hash_optimizer(0.3)
    return dynemb.create_table(tf.int64, dim, name, tf.compat.v1.random_uniform_initializer(
        -1, 1, seed=5), optimizer_list=[opt], **kw), opt


def _train(table, opt, batches, dtype=tf.int64, shape=(None,)):
    ids = tf.compat.v1.placeholder(dtype, shape, name="ids")
    cfg = {"access_threshold": 2, "eviction_threshold": 0}
    rows = dynemb.sparse_lookup(table, ids, is_train=True, access_and_evict_config=cfg)
    train = opt.minimize(tf.reduce_sum(rows ** 2))
    return ids, rows, train


@pytest.mark.parametrize("dtype,shape", [(tf.int64, (None,)), (tf.int32, (None, 2))])
def test_served_rows_are_the_eval_lookups(tmp_path, dtype, shape):
    t, opt = _table()
    ids, _, train = _train(t, opt, None, dtype, shape)
    served = dynemb.sparse_lookup(t, ids, is_train=False, serving_default_value=[0.5, -1, 2])
    rng = np.random.default_rng(1)
    with tf.compat.v1.Session() as s:
        for _ in range(6):
            s.run(train, {ids: rng.integers(0, 40, [8, 2][:len(shape)])})
        once = np.array([123, 456])  # seen once each: candidates
        s.run(train, {ids: once.reshape([1, 2]) if len(shape) == 2 else once})
        probe = np.array([1, 2, 3, 123, 999, -7, 2**31 - 1, 456]).reshape(
            [-1, 2][:len(shape)] if len(shape) == 2 else [-1])
        ref = s.run(served, {ids: probe})
        dynemb.export_saved_model(s, str(tmp_path / "m"), {"ids": ids}, {"out": served})
    got, ops = _load_and_run(str(tmp_path / "m"), {"ids": probe})
    np.testing.assert_array_equal(got, ref)
    assert {"HashTableV2", "LookupTableFindV2", "ResourceGather"} <= ops
    # another reading of the rows: every admitted id reads its row, the rest
    # (123 below the threshold, ids never seen) the serving default value
    dynemb.export_tables(str(tmp_path / "npy"), ["serve_t"])
    keys = np.load(tmp_path / "npy" / "serve_t" / "keys.npy")
    emb = np.load(tmp_path / "npy" / "serve_t" / "embeddings.npy")
    flat, out = probe.reshape(-1), got.reshape(-1, 3)
    for i, k in enumerate(flat):
        j = np.searchsorted(keys, k)
        if j < len(keys) and keys[j] == k:
            np.testing.assert_array_equal(out[i], emb[j])
        else:
            np.testing.assert_array_equal(out[i], [0.5, -1, 2])
    assert 123 not in keys and 456 not in keys and 999 not in keys and 1 in keys


def test_ssd_tier_table_exports_every_row(tmp_path):
    t, opt = _table("serve_ssd", 4, host_vocabulary_size=16, ssd_vocabulary_size=2000,
                    ssd_data_path=str(tmp_path / "ssd"))
    ids, _, train = _train(t, opt, None)
    served = dynemb.sparse_lookup(t, ids, is_train=False)
    keys = np.arange(-300, 300, 3, dtype=np.int64)
    with tf.compat.v1.Session() as s:
        for _ in range(2):
            s.run(train, {ids: keys})
        ref = s.run(served, {ids: keys})
        dynemb.export_saved_model(s, str(tmp_path / "m"), {"ids": ids}, {"out": served})
    st = t.stats()
    assert st["size"] == len(keys) and st["ssd_rows"] >= len(keys) - 16
    got, _ = _load_and_run(str(tmp_path / "m"), {"ids": keys})
    np.testing.assert_array_equal(got, ref)
    assets = os.listdir(tmp_path / "m" / "assets")
    assert sorted(assets) == ["dynemb-serve_ssd-keys.bin", "dynemb-serve_ssd-rows.bin"]
    assert os.path.getsize(tmp_path / "m" / "assets" / "dynemb-serve_ssd-rows.bin") == \
        (len(keys) + 1) * 4 * 4  # embeddings only (no Adagrad slots), and the default row


def test_training_graph_exports_through_simple_save(tmp_path):
    """A sess.run script's own training graph: the prediction from its train
    lookup is exported; the train op, the applies and the Saver's table
    files are not."""
    t, opt = _table()
    ids, rows, train = _train(t, opt, None)
    w = tf.compat.v1.get_variable("w", [3], initializer=tf.compat.v1.constant_initializer(
        [1, -2, 0.5]))
    pred = tf.reduce_sum(rows * w, axis=1)
    with tf.compat.v1.Session() as s:
        s.run(w.initializer)
        s.run(train, {ids: [1, 2, 3]})
        s.run(train, {ids: [1, 2, 4]})
        probe = np.array([1, 2, 3, 4, 5], np.int64)
        # an eval lookup of the same ids is the reference (the train lookup
        # would insert and count them)
        ref = s.run(tf.reduce_sum(dynemb.sparse_lookup(t, ids, is_train=False) * w, axis=1),
                    {ids: probe})
        tf.compat.v1.saved_model.simple_save(s, str(tmp_path / "m"), {"ids": ids},
                                             {"out": pred})
    got, ops = _load_and_run(str(tmp_path / "m"), {"ids": probe})
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
    assert not [o for o in ops if "Apply" in o or o == "PyFunc"], ops
    assert sorted(os.listdir(tmp_path / "m" / "variables")) == [
        "variables.data-00000-of-00001", "variables.index"]  # no table checkpoint


def test_export_from_a_monitored_session(tmp_path):
    t, opt = _table()
    ids, _, train = _train(t, opt, None)
    served = dynemb.sparse_lookup(t, ids, is_train=False)
    tf.compat.v1.train.get_or_create_global_step()
    with tf.compat.v1.train.MonitoredTrainingSession() as s:
        for _ in range(2):
            s.run(train, {ids: [7, 8]})
        ref = s.run(served, {ids: [7, 8, 9]})
        dynemb.export_saved_model(s, str(tmp_path / "m"), {"ids": ids}, {"out": served})
        assert tf.compat.v1.get_default_graph().finalized
    got, _ = _load_and_run(str(tmp_path / "m"), {"ids": np.array([7, 8, 9])})
    np.testing.assert_array_equal(got, ref)


def test_export_errors_name_the_cause_and_write_nothing(tmp_path):
    t, opt = _table()
    ids, rows, train = _train(t, opt, None)
    with tf.control_dependencies([train]):
        after_step = tf.identity(rows)
    with tf.compat.v1.Session() as s:
        s.run(train, {ids: [1, 1]})
        with pytest.raises(ValueError, match=r"signature 'serving_default' output 'out' "
                           r"needs .*\(DynembApply\).*export the prediction"):
            dynemb.export_saved_model(s, str(tmp_path / "m"), {"ids": ids},
                                      {"out": after_step})
        assert os.listdir(tmp_path) == []
        os.makedirs(tmp_path / "exists")
        with pytest.raises(ValueError, match="exists; pass a new directory"):
            dynemb.export_saved_model(s, str(tmp_path / "exists"), {"ids": ids},
                                      {"out": rows})
        with pytest.raises(TypeError, match="dicts of name -> tensor"):
            dynemb.export_saved_model(s, str(tmp_path / "m"), ids, rows)
        # a training graph exports as often as it likes (after a failed export too)
        for k in range(2):
            dynemb.export_saved_model(s, str(tmp_path / ("ok%d" % k)), {"ids": ids},
                                      {"out": rows})
        dynemb.drop_table("serve_t")
        with pytest.raises(ValueError, match="table 'serve_t', which is not registered"):
            dynemb.export_saved_model(s, str(tmp_path / "m"), {"ids": ids}, {"out": rows})
    assert sorted(os.listdir(tmp_path)) == ["exists", "ok0", "ok1"]


def test_graph_without_tables_exports_unchanged(tmp_path):
    x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
    w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.constant_initializer(3))
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        dynemb.export_saved_model(s, str(tmp_path / "m"), {"x": x}, {"out": x * w})
    got, _ = _load_and_run(str(tmp_path / "m"), {"x": np.array([1, 2], np.float32)})
    np.testing.assert_array_equal(got, [3, 6])
    assert not os.path.exists(tmp_path / "m" / "assets")
