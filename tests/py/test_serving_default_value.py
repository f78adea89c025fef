"""A lookup's own serving_default_value (mxRec: any tensor, per lookup):
ids without a row (unknown, not admitted yet) read it; ids with a row read
their row. The reference is computed here from which ids were admitted.
Plain lookups, the prepared pipeline of graph modification, and the
exported SavedModel (stock ops only) agree."""
import time

import numpy as np
import tensorflow as tf

import dynemb
from dynemb.graph.modifier import get_initializer, modify_graph_and_start_emb_cache
from dynemb.optimizers import gradient_descent


def _expected(rows, ids, admitted, default):
    out = np.where(np.isin(ids, list(admitted))[:, None], rows, default)
    return out.astype(np.float32)


def test_eval_lookups_of_one_table_with_defaults_of_their_own():
    dynemb.init()
    t = dynemb.create_table(tf.int64, 2, "own", tf.compat.v1.constant_initializer(0.5))
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    fill = tf.compat.v1.placeholder(tf.float32, [])
    train = dynemb.sparse_lookup(t, ids, access_and_evict_config={"access_threshold": 2})
    by_feed = dynemb.sparse_lookup(t, ids, is_train=False,
                                   serving_default_value=tf.ones([2]) * fill)
    per_row = tf.stack([tf.cast(ids, tf.float32), -tf.cast(ids, tf.float32)], axis=1)
    by_row = dynemb.sparse_lookup(t, ids, is_train=False, serving_default_value=per_row)
    consts = dynemb.sparse_lookup(t, ids, is_train=False, serving_default_value=[7.0, 8.0])
    other = dynemb.sparse_lookup(t, ids, is_train=False, serving_default_value=[1.0, 2.0])
    with tf.compat.v1.Session() as s:
        s.run(train, {ids: [1, 1, 2]})              # 1 admitted, 2 seen once
        q = np.array([1, 2, 3], np.int64)
        a, b, c, d = s.run([by_feed, by_row, consts, other], {ids: q, fill: 3.0})
    rows = np.full([3, 2], 0.5, np.float32)
    np.testing.assert_array_equal(a, _expected(rows, q, {1}, [3.0, 3.0]))
    np.testing.assert_array_equal(b, _expected(rows, q, {1}, np.stack([q, -q], 1)))
    np.testing.assert_array_equal(c, _expected(rows, q, {1}, [7.0, 8.0]))
    np.testing.assert_array_equal(d, _expected(rows, q, {1}, [1.0, 2.0]))


def _train_model(modify):
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    dynemb.init()
    # id 7: once in batch 2, once in batch 3, whose prepare (ahead of step 2
    # in the prepared mode) admits it: step 2 must still read its default.
    data = np.array([[1, 2], [1, 3], [7, 4], [5, 1], [7, 8], [8, 2]], np.int64)
    ds = tf.data.Dataset.from_tensor_slices({"f": data}).batch(2)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    t = dynemb.create_table(tf.int64, 2, "sdv", tf.compat.v1.constant_initializer(0.5))
    f = it.get_next()["f"]
    default = tf.cast(tf.reshape(f, [-1, 1]), tf.float32) * tf.constant([[1.0, 10.0]])
    emb = dynemb.sparse_lookup(t, f, modify_graph=modify, serving_default_value=default,
                               access_and_evict_config={"access_threshold": 2})
    loss = tf.reduce_sum(emb)
    opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
    _, sv = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sv), sv))
    if modify:
        modify_graph_and_start_emb_cache(prefetch=3)
    init = get_initializer(True) if modify else it.initializer
    outs = []
    with tf.compat.v1.Session() as s:
        s.run(init)
        for step in range(3):
            outs.append(s.run([emb, train])[0])
            if modify and step == 0:  # the pipeline prepares batches 2 and 3 meanwhile
                t0 = time.time()
                while time.time() - t0 < 10 and t.size() < 4:
                    time.sleep(0.1)
                assert t.size() == 4      # 1 and, ahead of step 2, 7, 8 and 2
    return outs


def test_train_lookup_default_in_plain_and_prepared_modes():
    """Not admitted yet reads the lookup's default; the prepared pipeline,
    which admits later batches' ids ahead, reads the same as plain lookups."""
    plain = _train_model(False)
    # batch 1 [[1,2],[1,3]]: id 1 admitted at its second sighting (threshold 2)
    np.testing.assert_array_equal(plain[0].reshape(-1, 2),
                                  [[1, 10], [2, 20], [0.5, 0.5], [3, 30]])
    assert plain[1].reshape(-1, 2)[0].tolist() == [7, 70]   # id 7, not admitted yet
    prepared = _train_model(True)
    for p, q in zip(plain, prepared):
        np.testing.assert_allclose(q, p, rtol=1e-6)


