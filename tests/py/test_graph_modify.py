"""Automatic graph modification: tracing ids to the iterator, rebuilding the
input pipeline, and the three input modes (plain / FeatureSpec / modify_graph)
giving the same losses and tables."""
import os
import time

import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb import _lib
from dynemb.core.asc.feature_spec import FeatureSpec, lookup_ids
from dynemb.core.asc.helper import get_asc_insert_func
from dynemb.core.asc.manager import start_asc_pipeline
from dynemb.graph.modifier import (GraphModificationError, GraphModifierHook,
                                   get_initializer, modify_graph_and_start_emb_cache)
from dynemb.graph.pipeline import extend_iterator
from dynemb.graph.trace import TraceError, replay, trace_to_iterator
from dynemb.optimizers import adagrad, ftrl, gradient_descent
from estimator_models import cmp_model_fn
from table_export import export_sorted as _export

def fs_lookup(table, spec, batch, **kw):
    """sparse_lookup(table, FeatureSpec, batch=...), through the documented
    resolution function when sparse_lookup itself lacks the FeatureSpec hook."""
    try:
        return dynemb.sparse_lookup(table, spec, batch=batch, **kw)
    except NotImplementedError:
        return dynemb.sparse_lookup(table, lookup_ids(spec, batch, table), batch=batch, **kw)


# --------------------------------------------------------------------------
# Tracing and pipeline rebuilding (no engine involved)
# --------------------------------------------------------------------------

def _dict_iterator(n=12, batch=4, one_shot=False):
    rng = np.random.RandomState(0)
    data = {"a": rng.randint(0, 1000, size=[n, 3]).astype(np.int64),
            "b": rng.randint(0, 50, size=[n]).astype(np.int32)}
    ds = tf.data.Dataset.from_tensor_slices(data).batch(batch)
    if one_shot:
        return data, None, tf.compat.v1.data.make_one_shot_iterator(ds)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    return data, it, it


def test_trace_and_replay_through_preprocessing():
    data, it, _ = _dict_iterator()
    b = it.get_next()
    col = tf.strided_slice(b["a"], [0, 1], [0, 2], end_mask=1)        # a[:, 1:2]
    ids = tf.reshape(tf.cast(b["b"], tf.int64), [-1, 1]) * 1000 + col   # arithmetic
    ids = tf.math.floormod(tf.concat([ids, ids + 7], axis=1), 100003)
    ids = tf.strings.to_hash_bucket_fast(tf.strings.as_string(ids), 1 << 40)
    trace = trace_to_iterator(ids, "ids")
    assert trace.get_next is b["a"].op
    types = {op.type for op in trace.ops}
    assert {"Cast", "Reshape", "StridedSlice", "ConcatV2", "FloorMod",
            "StringToHashBucketFast"} <= types

    # Replay inside a dataset function over the same data: same values.
    spec = tuple(tf.TensorSpec(t.shape, t.dtype) for t in trace.get_next.outputs)
    ds2 = tf.data.Dataset.from_tensor_slices((data["a"], data["b"])).batch(4)
    assert tuple(s.dtype for s in spec) == (tf.int64, tf.int32)
    replayed = tf.compat.v1.data.make_one_shot_iterator(
        ds2.map(lambda a, bb: replay(trace, [a, bb]))).get_next()
    with tf.compat.v1.Session() as s:
        s.run(it.initializer)
        for _ in range(3):
            want, got = s.run([ids, replayed])
            np.testing.assert_array_equal(got, want)


def test_trace_errors_name_the_problem():
    _, it, _ = _dict_iterator()
    b = it.get_next()
    ph = tf.compat.v1.placeholder(tf.int64, [None])
    with pytest.raises(TraceError, match="Placeholder op"):
        trace_to_iterator(ph + 1, "ids of lookup 'x'")
    v = tf.Variable(3, dtype=tf.int64)
    with pytest.raises(TraceError, match="stateful"):
        trace_to_iterator(b["a"] + v, "ids")
    with pytest.raises(TraceError, match="only constants"):
        trace_to_iterator(tf.constant([1, 2], tf.int64) * 2, "ids")
    _, it2, _ = _dict_iterator()
    with pytest.raises(TraceError, match="several iterators"):
        trace_to_iterator(b["a"] + it2.get_next()["a"], "ids")


