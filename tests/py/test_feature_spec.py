"""FeatureSpec mode: FeatureSpec validation, the insert function's reserved
components, start_asc_pipeline and its errors. (FeatureSpec training giving
the same numbers as plain and modify_graph lookups is in test_graph_modify.)"""
import ctypes

import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb import _lib
from dynemb.core import embedding
from dynemb.core.asc.feature_spec import FeatureSpec, admitted_key, tickets_key
from dynemb.core.asc.helper import get_asc_insert_func
from dynemb.core.asc.manager import start_asc_pipeline
from dynemb.graph.rewrite import GraphModificationError
from dynemb.optimizers import gradient_descent
from table_export import export_sorted
from test_graph_modify import _export, fs_lookup


def _table(name="t", dim=2):
    return dynemb.create_table(tf.int64, dim, name, tf.compat.v1.constant_initializer(0.5))


def _rows(name):
    """{key: row} of table `name` as the engine holds it."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        out = s.run(dynemb._lib.ops.dynemb_export(table_name=name))
    return {int(k): v[:2] for k, v in zip(out[1], out[2])}


def test_feature_spec_validation():
    s = FeatureSpec("user", table_name="users", access_threshold=3, eviction_threshold=100)
    assert s.index_key == "user" and not s.is_timestamp
    assert s.access_and_evict_config == {"access_threshold": 3, "eviction_threshold": 100,
                                         "faae_coefficient": 1}
    assert FeatureSpec("u", table_name="t").access_and_evict_config is None
    assert FeatureSpec("u", table_name="t", index_key="uid").index_key == "uid"
    assert FeatureSpec("user").table_name == "user"   # mxRec: the feature's name
    assert FeatureSpec("u", index_key=0).index_key == 0
    for bad in (-1, 256, "", True, 1.0):
        with pytest.raises(ValueError, match="index_key must be"):
            FeatureSpec("u", index_key=bad)
    assert FeatureSpec("user", table_name="t", faae_coefficient=4).faae_coefficient == 4
    for bad in (0, 2**31, 1.5, True):
        with pytest.raises(ValueError, match="faae_coefficient must be an int"):
            FeatureSpec("user", table_name="t", faae_coefficient=bad)
    with pytest.raises(ValueError, match="access_threshold must be an int"):
        FeatureSpec("user", table_name="t", access_threshold=-2)
    off = FeatureSpec("user", table_name="t", access_threshold=-1, eviction_threshold=-1)
    assert off.access_and_evict_config is None  # mxRec's -1: off
    with pytest.raises(ValueError, match="timestamp feature has no table"):
        FeatureSpec("ts", is_timestamp=True, eviction_threshold=5)
    assert FeatureSpec("ts", is_timestamp=True).table_name is None


def test_insert_func_argument_errors():
    with pytest.raises(TypeError, match="FeatureSpec objects"):
        get_asc_insert_func(tgt_key_specs=["user"])
    # (a repeated name is no error: test_feature_specs_of_one_name_get_names_of_their_own)
    two = [FeatureSpec("u", table_name="a"), FeatureSpec("u", table_name="b")]
    get_asc_insert_func(tgt_key_specs=two)
    assert [s.name for s in two] == ["u", "u_1"]
    with pytest.raises(ValueError, match="either tgt_key_specs .* or args_index_list.*got neither"):
        get_asc_insert_func()
    with pytest.raises(ValueError, match="got both"):
        get_asc_insert_func(two, [0], ["a"])
    get_asc_insert_func(None, [0], ["later"])  # (Estimator: tables come after input_fn)
    _table("pos")
    with pytest.raises(ValueError, match="one table per position"):
        get_asc_insert_func(args_index_list=[0, 1], table_names=["pos"])
    with pytest.raises(ValueError, match="ints >= 0"):
        get_asc_insert_func(args_index_list=[-1], table_names=["pos"])
    fn = get_asc_insert_func(args_index_list=[2], table_names=["pos"])
    pair = tf.data.Dataset.from_tensor_slices((np.arange(4), np.arange(4))).batch(2)
    with pytest.raises(ValueError, match="position 2 .* beyond the elements' 2 components"):
        pair.map(fn)
    floats = tf.data.Dataset.from_tensor_slices((np.zeros(4, np.float32),)).batch(2)
    with pytest.raises(TypeError, match="component 0 .* int32 or int64"):
        floats.map(get_asc_insert_func(args_index_list=[0], table_names=["pos"]))
    with pytest.raises(ValueError, match="ints >= 0"):
        get_asc_insert_func(args_index_list=[True], table_names=["pos"])
    # positions in the flattened element (tf.nest: dict values by sorted key,
    # nested tuples in order); the element comes back as it was
    nested = tf.data.Dataset.from_tensor_slices(
        ({"b": np.zeros(4, np.float32), "a": np.arange(4)}, (np.ones(4, np.float32),
                                                              np.arange(4)))).batch(2)
    out = nested.map(get_asc_insert_func(args_index_list=[np.int64(0), 3],
                                         table_names=["pos", "pos"], feature_counts=[1, 1]))
    assert out.element_spec == nested.element_spec
    with pytest.raises(TypeError, match="component 1 .* int32 or int64"):
        nested.map(get_asc_insert_func(args_index_list=[1], table_names="pos"))
    with pytest.raises(ValueError, match="feature_counts must have one count per position"):
        get_asc_insert_func(args_index_list=0, table_names="pos", feature_counts=[1, 2])
    ds = tf.data.Dataset.from_tensor_slices({"x": np.arange(4)}).batch(2)
    with pytest.raises(KeyError, match="'user'"):
        ds.map(get_asc_insert_func(tgt_key_specs=[FeatureSpec("user", table_name="t")],
                                   is_training=False))


def test_eval_insert_func_adds_components_without_touching_the_engine():
    _table("t")
    ids = np.array([[1, 2], [3, 1]], np.int64)
    ds = tf.data.Dataset.from_tensor_slices(({"user": ids}, np.ones(2, np.float32))).batch(2)
    ds = ds.map(get_asc_insert_func(tgt_key_specs=[FeatureSpec("user", table_name="t")],
                                    is_training=False))
    feats, label = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    assert tickets_key("user") not in feats
    with tf.compat.v1.Session() as s:
        adm, lab = s.run([feats[admitted_key("user")], label])
    np.testing.assert_array_equal(adm, np.ones([2, 2], bool))
    np.testing.assert_array_equal(lab, [1, 1])
    assert _lib.table_stats("t")["lookups"] == 0


def test_train_insert_func_sends_ids_ahead_with_thresholds_and_timestamps():
    t = _table("t")
    data = {"user": np.array([[5, 5, 6], [6, 7, 5]], np.int64),
            "ts": np.array([100, 130], np.int64)}
    specs = [FeatureSpec("user", table_name="t", access_threshold=2, eviction_threshold=50),
             FeatureSpec("ts", is_timestamp=True)]
    ds = tf.data.Dataset.from_tensor_slices(data).batch(1)
    it = tf.compat.v1.data.make_initializable_iterator(
        ds.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True)))
    b = it.get_next()
    emb = fs_lookup(t, specs[0], b)
    # The spec's thresholds reached the engine and EvictHook's settings.
    cfg = _lib.TableConfig()
    h = _lib.find_table("t")
    _lib.clib.dynemb_table_get_config(h, ctypes.byref(cfg))
    _lib.clib.dynemb_table_release(h)
    assert (cfg.access_threshold, cfg.eviction_threshold) == (2, 50)
    assert embedding.graph_state().evict_configs["t"]["eviction_threshold"] == 50
    assert tf.compat.v1.get_collection("ASCEND_TIMESTAMP") == [b["ts"]]  # data time
    start_asc_pipeline()
    with tf.compat.v1.Session() as s:
        s.run(it.initializer)
        a1, h1, e1 = s.run([b[admitted_key("user")], b[tickets_key("user")], emb])
        a2, h2 = s.run([b[admitted_key("user")], b[tickets_key("user")]])
    # Batch 1 [5, 5, 6]: 5 admitted at one of its two occurrences.
    assert sorted(a1[0].tolist()) == [False, False, True] and a1[0][2] == 0
    np.testing.assert_array_equal(h1 != -1, a1)  # tickets admit where admitted
    np.testing.assert_array_equal(np.sort(e1[0, :2, 0]), [0, .5])
    # Batch 2 [6, 7, 5]: 6 reaches 2, 7 is new, 5 has a row.
    np.testing.assert_array_equal(a2, [[True, False, True]])
    np.testing.assert_array_equal(h2 != -1, a2)
    assert h2[0, 2] == h1[a1][0] and h2[0, 0] != h2[0, 2]  # 5 kept its row; 6 got one
    # Rows were stamped with each batch's data time.
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        out = s.run(list(_lib.ops.dynemb_export(table_name="t")))
    stamps = dict(zip(out[1].tolist(), out[3].tolist()))
    assert stamps == {5: 130, 6: 130}
    np.testing.assert_array_equal(_export("t")[0], [5, 6])


def test_lookups_fail_clearly_until_the_pipeline_is_started():
    t = _table("t")
    ds = tf.data.Dataset.from_tensor_slices({"user": np.array([[1, 2]], np.int64)}).batch(1)
    spec = FeatureSpec("user", table_name="t")
    b = tf.compat.v1.data.make_one_shot_iterator(
        ds.map(get_asc_insert_func(tgt_key_specs=[spec], is_training=False))).get_next()
    emb = fs_lookup(t, spec, b, is_train=False)
    with tf.compat.v1.Session() as s:
        with pytest.raises(tf.errors.InvalidArgumentError, match="start_asc_pipeline"):
            s.run(emb)


def test_train_lookup_on_eval_pipeline_is_an_error():
    t = _table("t")
    ds = tf.data.Dataset.from_tensor_slices({"user": np.array([[1, 2]], np.int64)}).batch(1)
    spec = FeatureSpec("user", table_name="t")
    b = tf.compat.v1.data.make_one_shot_iterator(
        ds.map(get_asc_insert_func(tgt_key_specs=[spec], is_training=False))).get_next()
    fs_lookup(t, spec, b, is_train=True)
    with pytest.raises(GraphModificationError, match="is_training=False"):
        start_asc_pipeline()


def test_lookup_needs_the_batch_and_the_right_table():
    t = _table("t")
    _table("other")
    spec = FeatureSpec("user", table_name="t")
    with pytest.raises(ValueError, match="batch=iterator.get_next()"):
        fs_lookup(t, spec, None)
    ds = tf.data.Dataset.from_tensor_slices({"user": np.array([[1]], np.int64)}).batch(1)
    b = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    with pytest.raises(ValueError, match="get_asc_insert_func"):
        fs_lookup(t, spec, b)
    with pytest.raises(ValueError, match="feeds table 't'"):
        fs_lookup(embedding.graph_state().tables["other"], spec, b)


def test_feature_specs_of_one_name_get_names_of_their_own():
    # Several lookups of one feature: mxRec's scripts pass FeatureSpecs of the
    # same name; each gets a name of its own and still reads the feature.
    specs = [FeatureSpec("user", table_name="t"), FeatureSpec("user", table_name="t"),
             FeatureSpec("user", table_name="t")]
    get_asc_insert_func(tgt_key_specs=specs, is_training=False)
    assert [s.name for s in specs] == ["user", "user_1", "user_2"]
    assert {s.index_key for s in specs} == {"user"}
    with pytest.raises(ValueError, match="given twice"):
        get_asc_insert_func(tgt_key_specs=[specs[0], specs[0]], is_training=False)


def _train_tuple_or_dict(positional):
    """4 steps of FeatureSpec training from dict or tuple-of-tensor elements."""
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    dynemb.init()
    ids = np.array([[1, 2], [2, 3], [1, 4], [2, 2], [5, 1], [4, 4], [1, 3], [6, 2]], np.int64)
    y = np.arange(8, dtype=np.float32) % 2
    ds = tf.data.Dataset.from_tensor_slices((ids, y) if positional else {"u": ids, "y": y})
    spec = FeatureSpec("u", table_name="t", access_threshold=2,
                       **({"index_key": 0} if positional else {}))
    ds = ds.batch(2).map(get_asc_insert_func(tgt_key_specs=[spec], is_training=True))
    batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    t = dynemb.create_table(tf.int64, 2, "t", tf.compat.v1.constant_initializer(0.5))
    emb = dynemb.sparse_lookup(t, spec, batch=batch)
    label = batch[1] if positional else batch["y"]
    loss = tf.reduce_sum(tf.reduce_sum(emb, axis=[1, 2]) * (label + 1))
    opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    start_asc_pipeline()
    with tf.compat.v1.Session() as s:
        losses = [s.run([loss, train])[0] for _ in range(4)]
    return losses, export_sorted("t")


def test_feature_specs_by_tuple_position():
    """mxRec's int index_key: elements that are tuples of tensors train as the
    same features in a dict do."""
    ref_losses, ref = _train_tuple_or_dict(False)
    losses, got = _train_tuple_or_dict(True)
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    np.testing.assert_array_equal(got[0], ref[0])
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-6)
    assert 0 < len(ref[0]) < 6   # admission left some ids out
    ds = tf.data.Dataset.from_tensor_slices((np.arange(4), np.arange(4))).batch(2)
    with pytest.raises(KeyError, match="must name a position"):
        ds.map(get_asc_insert_func(tgt_key_specs=[FeatureSpec("u", table_name="t")]))


@pytest.mark.parametrize("modify", [False, True])
def test_args_index_list_form_trains_as_the_lookups_alone(modify):
    # mxRec's form without FeatureSpecs: positions of the elements' id tensors
    # and their tables. dynemb's tensor lookups do the table work (in the step,
    # or in the pipeline with modify_graph=True): the function checks and
    # passes the elements on, and training equals the same lookups without it.
    from dynemb.graph.modifier import modify_graph_and_start_emb_cache
    data = (np.array([[1, 2], [3, 1], [2, 4], [1, 5]], np.int64),
            np.array([[7], [8], [7], [9]], np.int64), np.arange(4, dtype=np.float32))

    def run(with_form):
        tf.compat.v1.reset_default_graph()
        dynemb.clear_tables()
        dynemb.init()
        a = dynemb.create_table(tf.int64, 2, "pa", tf.compat.v1.constant_initializer(0.5))
        b = dynemb.create_table(tf.int64, 2, "pb", tf.compat.v1.constant_initializer(0.5))
        ds = tf.data.Dataset.from_tensor_slices(data).batch(2)
        if with_form:
            ds = ds.map(get_asc_insert_func(args_index_list=[0, 1], table_names=["pa", "pb"],
                                            is_training=True))
        x, y, w = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        cfg = {"access_threshold": 2}
        emb = tf.concat([
            tf.reshape(dynemb.sparse_lookup(a, x, modify_graph=modify,
                                            access_and_evict_config=cfg), [-1, 4]),
            tf.reshape(dynemb.sparse_lookup(b, y, modify_graph=modify), [-1, 2])], 1)
        loss = tf.reduce_sum(tf.reduce_sum(emb, 1) * w)
        opt = dynemb.optimizers.gradient_descent.create_hash_optimizer(0.1)
        _, sparse = dynemb.get_dense_and_sparse_variable()
        train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
        if modify:
            modify_graph_and_start_emb_cache()
        with tf.compat.v1.Session() as s:
            losses = [s.run([loss, train])[0] for _ in range(2)]
        return losses, _rows("pa"), _rows("pb")

    plain, with_form = run(False), run(True)
    np.testing.assert_array_equal(with_form[0], plain[0])
    for got, want in zip(with_form[1:], plain[1:]):
        assert sorted(got) == sorted(want)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.parametrize("explicit", [False, True])
def test_specs_of_one_table_may_differ_in_faae_coefficient_only(explicit):
    # mxRec: each FeatureSpec weighs its own sightings; two specs of one table
    # with one threshold pair but coefficients 1 and 3, the batch carrying a
    # timestamp, and (explicit) the thresholds also given to sparse_lookup as
    # mxRec scripts do. The reference: a key is admitted when the weights of
    # its occurrences reach access_threshold = 3.
    t = _table("t")
    data = {"a": np.array([[1, 2]], np.int64), "b": np.array([[2, 3]], np.int64),
            "ts": np.array([100], np.int64)}
    specs = [FeatureSpec("a", table_name="t", access_threshold=3, eviction_threshold=50),
             FeatureSpec("b", table_name="t", access_threshold=3, eviction_threshold=50,
                         faae_coefficient=3),
             FeatureSpec("ts", is_timestamp=True)]
    ds = tf.data.Dataset.from_tensor_slices(data).batch(1)
    it = tf.compat.v1.data.make_initializable_iterator(
        ds.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True)))
    b = it.get_next()
    # (the thresholds only: each spec's own coefficient still weighs its ids)
    kw = [dict(access_and_evict_config={"access_threshold": 3, "eviction_threshold": 50})
          if explicit else {} for s in specs[:2]]
    embs = [fs_lookup(t, s, b, **k) for s, k in zip(specs[:2], kw)]
    loss = tf.add_n([tf.reduce_sum(e) for e in embs])
    train = gradient_descent.create_hash_optimizer(learning_rate=0.1).minimize(loss)
    start_asc_pipeline()
    with tf.compat.v1.Session() as s:
        s.run(it.initializer)
        s.run(train)
    # 1: weight 1 < 3; 2: 1 + 3; 3: 3. Admitted rows trained once.
    assert sorted(_rows("t")) == [2, 3]