def test_exported_model_reads_its_own_default(tmp_path):
    dynemb.init()
    t = dynemb.create_table(tf.int64, 2, "exp", tf.compat.v1.constant_initializer(0.5))
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    scale = tf.compat.v1.placeholder(tf.float32, [None], name="scale")
    train = dynemb.sparse_lookup(t, ids)
    served = dynemb.sparse_lookup(t, ids, is_train=False,
                                  serving_default_value=tf.stack([scale, scale * 2], 1))
    q, sc = np.array([4, 9, 5], np.int64), np.array([1.0, 2.0, 3.0], np.float32)
    with tf.compat.v1.Session() as s:
        s.run(train, {ids: [4, 5]})
        want = s.run(served, {ids: q, scale: sc})
        dynemb.export_saved_model(s, str(tmp_path / "m"), {"ids": ids, "scale": scale},
                                  {"emb": served})
    np.testing.assert_array_equal(want, [[0.5, 0.5], [2.0, 4.0], [0.5, 0.5]])
    with tf.Graph().as_default() as g, tf.compat.v1.Session() as s:
        mg = tf.compat.v1.saved_model.loader.load(s, ["serve"], str(tmp_path / "m"))
        assert not [n.op for n in g.as_graph_def().node if n.op.startswith("Dynemb")]
        sig = mg.signature_def["serving_default"]
        got = s.run(sig.outputs["emb"].name, {sig.inputs["ids"].name: q,
                                              sig.inputs["scale"].name: sc})
    np.testing.assert_array_equal(got, want)


def test_a_lookup_without_a_value_reads_zeros_whatever_other_lookups_set():
    # mxRec: serving_default_value belongs to its lookup. A lookup without one
    # reads zeros for ids without a row, built before or after a lookup with
    # numbers, in the same graph or in another graph of the same table; and a
    # later graph's numbers never change what an earlier graph's lookups read.
    dynemb.init()
    q = np.array([1, 5], np.int64)

    def build(order, value=(7.0, 8.0)):
        t = dynemb.create_table(tf.int64, 2, "zeros", tf.compat.v1.constant_initializer(0.5))
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        out = {}
        for what in order:
            out[what] = dynemb.sparse_lookup(
                t, ids, is_train=what == "train",
                serving_default_value=list(value) if what == "valued" else None)
        return ids, out

    for order in (("valued", "plain", "train"), ("plain", "valued", "train")):
        with tf.Graph().as_default():
            dynemb.clear_tables()
            ids, out = build(order)
            with tf.compat.v1.Session() as s:
                s.run(out.pop("train"), {ids: [1]})
                got = s.run(out, {ids: q})
            np.testing.assert_array_equal(got["valued"], [[0.5, 0.5], [7, 8]], err_msg=str(order))
            np.testing.assert_array_equal(got["plain"], [[0.5, 0.5], [0, 0]], err_msg=str(order))
    g1 = tf.Graph()
    with g1.as_default():
        dynemb.clear_tables()
        ids1, out1 = build(("valued",))
    with tf.Graph().as_default():  # the same table, another graph and other numbers
        ids2, out2 = build(("plain", "valued"), value=(1.0, 2.0))
        with tf.compat.v1.Session() as s:
            got2 = s.run(out2, {ids2: q})
    with g1.as_default(), tf.compat.v1.Session() as s:
        got1 = s.run(out1, {ids1: q})
    np.testing.assert_array_equal(got1["valued"], [[7, 8], [7, 8]])
    np.testing.assert_array_equal(got2["valued"], [[1, 2], [1, 2]])
    np.testing.assert_array_equal(got2["plain"], [[0, 0], [0, 0]])


def test_own_defaults_cost_one_lookup_and_export_in_any_order(tmp_path):
    # A lookup that says which ids have a row does it in its own pass (no
    # second probe of the table), and the export serves it: here an eval
    # lookup with numbers is built first, so the train lookup without a
    # value (zeros) is the one with a default of its own; an explicit zero
    # value keeps reading zeros when a later lookup brings other numbers.
    dynemb.init()
    t = dynemb.create_table(tf.int64, 2, "order", tf.compat.v1.constant_initializer(0.5))
    pin = dynemb.create_table(tf.int64, 2, "pin", tf.compat.v1.constant_initializer(0.5))
    ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
    valued = dynemb.sparse_lookup(t, ids, is_train=False, serving_default_value=[7.0, 8.0])
    train = dynemb.sparse_lookup(t, ids, access_and_evict_config={"access_threshold": 2})
    zeros = dynemb.sparse_lookup(pin, ids, is_train=False, serving_default_value=0.0)
    dynemb.sparse_lookup(pin, ids, is_train=False, serving_default_value=[7.0, 8.0])
    pin_train = dynemb.sparse_lookup(pin, ids)
    graph = tf.compat.v1.get_default_graph()
    assert not [op for op in graph.get_operations() if op.type == "DynembPrepare"]
    q = np.array([1, 5], np.int64)
    with tf.compat.v1.Session() as s:
        first = s.run(train, {ids: [1, 1, 3]})   # 1 admitted at its 2nd sighting
        s.run(pin_train, {ids: [1]})
        got = s.run({"zeros": zeros, "valued": valued}, {ids: q})
        dynemb.export_saved_model(s, str(tmp_path / "m"), {"ids": ids}, {"train": train})
    np.testing.assert_array_equal(first, [[0, 0], [0.5, 0.5], [0, 0]])
    np.testing.assert_array_equal(got["zeros"], [[0.5, 0.5], [0, 0]])
    np.testing.assert_array_equal(got["valued"], [[0.5, 0.5], [7, 8]])
    with tf.Graph().as_default() as g, tf.compat.v1.Session() as s:
        mg = tf.compat.v1.saved_model.loader.load(s, ["serve"], str(tmp_path / "m"))
        assert not [n.op for n in g.as_graph_def().node if n.op.startswith("Dynemb")]
        sig = mg.signature_def["serving_default"]
        served = s.run(sig.outputs["train"].name, {sig.inputs["ids"].name: q})
    np.testing.assert_array_equal(served, [[0.5, 0.5], [0, 0]])