@pytest.mark.parametrize("one_shot", [False, True])
def test_extend_iterator_rewires_consumers_and_chains_initializer(one_shot):
    data, it, iterator = _dict_iterator(one_shot=one_shot)
    b = iterator.get_next()
    total = tf.reduce_sum(b["a"], axis=1) + tf.cast(b["b"], tf.int64)  # a user op

    def extra(components):
        a, bb = components
        return [tf.reduce_sum(a, axis=1) * 10, tf.cast(bb, tf.int64) - 1]

    ext = extend_iterator(b["a"].op, extra, prefetch=2)
    assert ext.one_shot == one_shot
    assert total.op.inputs[0].op.inputs[0].op is ext.new_get_next
    with tf.compat.v1.Session() as s:
        if not one_shot:
            s.run(it.initializer)  # the old initializer starts the new pipeline too
        for i in range(3):
            t, e0, e1 = s.run([total, ext.extras[0], ext.extras[1]])
            rows = slice(4 * i, 4 * i + 4)
            np.testing.assert_array_equal(t, data["a"][rows].sum(1) + data["b"][rows])
            np.testing.assert_array_equal(e0, data["a"][rows].sum(1) * 10)
            np.testing.assert_array_equal(e1, data["b"][rows] - 1)
        with pytest.raises(tf.errors.OutOfRangeError):
            s.run(total)


# --------------------------------------------------------------------------
# Errors of modify_graph_and_start_emb_cache
# --------------------------------------------------------------------------

def _table(name, dim=2, opt=None, init=0.5):
    opt = opt or gradient_descent.create_hash_optimizer(learning_rate=0.1)
    return dynemb.create_table(tf.int64, dim, name, tf.compat.v1.constant_initializer(init),
                               optimizer_list=[opt]), opt


def test_untraceable_ids_error_names_lookup_and_table():
    t, _ = _table("users")
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    dynemb.sparse_lookup(t, ids, modify_graph=True, name="user_lookup")
    with pytest.raises(GraphModificationError) as e:
        modify_graph_and_start_emb_cache()
    msg = str(e.value)
    assert "users" in msg and "user_lookup" in msg and "Placeholder" in msg
    assert "tf.data iterator" in msg


def test_non_default_graph_error():
    g = tf.Graph()
    with g.as_default():
        t, _ = _table("users")
        _, it, _ = _dict_iterator()
        dynemb.sparse_lookup(t, it.get_next()["a"], modify_graph=True)
    with pytest.raises(GraphModificationError, match="not the default graph"):
        modify_graph_and_start_emb_cache()
    with pytest.raises(GraphModificationError, match="default graph"):
        modify_graph_and_start_emb_cache(full_graph=g)


def test_get_initializer_before_modification_is_an_error():
    t, _ = _table("users")
    _, it, _ = _dict_iterator()
    dynemb.sparse_lookup(t, it.get_next()["a"], modify_graph=True)
    with pytest.raises(GraphModificationError, match="modify_graph_and_start_emb_cache"):
        get_initializer(True)
    assert get_initializer(False).type == "NoOp"  # no eval lookups: nothing to start


# --------------------------------------------------------------------------
# With the engine: three input modes, admission ahead of the step
# --------------------------------------------------------------------------

N, BATCH = 48, 6


def _data():
    rng = np.random.RandomState(7)
    return {"user": rng.randint(0, 40, size=[N, 2]).astype(np.int64),
            "item": rng.randint(0, 9, size=[N]).astype(np.int32),
            "label": rng.randint(0, 2, size=[N]).astype(np.float32)}


def _apply_modes():
    """table -> how its DynembApply op filters: "tickets", "keys" or "none"."""
    out = {}
    for op in tf.compat.v1.get_default_graph().get_operations():
        if op.type == "DynembApply":
            out[op.get_attr("table_name").decode()] = (
                "tickets" if op.get_attr("use_tickets") else
                "keys" if op.get_attr("use_trainable") else "none")
    return out


