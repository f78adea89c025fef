"""Slicing: mxRec's LookupSubgraphSlicerHook, OrphanLookupKeySlicerHook and
ACGPushOpsToDatasetHook move parts of the step into the input pipeline
(dynemb.graph.slicing). Each run is compared with the same model trained
without the hook: the same losses and table rows, and the moved ops no
longer run in the step (the step's own run metadata lists the ops it ran)."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.graph import LookupSubgraphSlicerHook, OrphanLookupKeySlicerHook
from dynemb.graph.acg_push_ops import ACGPushOpsToDatasetHook
from dynemb.graph.modifier import (GraphModificationError, GraphModifierHook,
                                   get_initializer, modify_graph_and_start_emb_cache)
from dynemb.graph.slicers import LookupSubgraphSlicer, SlicingError
from dynemb.optimizers import adagrad
from table_export import export_sorted

N, BATCH, STEPS = 40, 5, 8


def _data():
    rng = np.random.RandomState(3)
    user = rng.randint(0, 30, size=[N, 2])
    return {"user": np.char.mod("%d", user).astype(object),     # ids as strings
            "item": rng.randint(0, 12, size=[N]).astype(np.int64),
            "label": np.char.mod("%d", rng.randint(0, 2, size=[N])).astype(object)}


def _model(hooks=(), orphan=False, modify=True, one_shot=False):
    """Trains STEPS steps; returns (losses, tables, ops the step ran)."""
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    dynemb.init()
    ds = tf.data.Dataset.from_tensor_slices(_data()).batch(BATCH)
    if one_shot:
        it, b = None, tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    else:
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        b = it.get_next()
    opt = adagrad.create_hash_optimizer(learning_rate=0.2)
    users = dynemb.create_table(tf.int64, 3, "users",
                                tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=1))
    items = dynemb.create_table(tf.int64, 3, "items",
                                tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=2))
    uid = tf.strings.to_number(b["user"], out_type=tf.int64, name="parse_user") * 3 + 1
    eu = dynemb.sparse_lookup(users, uid, modify_graph=modify,
                              access_and_evict_config={"access_threshold": 2})
    if orphan:  # ids computed from constants only: the same every step
        item_ids = tf.tile(tf.constant([1, 5, 9], tf.int64), [2])[:BATCH] + 100
    else:
        item_ids = b["item"]
    ei = dynemb.sparse_lookup(items, item_ids, modify_graph=modify)
    label = tf.strings.to_number(b["label"], name="parse_label")    # not a lookup's
    logits = tf.reduce_sum(eu, axis=[1, 2]) + tf.reduce_sum(ei, axis=1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label,
                                                                  logits=logits))
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    for h in hooks:
        h.begin()
    if modify:
        modify_graph_and_start_emb_cache()
        init_op = get_initializer(True)
    else:
        init_op = it.initializer if it is not None else tf.no_op()
    losses, ran = [], set()
    opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        s.run(init_op)
        for _ in range(STEPS):
            md = tf.compat.v1.RunMetadata()
            losses.append(s.run([loss, train], options=opts, run_metadata=md)[0])
            for dev in md.step_stats.dev_stats:
                ran.update(n.node_name for n in dev.node_stats)
    return np.array(losses), {t: export_sorted(t) for t in ("users", "items")}, ran


def _same(a, b):
    np.testing.assert_allclose(a[0], b[0], rtol=1e-6)
    for t in a[1]:
        np.testing.assert_array_equal(a[1][t][0], b[1][t][0], err_msg=t)
        np.testing.assert_allclose(a[1][t][1], b[1][t][1], rtol=1e-6, err_msg=t)


@pytest.mark.parametrize("one_shot", [False, True])
def test_lookup_slicer_moves_the_ids_parsing_out_of_the_step(one_shot):
    ref = _model(one_shot=one_shot)
    assert "parse_user" in ref[2] and "parse_label" in ref[2]
    got = _model([LookupSubgraphSlicerHook(op_types=["StringToNumber"])], one_shot=one_shot)
    _same(got, ref)
    assert "parse_user" not in got[2]      # now computed in the pipeline
    assert "parse_label" in got[2]         # not in a lookup's ids: stays
    assert len(ref[1]["users"][0]) > 0


def test_acg_push_hook_moves_every_string_parse():
    ref = _model()
    got = _model([ACGPushOpsToDatasetHook()])
    _same(got, ref)
    assert "parse_user" not in got[2] and "parse_label" not in got[2]


def test_orphan_keys_join_the_pipeline():
    with pytest.raises(GraphModificationError, match="only constants"):
        _model(orphan=True)
    ref = _model(orphan=True, modify=False)    # plain lookups compute in the step
    got = _model([OrphanLookupKeySlicerHook()], orphan=True)
    _same(got, ref)
    assert list(got[1]["items"][0]) == [101, 105, 109]


def test_slicers_in_the_estimator_hooks_list():
    def input_fn():
        return tf.data.Dataset.from_tensor_slices(_data()).batch(BATCH)

    def model_fn(features, labels, mode, params):
        users = dynemb.create_table(tf.int64, 3, "users",
                                    tf.compat.v1.constant_initializer(0.1))
        uid = tf.strings.to_number(features["user"], out_type=tf.int64, name="parse_user")
        eu = dynemb.sparse_lookup(users, uid, modify_graph=True)
        label = tf.strings.to_number(features["label"])
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
            labels=label, logits=tf.reduce_sum(eu, axis=[1, 2])))
        opt = adagrad.create_hash_optimizer(learning_rate=0.2)
        _, sparse = dynemb.get_dense_and_sparse_variable()
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.group(opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse)),
                         step.assign_add(1))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train)

    results = []
    for hooks in ([], [LookupSubgraphSlicerHook(["StringToNumber"])]):
        tf.compat.v1.reset_default_graph()
        dynemb.clear_tables()
        dynemb.init()
        est = tf.estimator.Estimator(model_fn)
        est.train(input_fn, hooks=list(hooks) + [GraphModifierHook()], steps=STEPS)
        results.append(export_sorted("users"))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    np.testing.assert_allclose(results[0][1], results[1][1], rtol=1e-6)


def test_slicing_errors():
    with pytest.raises(TypeError, match="op_types must be a list"):
        LookupSubgraphSlicerHook(op_types="StringToNumber")
    with pytest.raises(ValueError, match="op_types is empty"):
        LookupSubgraphSlicer([])
    with pytest.raises(TypeError, match="full_graph"):
        OrphanLookupKeySlicerHook(full_graph="graph")
    with pytest.raises(TypeError, match="dump_graph"):
        ACGPushOpsToDatasetHook(dump_graph=1)

    # After the modification: too late, and the message says where the hook goes.
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    dynemb.init()
    t = dynemb.create_table(tf.int64, 2, "t", tf.compat.v1.constant_initializer(0.0))
    ds = tf.data.Dataset.from_tensor_slices({"f": np.arange(8)}).batch(2)
    b = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    dynemb.sparse_lookup(t, b["f"], modify_graph=True)
    modify_graph_and_start_emb_cache()
    with pytest.raises(SlicingError, match="before GraphModifierHook"):
        LookupSubgraphSlicerHook(["Cast"]).begin()

    # Orphan ids fed at run time cannot be computed by a pipeline.
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    dynemb.init()
    t = dynemb.create_table(tf.int64, 2, "t", tf.compat.v1.constant_initializer(0.0))
    ph = tf.compat.v1.placeholder(tf.int64, [None], name="fed_ids")
    dynemb.sparse_lookup(t, ph, modify_graph=True, name="fed_lookup")
    with pytest.raises(SlicingError, match="fed_lookup.*Placeholder op 'fed_ids'"):
        OrphanLookupKeySlicerHook().begin()


def test_orphan_eval_lookup_without_eval_pipeline_reads_in_place():
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    dynemb.init()
    t = dynemb.create_table(tf.int64, 2, "t", tf.compat.v1.constant_initializer(0.5))
    emb = dynemb.sparse_lookup(t, tf.constant([3, 4], tf.int64), is_train=False,
                               modify_graph=True)
    OrphanLookupKeySlicerHook().begin()
    modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as s:   # runs (no guard error): unseen ids read zeros
        np.testing.assert_array_equal(s.run(emb), np.zeros([2, 2], np.float32))


def _fresh():
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    dynemb.init()


def test_shared_constants_stay_in_the_step():
    """A constant the moved ops share with the rest of the graph (a
    variable's initializer, the dataset's own map) keeps being computed in
    place: only the targets (the ids, the parsing ops' outputs) move."""
    _fresh()
    base = tf.constant([1, 5, 9], tf.int64, name="base")
    w = tf.Variable(tf.cast(base, tf.float32), name="w")
    ds = tf.data.Dataset.from_tensor_slices({"f": np.arange(16, dtype=np.int64)}).batch(3)
    b = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    t = dynemb.create_table(tf.int64, 2, "t", tf.compat.v1.constant_initializer(0.5))
    e_batch = dynemb.sparse_lookup(t, b["f"], modify_graph=True)
    e_orphan = dynemb.sparse_lookup(t, base + 100, modify_graph=True)
    OrphanLookupKeySlicerHook().begin()
    modify_graph_and_start_emb_cache()
    assert w.initializer.inputs[1].op.inputs[0].op.name == "base"
    steps = 0
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())   # pulls no batch
        while True:
            try:
                s.run([e_batch, e_orphan])
                steps += 1
            except tf.errors.OutOfRangeError:
                break
    assert steps == 6                                          # every batch trained

    # a constant the dataset's map captures, next to a pushed op
    _fresh()
    scale = tf.constant(10, tf.int64, name="scale")
    ds = tf.data.Dataset.from_tensor_slices({"s": np.array(["1", "2", "3", "4"])})
    ds = ds.map(lambda d: dict(d, n=tf.strings.length(d["s"]) * 0 +
                               tf.cast(scale, tf.int32))).batch(2)
    b = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    parsed = tf.strings.to_number(b["s"], out_type=tf.int64) + scale
    ACGPushOpsToDatasetHook().begin()
    with tf.compat.v1.Session() as s:
        assert s.run(parsed).tolist() == [11, 12]


