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
    cfg = {"access_threshold": 2}
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


# ---- cases found by review: each exported, then loaded with stock ops ----

def test_iterator_input_loads(tmp_path):
    """A signature input from an iterator's get_next: the kept iterator
    was colocated with the pruned dataset (every import failed)."""
    t, opt = _table()
    ds = tf.data.Dataset.from_tensor_slices(np.arange(8, dtype=np.int64)).batch(4).repeat()
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    ids = it.get_next()
    rows = dynemb.sparse_lookup(t, ids, is_train=True)
    train = opt.minimize(tf.reduce_sum(rows ** 2))
    with tf.compat.v1.Session() as s:
        s.run(it.initializer)
        s.run(train)
        s.run(train)
        ref = s.run(dynemb.sparse_lookup(t, tf.constant([0, 1, 2, 3], tf.int64),
                                         is_train=False))
        dynemb.export_saved_model(s, str(tmp_path / "m"), {"ids": ids}, {"out": rows})
    got, _ = _load_and_run(str(tmp_path / "m"), {"ids": np.arange(4)})
    np.testing.assert_array_equal(got, ref)


def test_empty_table_serves_the_default(tmp_path):
    t, _ = _table()
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    rows = dynemb.sparse_lookup(t, ids, is_train=False, serving_default_value=[1, 2, 3])
    with tf.compat.v1.Session() as s:
        dynemb.export_saved_model(s, str(tmp_path / "m"), {"ids": ids}, {"out": rows})
    got, _ = _load_and_run(str(tmp_path / "m"), {"ids": np.array([5, 6])})
    np.testing.assert_array_equal(got, [[1, 2, 3], [1, 2, 3]])


@pytest.mark.parametrize("how", ["export_saved_model", "simple_save"])
def test_the_models_own_assets_travel_with_it(tmp_path, how):
    """A vocabulary file of the graph (ASSET_FILEPATHS) is copied into the
    model and read from there: the model loads after the original is gone."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("apple\nbanana\n")
    t, _ = _table()
    words = tf.compat.v1.placeholder(tf.string, [None], name="words")
    index = tf.lookup.StaticHashTable(tf.lookup.TextFileInitializer(
        str(vocab), tf.string, tf.lookup.TextFileIndex.WHOLE_LINE, tf.int64,
        tf.lookup.TextFileIndex.LINE_NUMBER), -1)
    rows = dynemb.sparse_lookup(t, index.lookup(words), is_train=True)
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.tables_initializer())
        s.run(rows, {words: ["apple", "banana"]})
        ref = s.run(dynemb.sparse_lookup(t, index.lookup(words), is_train=False),
                    {words: ["banana", "cherry"]})
        if how == "simple_save":
            tf.compat.v1.saved_model.simple_save(
                s, str(tmp_path / "m"), {"words": words}, {"out": rows},
                legacy_init_op=tf.compat.v1.tables_initializer())
        else:
            dynemb.export_saved_model(s, str(tmp_path / "m"), {"words": words}, {"out": rows})
    assert "vocab.txt" in os.listdir(tmp_path / "m" / "assets")
    os.remove(vocab)
    got, _ = _load_and_run(str(tmp_path / "m"), {"words": np.array([b"banana", b"cherry"])})
    np.testing.assert_array_equal(got, ref)


def test_several_meta_graphs_share_the_tables_files(tmp_path):
    """Tables whose file names collide ("a/b", "a_b"), in two meta graphs of
    one SavedModel: each serves its own rows."""
    ta = dynemb.create_table(tf.int64, 2, "a/b", tf.compat.v1.ones_initializer())
    tb = dynemb.create_table(tf.int64, 2, "a_b", tf.compat.v1.zeros_initializer())
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    ea, eb = [dynemb.sparse_lookup(t, ids, is_train=True) for t in (ta, tb)]
    sig = tf.compat.v1.saved_model.signature_def_utils.predict_signature_def
    with tf.compat.v1.Session() as s:
        s.run([ea, eb], {ids: [1]})
        b = tf.compat.v1.saved_model.Builder(str(tmp_path / "m"))
        b.add_meta_graph_and_variables(s, ["serve"], {"serving_default": sig(
            {"ids": ids}, {"a": ea, "b": eb})})
        b.add_meta_graph(["b_only"], {"serving_default": sig({"ids": ids}, {"b": eb})})
        b.save()
    got, _ = _load_and_run(str(tmp_path / "m"), {"ids": np.array([1])}, output="a")
    np.testing.assert_array_equal(got, [[1, 1]])
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        mg = tf.compat.v1.saved_model.loader.load(s, ["b_only"], str(tmp_path / "m"))
        sg = mg.signature_def["serving_default"]
        np.testing.assert_array_equal(
            s.run(sg.outputs["b"].name, {sg.inputs["ids"].name: [1]}), [[0, 0]])


def test_lookup_in_a_tf1_while_loop_is_a_clear_error(tmp_path):
    tf.compat.v1.disable_control_flow_v2()
    try:
        t, _ = _table()
        ids = tf.compat.v1.placeholder(tf.int64, [None, 2], name="ids")
        out = tf.map_fn(lambda r: tf.reduce_sum(dynemb.sparse_lookup(t, r, is_train=False), 0),
                        ids, dtype=tf.float32)
        with tf.compat.v1.Session() as s:
            with pytest.raises(ValueError, match="inside the TF1 while loop"):
                dynemb.export_saved_model(s, str(tmp_path / "m"), {"ids": ids}, {"out": out})
    finally:
        tf.compat.v1.enable_control_flow_v2()
    assert not os.path.exists(tmp_path / "m")


def test_remote_file_system_is_a_clear_error():
    t, _ = _table()
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    rows = dynemb.sparse_lookup(t, ids, is_train=True)
    with tf.compat.v1.Session() as s:
        with pytest.raises(ValueError, match="TensorFlow file system"):
            tf.compat.v1.saved_model.simple_save(s, "ram://dynemb-m", {"ids": ids},
                                                 {"out": rows})


def test_estimator_export_of_several_modes(tmp_path):
    """experimental_export_all_saved_models: the second mode's meta graph
    (add_meta_graph) leaves the tables' markers out of its saver too."""
    from tensorflow_estimator.python.estimator.export.export import SupervisedInputReceiver

    def model_fn(features, labels, mode):
        opt = adagrad.create_hash_optimizer(0.1)
        t = dynemb.create_table(tf.int64, 2, "est_modes", tf.compat.v1.ones_initializer(),
                                optimizer_list=[opt])
        logits = tf.reduce_sum(dynemb.sparse_lookup(t, features["ids"],
                                                    is_train=mode == "train"), 1)
        if mode == "infer":
            return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
        loss = tf.reduce_mean(tf.square(logits - labels))
        if mode == "eval":
            return tf.estimator.EstimatorSpec(mode, loss=loss)
        _, sparse = dynemb.get_dense_and_sparse_variable()
        op = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse),
                                 global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=op)

    est = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "md"))
    est.train(lambda: tf.data.Dataset.from_tensors(({"ids": [[1], [2]]}, [1.0, 0.0])),
              steps=1)

    def predict_fn():
        x = {"ids": tf.compat.v1.placeholder(tf.int64, [None, 1], name="ids")}
        return tf.estimator.export.ServingInputReceiver(x, x)

    def eval_fn():
        x = {"ids": tf.compat.v1.placeholder(tf.int64, [None, 1], name="ids")}
        y = tf.compat.v1.placeholder(tf.float32, [None], name="y")
        return SupervisedInputReceiver(x, y, dict(x, y=y))

    path = est.experimental_export_all_saved_models(
        str(tmp_path / "exp"), {"infer": predict_fn, "eval": eval_fn}).decode()
    want = [r["logits"] for r in est.predict(
        lambda: tf.data.Dataset.from_tensors({"ids": [[1], [2], [7]]}))]
    for tags in (["serve"], ["eval"]):
        with tf.Graph().as_default(), tf.compat.v1.Session() as s:
            mg = tf.compat.v1.saved_model.loader.load(s, tags, path)
            assert not [n.op for n in mg.graph_def.node if n.op in ("PyFunc",) or
                        n.op.startswith("Dynemb")]
            if tags == ["serve"]:
                sig = mg.signature_def["serving_default"]
                got = s.run(sig.outputs["logits"].name,
                            {sig.inputs["ids"].name: [[1], [2], [7]]})
                np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