def _run_mode(mode, one_shot=False, steps=8, reorder_users=False, applies=None):
    """Trains a small model for `steps` steps; returns (losses, tables).
    reorder_users: the users gradient reaches its apply op reversed (an apply
    whose keys are not a concatenation of the lookups' ids). `applies`: a dict
    that gets _apply_modes() once the graph is ready.

    The two lookups of table "items" see disjoint ids (item, user[:, 0]*7+100,
    admitted at different positions, with different gradients): in
    plain mode TensorFlow may run them in either order, so ids shared between
    them would be counted for admission in scheduling order."""
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    dynemb.init(use_dynamic_expansion=True)
    data = _data()
    ds = tf.data.Dataset.from_tensor_slices(data).batch(BATCH)
    if mode == "fs":
        ds = ds.map(lambda d: dict(d, item_x=d["user"][:, 0] * 7 + 100))
        specs = [FeatureSpec("user", table_name="users", access_threshold=3),
                 FeatureSpec("item", table_name="items", access_threshold=2),
                 FeatureSpec("item_x", table_name="items", access_threshold=2)]
        ds = ds.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True))
    if one_shot:
        it = None
        b = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    else:
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        b = it.get_next()
    u_opt = ftrl.create_hash_optimizer(learning_rate=0.3)
    i_opt = adagrad.create_hash_optimizer(learning_rate=0.2)
    users = dynemb.create_table(tf.int64, 3, "users",
                                tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=1),
                                optimizer_list=[u_opt])
    items = dynemb.create_table(tf.int64, 2, "items",
                                tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=2),
                                optimizer_list=[i_opt])
    modify = mode == "modify"
    if mode == "fs":
        eu = fs_lookup(users, specs[0], b)
        ei = fs_lookup(items, specs[1], b)
        ex = fs_lookup(items, specs[2], b)
    else:
        eu = dynemb.sparse_lookup(users, tf.reshape(b["user"], [-1, 2]), modify_graph=modify,
                                  access_and_evict_config={"access_threshold": 3})
        ei = dynemb.sparse_lookup(items, tf.cast(b["item"], tf.int64), modify_graph=modify,
                                  access_and_evict_config={"access_threshold": 2})
        ex = dynemb.sparse_lookup(items, b["user"][:, 0] * 7 + 100,
                                  modify_graph=modify,
                                  access_and_evict_config={"access_threshold": 2})
    w = tf.compat.v1.get_variable("w", [2], initializer=tf.compat.v1.constant_initializer(0.3))
    logits = (tf.reduce_sum(eu, axis=[1, 2]) + tf.reduce_sum((ei + 2.0 * ex) * w, axis=1))
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=b["label"],
                                                                  logits=logits))
    dense, sparse = dynemb.get_dense_and_sparse_variable()
    grads = tf.gradients(loss, sparse)
    if reorder_users:
        grads = [tf.IndexedSlices(tf.reverse(g.values, [0]), tf.reverse(g.indices, [0]),
                                  g.dense_shape) if v.name == users.variable.name else g
                 for g, v in zip(grads, sparse)]
    by_table = {users.variable.name: u_opt, items.variable.name: i_opt}
    train = tf.group(
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense),
        *[by_table[v.name].apply_gradients([(g, v)]) for g, v in zip(grads, sparse)])
    if mode == "modify":
        modify_graph_and_start_emb_cache(prefetch=4)
        init_op = get_initializer(True)
    else:
        if mode == "fs":
            start_asc_pipeline()
        init_op = it.initializer if it is not None else tf.no_op()
    if applies is not None:
        applies.update(_apply_modes())
    losses = []
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        s.run(init_op)
        if mode != "plain":  # let the pipeline prepare every batch before step 1
            _wait_stable(lambda: users.stats()["lookups"] + items.stats()["lookups"])
        for _ in range(steps):
            losses.append(s.run([loss, train])[0])
    return np.array(losses), {n: _export(n) for n in ("users", "items")}