def test_two_pipelines_sharing_a_constant():
    _fresh()
    sep = tf.constant(",", name="sep")
    got = []
    for name, rows in (("train", ["1,2", "3,4"]), ("eval", ["5,6", "7,8"])):
        ds = tf.data.Dataset.from_tensor_slices(np.array(rows)).batch(2)
        b = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        got.append(tf.strings.to_number(tf.strings.split(b, sep).values,
                                        out_type=tf.int64, name=name + "_parse"))
    report = __import__("dynemb.graph.slicing", fromlist=["x"]).push_ops_to_dataset()
    assert len(report.iterators) == 2
    with tf.compat.v1.Session() as s:
        assert [v.tolist() for v in s.run(got)] == [[1, 2, 3, 4], [5, 6, 7, 8]]


def test_a_train_orphan_never_joins_an_eval_pipeline():
    _fresh()
    t = dynemb.create_table(tf.int64, 2, "t", tf.compat.v1.constant_initializer(0.5))
    ds = tf.data.Dataset.from_tensor_slices({"f": np.arange(8, dtype=np.int64)}).batch(2)
    ev = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    dynemb.sparse_lookup(t, ev["f"], is_train=False, modify_graph=True)
    dynemb.sparse_lookup(t, tf.constant([1, 2], tf.int64), modify_graph=True,
                         name="train_orphan")
    with pytest.raises(SlicingError, match="train_orphan.*no iterator"):
        OrphanLookupKeySlicerHook().begin()