@pytest.mark.pinned_only
@pytest.mark.skipif(not __import__("shutil").which("mpirun") or not os.path.isfile(
    os.path.join(os.path.dirname(__file__), "..", "..", "build", "tf",
                 "_dynemb_sharded_ops.so")), reason="needs Open MPI's mpirun and make ops")
def test_an_export_error_on_one_rank_fails_every_rank_at_once(tmp_path):
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "mpi", "export_fault.py")
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
               DYNEMB_EXCHANGE_TIMEOUT="120")
    r = subprocess.run(["timeout", "-k", "5", "200", "mpirun", "--oversubscribe",
                        "--allow-run-as-root", "-np", "2", sys.executable, script,
                        str(tmp_path / "m")], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # (mpirun may join the ranks' lines: split on the marker, not on newlines)
    lines = sorted("RESULT" + part.split("\n")[0] for part in r.stdout.split("RESULT")[1:])
    assert len(lines) == 2, r.stdout
    for line in lines:
        took = float(line.split("seconds=")[1].split()[0])
        assert took < 30, line  # (not the exchange's 120 s timeout)
        assert "next=True" in line and "rank 1 failed" in line and "'t'" in line, line
    assert not os.path.exists(tmp_path / "m")


def test_repeated_exports_do_not_grow_the_graph(tmp_path):
    t, opt = _table()
    ids, rows, train = _train(t, opt, None)
    with tf.compat.v1.Session() as s:
        s.run(train, {ids: [1, 1, 2, 2]})
        sizes = []
        for k in range(3):
            dynemb.export_saved_model(s, str(tmp_path / ("m%d" % k)), {"ids": ids},
                                      {"out": rows})
            sizes.append(len(s.graph.get_operations()))
    assert sizes[1] == sizes[2] == sizes[0], sizes
    from tensorflow.core.protobuf import saved_model_pb2
    sm = saved_model_pb2.SavedModel()
    sm.ParseFromString((tmp_path / "m2" / "saved_model.pb").read_bytes())
    gather = [n for n in sm.meta_graphs[0].graph_def.node if n.op == "ResourceGather"]
    assert gather and "validate_indices" not in gather[0].attr  # (defaults stripped)