def _wait_stable(counter, timeout=10.0):
    last, t0 = -1, time.time()
    while time.time() - t0 < timeout:
        now = counter()
        if now == last:
            return
        last = now
        time.sleep(0.2)


@pytest.mark.parametrize("one_shot", [False, True])
def test_three_input_modes_give_the_same_numbers(one_shot):
    ref_losses, ref_tables = _run_mode("plain", one_shot=one_shot)
    for mode in ("modify", "fs"):
        losses, tables = _run_mode(mode, one_shot=one_shot)
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-6, err_msg=mode)
        for name in ref_tables:
            np.testing.assert_array_equal(tables[name][0], ref_tables[name][0], err_msg=mode)
            np.testing.assert_allclose(tables[name][1], ref_tables[name][1], rtol=1e-6,
                                       atol=1e-7, err_msg=f"{mode} {name}")
    # Admission mattered: some ids were never admitted, some crossed the
    # threshold inside a batch.
    assert 0 < len(ref_tables["users"][0]) < len(np.unique(_data()["user"][:8 * BATCH]))


def test_apply_takes_tickets_or_falls_back_to_trainable_keys():
    """A table whose one apply op takes its lookups' gradients (items: two
    lookups, TensorFlow concatenates their ids) applies through the admission tickets;
    one whose gradient is reordered on the way gets the trainable-keys filter.
    Both train exactly as plain lookups do."""
    ref_losses, ref_tables = _run_mode("plain", reorder_users=True)
    applies = {}
    for mode in ("modify", "fs"):
        applies.clear()
        losses, tables = _run_mode(mode, reorder_users=True, applies=applies)
        assert applies == {"users": "keys", "items": "tickets"}, mode
        np.testing.assert_allclose(losses, ref_losses, rtol=1e-6, err_msg=mode)
        for name in ref_tables:
            np.testing.assert_array_equal(tables[name][0], ref_tables[name][0], err_msg=mode)
            np.testing.assert_allclose(tables[name][1], ref_tables[name][1], rtol=1e-6,
                                       atol=1e-7, err_msg=f"{mode} {name}")
    for mode in ("modify", "fs"):
        applies.clear()
        _run_mode(mode, applies=applies, steps=1)
        assert applies == {"users": "tickets", "items": "tickets"}, mode


def test_admission_is_decided_per_batch_while_the_pipeline_runs_ahead():
    # Hand-computed: threshold 2, constant rows 0.5, SGD lr 0.1, loss = sum(emb).
    ids_np = np.array([[1, 2], [1, 3], [2, 2], [4, 1], [3, 3], [5, 5]], np.int64)
    ds = tf.data.Dataset.from_tensor_slices({"f": ids_np}).batch(2)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    t, opt = _table("t", init=0.5)
    ids = tf.cast(it.get_next()["f"], tf.int32) + 10  # [2, 2]
    emb = dynemb.sparse_lookup(t, ids, modify_graph=True,
                               access_and_evict_config={"access_threshold": 2})
    loss = tf.reduce_sum(emb)
    _, sv = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sv), sv))
    modify_graph_and_start_emb_cache(prefetch=3)
    with tf.compat.v1.Session() as s:
        s.run(get_initializer(True))
        first = s.run([emb, train])[0].reshape([-1, 2])
        _wait_stable(lambda: t.stats()["lookups"])
        # Every batch has been prepared: ids 12..15 (later batches) have rows...
        assert t.size() == 4
        rest = [s.run([loss, train])[0] for _ in range(2)]
    # ...but each step saw the admission state of its own batch.
    # Batch 1 [11, 12, 11, 13]: 11 admitted at its 2nd occurrence (the engine
    # decides which of the two positions counts second), 12 and 13 not yet.
    np.testing.assert_array_equal(np.sort(first[[0, 2], 0]), [0, .5])
    np.testing.assert_array_equal(first[[1, 3]], np.zeros([2, 2]))
    # Batch 2 [12, 12, 14, 11]: 12 admitted (2nd sighting); 11 = 0.5 - 0.1 * 2.
    # Batch 3 [13, 13, 15, 15]: 13 and 15 admitted at their 2nd occurrence.
    np.testing.assert_allclose(rest, [(0.5 + 0.5 + 0 + 0.3) * 2, (0.5 * 3) * 2], rtol=1e-6)
    keys, values = _export("t")
    np.testing.assert_array_equal(keys, [11, 12, 13, 15])
    # 14 was never admitted. 12, 13 and 15 were trained once, with the gradients
    # of both occurrences of their batch (2 each; also the occurrence that read
    # the default value, as in a plain step); 11 twice (2, then 1).
    np.testing.assert_allclose(values, [[.2, .2], [.3, .3], [.3, .3], [.3, .3]], rtol=1e-6)


def test_engine_sees_preprocessed_ids_and_eval_reads_without_inserting(tmp_path):
    data, it, _ = _dict_iterator()
    ev_ds = tf.data.Dataset.from_tensor_slices({"a": data["a"][:4] * 0 + 1000}).batch(4)
    ev_it = tf.compat.v1.data.make_initializable_iterator(ev_ds)
    t, opt = _table("t", init=0.25)
    b = it.get_next()
    ids = tf.math.floormod(b["a"][:, 0] * 3 + tf.cast(b["b"], tf.int64), 97)
    emb = dynemb.sparse_lookup(t, ids, modify_graph=True)
    loss = tf.reduce_sum(emb)
    _, sv = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sv), sv))
    ev_emb = dynemb.sparse_lookup(t, ev_it.get_next()["a"][:, 0], is_train=False,
                                  modify_graph=True)
    modify_graph_and_start_emb_cache(dump_graph=str(tmp_path))
    assert os.path.getsize(tmp_path / "before_modify_graph.pbtxt") > 0
    assert "DynembPrepare" in (tmp_path / "after_modify_graph.pbtxt").read_text()
    with tf.compat.v1.Session() as s:
        s.run(get_initializer(True))
        for _ in range(3):
            s.run(train)
        s.run(get_initializer(False))
        ev = s.run(ev_emb)
    want = np.unique((data["a"][:, 0] * 3 + data["b"]) % 97)
    np.testing.assert_array_equal(_export("t")[0], want)
    np.testing.assert_array_equal(ev, np.zeros([4, 2], np.float32))  # id 1000: unknown
    assert t.size() == len(want)  # eval inserted nothing


def test_graph_modifier_hook_with_monitored_session():
    data, it, _ = _dict_iterator()
    t, opt = _table("t")
    gs = tf.compat.v1.train.get_or_create_global_step()
    emb = dynemb.sparse_lookup(t, it.get_next()["b"], modify_graph=True)
    loss = tf.reduce_sum(emb)
    _, sv = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sv), sv), global_step=gs)
    scaffold = tf.compat.v1.train.Scaffold(local_init_op=it.initializer)
    with tf.compat.v1.train.MonitoredSession(
            session_creator=tf.compat.v1.train.ChiefSessionCreator(scaffold=scaffold),
            hooks=[GraphModifierHook()]) as s:
        while not s.should_stop():
            s.run(train)
    assert t.size() == len(np.unique(data["b"]))


def _est_input_fn_ids():
    return (np.random.RandomState(0).randint(0, 150, size=(64, 3)) * 7).astype(np.int64)


def _est_input_fn():
    ids = _est_input_fn_ids()
    y = (ids[:, :1] % 3 == 0).astype(np.float32)
    return tf.compat.v1.data.Dataset.from_tensor_slices(({"ids": ids}, y)).batch(16)


def test_estimator_train_evaluate_predict_with_graph_modifier_hook(tmp_path):
    results = {}
    for modify in (False, True):
        name = "est_mod" if modify else "est_plain"
        est = tf.estimator.Estimator(cmp_model_fn(modify, {"access_threshold": 2}, name=name), str(tmp_path / name))
        hooks = [GraphModifierHook()] if modify else []
        est.train(_est_input_fn, hooks=hooks)
        loss = est.evaluate(_est_input_fn, hooks=hooks)["loss"]
        preds = [p["logits"] for p in est.predict(_est_input_fn, hooks=hooks)]
        results[modify] = (loss, np.array(preds), _export(name))
    (l0, p0, t0), (l1, p1, t1) = results[False], results[True]
    assert l1 == pytest.approx(l0, rel=1e-6)
    np.testing.assert_allclose(p1, p0, rtol=1e-6)
    np.testing.assert_array_equal(t1[0], t0[0])
    np.testing.assert_allclose(t1[1], t0[1], rtol=1e-6)
    assert 0 < len(t0[0]) < len(np.unique(_est_input_fn_ids()))  # admission left ids out


def test_guarded_lookup_fails_clearly_until_modified():
    # sparse_lookup(..., modify_graph=True) guards its op with guard_lookup;
    # the modification removes the guard (train and eval lookups alike).
    from dynemb.core import embedding
    from dynemb.graph.rewrite import guard_lookup
    data, it, _ = _dict_iterator()
    t, opt = _table("t")
    b = it.get_next()
    emb = dynemb.sparse_lookup(t, b["b"], modify_graph=True)
    ev = dynemb.sparse_lookup(t, b["b"], modify_graph=True, is_train=False)
    for r in embedding.graph_state().lookups:
        if not any("unmodified_guard" in c.name for c in r["op"].control_inputs):
            guard_lookup(r["op"], "t", "call modify_graph_and_start_emb_cache()")
    with tf.compat.v1.Session() as s:
        s.run(it.initializer)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="modify_graph_and_start_emb_cache"):
            s.run(emb)
    modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as s:
        s.run(get_initializer(True))
        v, e = s.run([emb, ev])
    assert v.shape == (4, 2) and e.shape == (4, 2)


def test_reinitializable_iterator_with_two_datasets():
    # mxRec's sess.run migration guide: Iterator.from_structure + make_initializer.
    a = tf.data.Dataset.from_tensor_slices({"f": np.arange(8, dtype=np.int64)}).batch(4)
    b = tf.data.Dataset.from_tensor_slices({"f": np.arange(100, 104, dtype=np.int64)}).batch(4)
    it = tf.compat.v1.data.Iterator.from_structure(tf.compat.v1.data.get_output_types(a),
                                                   tf.compat.v1.data.get_output_shapes(a))
    init_a, init_b = it.make_initializer(a), it.make_initializer(b)
    t, opt = _table("t")
    emb = dynemb.sparse_lookup(t, it.get_next()["f"] * 2, modify_graph=True)
    loss = tf.reduce_sum(emb)
    _, sv = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sv), sv))
    modify_graph_and_start_emb_cache()
    with pytest.raises(GraphModificationError, match="several datasets"):
        get_initializer(True)
    with tf.compat.v1.Session() as s:
        s.run(init_b)
        s.run(train)
        s.run(init_a)
        s.run(train)  # (one op fetched twice in one run() runs once: two calls)
        s.run(train)
    np.testing.assert_array_equal(_export("t")[0], list(range(0, 16, 2)) + [200, 202, 204, 206])


def test_static_batch_shapes_are_rewritten():
    # drop_remainder=True gives the ids a static shape: the rewrite must still
    # be able to plug the pipeline's flags into the lookup and apply ops.
    ids_np = np.arange(12, dtype=np.int64).reshape([6, 2]) % 5
    ds = tf.data.Dataset.from_tensor_slices({"f": ids_np}).batch(2, drop_remainder=True)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    ids = it.get_next()["f"]
    assert ids.shape.as_list() == [2, 2]
    t, opt = _table("static", init=0.5)
    emb = dynemb.sparse_lookup(t, ids, modify_graph=True,
                               access_and_evict_config={"access_threshold": 2})
    loss = tf.reduce_sum(emb)
    _, sv = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sv), sv))
    modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as s:
        s.run(get_initializer(True))
        losses = [s.run([loss, train])[0] for _ in range(3)]
    # batch 1 [0 1 2 3]: nothing admitted; batch 2 [4 0 1 2]: 0 1 2 admitted
    # (second sighting) and read 0.5; batch 3 [3 4 0 1]: 3 4 admitted.
    np.testing.assert_allclose(losses[:2], [0.0, 3 * 0.5 * 2], rtol=1e-6)
