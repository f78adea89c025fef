"""The op library loads, and lookups give the right shapes, dtypes and
values for int32/int64 ids of any rank, including empty batches."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb import _lib


def _table(name="t", dim=3, init=None, **kw):
    init = init or tf.compat.v1.constant_initializer(0.25)
    return dynemb.create_table(tf.int64, dim, name, init, **kw)


def test_library_exports_ops_and_engine():
    for op in ("dynemb_lookup", "dynemb_apply", "dynemb_evict", "dynemb_export",
               "dynemb_import", "dynemb_stats"):
        assert hasattr(_lib.ops, op)
    assert _lib.clib.dynemb_table_create  # engine C API in the same .so


@pytest.mark.parametrize("dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("shape", [[5], [2, 3], [2, 2, 2], [0], [0, 4]])
def test_lookup_shapes_and_dtypes(dtype, shape):
    t = _table(dim=3)
    ids_np = (np.arange(int(np.prod(shape))) % 4 * 1000003).reshape(shape)
    ids = tf.compat.v1.placeholder(dtype, [None] * len(shape))
    out = dynemb.sparse_lookup(t, ids)
    assert out.dtype == tf.float32
    assert out.shape.as_list() == [None] * len(shape) + [3]
    with tf.compat.v1.Session() as s:
        v = s.run(out, {ids: ids_np.astype(dtype.as_numpy_dtype)})
    assert v.shape == tuple(shape) + (3,)
    np.testing.assert_array_equal(v, np.full(v.shape, 0.25, np.float32))
    assert t.size() == len(set(ids_np.ravel().tolist()))


def test_static_shape_and_send_count():
    # send_count is mxRec's capacity of the ids a lookup sends: not used with
    # dynamic shapes (init's default); in static-shape mode at least the
    # batch's unique ids, checked at run time with a message naming it.
    t = _table(dim=2)
    out = dynemb.sparse_lookup(t, tf.constant([[1, 2], [3, 4]], tf.int64))
    assert out.shape.as_list() == [2, 2, 2]
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    dynamic = dynemb.sparse_lookup(t, ids, send_count=2)
    with tf.compat.v1.Session() as s:
        assert s.run(dynamic, {ids: np.arange(6)}).shape == (6, 2)
    for bad in (0, 2**31, 2.5, True):
        with pytest.raises(ValueError, match="send_count must be an int"):
            dynemb.sparse_lookup(t, ids, send_count=bad)
    dynemb.init(use_dynamic=False, use_dynamic_expansion=True)
    static = dynemb.sparse_lookup(t, ids, send_count=4)
    with tf.compat.v1.Session() as s:
        # 6 ids, 4 of them unique: within the capacity
        assert s.run(static, {ids: [1, 1, 2, 3, 4, 4]}).shape == (6, 2)
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="send_count = 4 is below the number of unique ids"):
            s.run(static, {ids: np.arange(5)})


def test_mxrec_lookup_keywords():
    t = _table(dim=2)
    ids = tf.constant([1, 2], tf.int64)
    out = dynemb.sparse_lookup(t, ids, dim=2, multi_lookup=True, lookup_ids=ids,
                               feature_spec_name_ids_dict={})
    assert out.shape.as_list() == [2, 2]
    dynemb.sparse_lookup(t, ids, dim=tf.TensorShape([2]))
    with pytest.raises(ValueError, match="dim = 3, but the table's dim is 2"):
        dynemb.sparse_lookup(t, ids, dim=3)
    with pytest.raises(TypeError, match="unexpected arguments \\['dimension'\\]"):
        dynemb.sparse_lookup(t, ids, dimension=2)


def test_int32_and_int64_ids_reach_the_same_rows():
    t = _table(dim=2, init=tf.compat.v1.random_uniform_initializer(-1, 1, seed=3))
    a = dynemb.sparse_lookup(t, tf.constant([7, -5, 2**31 - 1], tf.int32))
    b = dynemb.sparse_lookup(t, tf.constant([7, -5, 2**31 - 1], tf.int64))
    with tf.compat.v1.Session() as s:
        va, vb = s.run([a, b])
    np.testing.assert_array_equal(va, vb)
    assert t.size() == 3


def test_initial_values_are_a_function_of_seed_and_key():
    init = tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=42)
    t = dynemb.create_table(tf.int64, 8, "a", init)
    u = dynemb.create_table(tf.int64, 8, "b", init)
    x = dynemb.sparse_lookup(t, tf.constant([1, 2, 3], tf.int64))
    y = dynemb.sparse_lookup(u, tf.constant([3, 2, 1], tf.int64))
    with tf.compat.v1.Session() as s:
        vx, vy = s.run([x, y])
    np.testing.assert_array_equal(vx, vy[::-1])
    assert np.all(np.abs(vx) <= 0.2 + 1e-6) and np.std(vx) > 0.01


def test_eval_lookup_reads_default_and_inserts_nothing():
    t = _table(dim=2)
    train = dynemb.sparse_lookup(t, tf.constant([1], tf.int64))
    ev = dynemb.sparse_lookup(t, tf.constant([1, 99], tf.int64), is_train=False)
    with tf.compat.v1.Session() as s:
        s.run(train)
        v = s.run(ev)
    np.testing.assert_array_equal(v, [[0.25, 0.25], [0, 0]])
    assert t.size() == 1


def test_gradient_is_indexed_slices_keyed_by_ids():
    t = _table(dim=2)
    ids = tf.constant([[4, 5], [4, 6]], tf.int32)
    out = dynemb.sparse_lookup(t, ids)
    loss = tf.reduce_sum(out * tf.constant([[[1.0], [2.0]], [[3.0], [4.0]]]))
    _, sparse = dynemb.get_dense_and_sparse_variable()
    (g,) = tf.gradients(loss, sparse)
    assert isinstance(g, tf.IndexedSlices)
    with tf.compat.v1.Session() as s:
        idx, val = s.run([g.indices, g.values])
    assert idx.dtype == np.int64
    np.testing.assert_array_equal(idx, [4, 5, 4, 6])
    np.testing.assert_array_equal(val, [[1, 1], [2, 2], [3, 3], [4, 4]])


def test_table_reused_across_graphs_with_same_config():
    t = _table(name="keep", dim=2)
    out = dynemb.sparse_lookup(t, tf.constant([1, 2], tf.int64))
    with tf.compat.v1.Session() as s:
        s.run(out)
    with tf.Graph().as_default():
        t2 = _table(name="keep", dim=2)
        assert t2.size() == 2
        with tf.compat.v1.Session() as s:
            s.run(dynemb.sparse_lookup(t2, tf.constant([3], tf.int64)))
    assert t.size() == 3


def test_stats_and_capacity():
    t = _table(dim=2)
    out = dynemb.sparse_lookup(t, tf.constant([1, 1, 2], tf.int64))
    with tf.compat.v1.Session() as s:
        s.run(out)
        st = dict(zip(_lib.STATS_FIELDS, s.run(t.stats_op())))
    assert st["size"] == 2 and st["lookups"] == 3 and st["inserted"] == 2
    assert t.capacity() >= t.size() == 2


def test_ops_are_stateful():
    from tensorflow.python.framework import op_def_registry
    for op in ("DynembLookup", "DynembApply", "DynembEvict", "DynembExport",
               "DynembImport", "DynembStats"):
        assert op_def_registry.get(op).is_stateful, op


def test_graph_mode_required():
    import subprocess
    import sys
    import textwrap
    code = textwrap.dedent("""
        import os; os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        import tensorflow as tf, dynemb
        dynemb.init()
        try:
            dynemb.create_table(tf.int64, 2, "t", tf.compat.v1.zeros_initializer())
        except RuntimeError as e:
            print("ERR", e)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "ERR" in r.stdout and "graph mode" in r.stdout, r.stdout + r.stderr[-1000:]


def test_lookup_records_for_graph_modification():
    from dynemb.core.embedding import graph_state
    t = _table(dim=2)
    dynemb.sparse_lookup(t, tf.constant([1], tf.int64), is_train=False, modify_graph=True)
    dynemb.sparse_lookup(t, tf.constant([[1]], tf.int64), is_grad=False)
    recs = graph_state().lookups
    assert [r["op"].type for r in recs] == ["DynembLookup", "DynembLookup"]
    assert [r["modify_graph"] for r in recs] == [True, False]


def test_no_gradient_with_is_grad_false_or_eval():
    t = _table(dim=2)
    a = dynemb.sparse_lookup(t, tf.constant([1], tf.int64), is_grad=False)
    b = dynemb.sparse_lookup(t, tf.constant([2], tf.int64), is_train=False)
    _, sparse = dynemb.get_dense_and_sparse_variable()
    assert tf.gradients(tf.reduce_sum(a) + tf.reduce_sum(b), sparse) == [None]


def test_serving_default_value_for_unknown_ids():
    t = _table("served", dim=3)
    train = dynemb.sparse_lookup(t, tf.constant([1, 2], tf.int64))
    ev = dynemb.sparse_lookup(t, tf.constant([1, 99], tf.int64), is_train=False,
                              serving_default_value=[0.5, -1.0, 2.0])
    with tf.compat.v1.Session() as s:
        s.run(train)
        v = s.run(ev)
    np.testing.assert_array_equal(v[0], [0.25, 0.25, 0.25])  # a real row
    np.testing.assert_array_equal(v[1], [0.5, -1.0, 2.0])    # unknown id
    with pytest.raises(ValueError, match="served.*dim 3"):
        dynemb.sparse_lookup(t, tf.constant([1], tf.int64), is_train=False,
                             serving_default_value=[1.0, 2.0])


def test_serving_default_value_computed_from_constants():
    # mxRec's examples pass tf.ones(dim) * 2: evaluated once at graph build.
    t = _table("served2", dim=3)
    ev = dynemb.sparse_lookup(t, tf.constant([99], tf.int64), is_train=False,
                              serving_default_value=tf.ones(3) * 2)
    with tf.compat.v1.Session() as s:
        np.testing.assert_array_equal(s.run(ev), [[2.0, 2.0, 2.0]])
    # one that changes while the graph runs is that lookup's own (mxRec: any
    # tensor); the table's default stays for the others
    p = tf.compat.v1.placeholder(tf.float32, [3])
    fed = dynemb.sparse_lookup(t, tf.constant([1], tf.int64), is_train=False,
                               serving_default_value=p * 2)
    v = tf.Variable([1.0, 1.0, 1.0])
    var = dynemb.sparse_lookup(t, tf.constant([1], tf.int64), is_train=False,
                               serving_default_value=v + 1)
    with tf.compat.v1.Session() as s:
        s.run(v.initializer)
        np.testing.assert_array_equal(s.run(fed, {p: [1, 2, 3]}), [[2.0, 4.0, 6.0]])
        np.testing.assert_array_equal(s.run(var), [[2.0, 2.0, 2.0]])
        np.testing.assert_array_equal(s.run(ev), [[2.0, 2.0, 2.0]])


def test_tier_parameters_are_accepted_and_validated(tmp_path):
    # mxRec's three-tier form: device + host rows stay in memory (there is no
    # device tier yet), the rest go to a file in the SSD path.
    ssd = tmp_path / "ssd"
    t = _table("tiers", dim=2, device_vocabulary_size=4, host_vocabulary_size=8,
               ssd_vocabulary_size=100, ssd_data_path=[str(ssd)])
    assert ssd.is_dir()
    out = dynemb.sparse_lookup(t, tf.constant(np.arange(20), tf.int64))
    with tf.compat.v1.Session() as s:
        s.run(out)
    assert t.size() == 20
    st = t.stats()
    assert st["host_rows"] == 12 and st["ssd_rows"] == 8 and st["ssd_bytes"] >= 8 * 2 * 4
    with pytest.raises(ValueError, match="needs rows in memory above it"):
        _table("tiers2", dim=2, ssd_vocabulary_size=10)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="cannot be created"):
        _table("tiers3", dim=2, ssd_vocabulary_size=10, ssd_data_path=str(blocker / "sub"))
    with pytest.raises(ValueError, match="device_vocabulary_size"):
        _table("tiers4", dim=2, device_vocabulary_size=-1)


def test_step_reads_rows_before_it_updates_them():
    # d sum(emb)/d emb is a constant when shapes are static, so nothing but the
    # lookup's gradient orders the apply after the lookup within a step.
    from dynemb.optimizers import gradient_descent
    opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
    t = _table("ordered", dim=3, optimizer_list=[opt])
    emb = dynemb.sparse_lookup(t, tf.constant([1, 2], tf.int64))
    loss = tf.reduce_sum(emb)
    _, sv = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sv), sv))
    apply_op = [o for o in tf.compat.v1.get_default_graph().get_operations()
                if o.type == "DynembApply"][0]
    seen, stack = set(), [apply_op]
    while stack:  # everything the apply op waits for
        o = stack.pop()
        if o.name not in seen:
            seen.add(o.name)
            stack.extend([i.op for i in o.inputs] + list(o.control_inputs))
    assert any(n.endswith("DynembLookup") for n in seen)
    with tf.compat.v1.Session() as s:
        losses = [s.run([loss, train])[0] for _ in range(20)]
    expected = [6 * (0.25 - 0.1 * k) for k in range(20)]
    np.testing.assert_allclose(losses, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("make, want_std", [
    (lambda: tf.compat.v1.glorot_uniform_initializer(seed=1), np.sqrt(1.0 / 16)),
    (lambda: tf.compat.v1.glorot_normal_initializer(seed=1), np.sqrt(1.0 / 16)),
    (lambda: tf.compat.v1.variance_scaling_initializer(scale=2.0, seed=1), np.sqrt(2.0 / 16)),
    (lambda: tf.compat.v1.variance_scaling_initializer(scale=2.0, distribution="uniform",
                                                        seed=1), np.sqrt(2.0 / 16)),
    (lambda: tf.keras.initializers.HeNormal(seed=1), np.sqrt(2.0 / 16)),
    (lambda: tf.keras.initializers.LecunUniform(seed=1), np.sqrt(1.0 / 16)),
])
def test_variance_scaling_initializers(make, want_std):
    # A row has dim = 16 values and the fans are dim (a table has no fixed row
    # count): the rows' spread is TensorFlow's variance-scaling rule with
    # n = 16, std = sqrt(scale / n), on TF's support (uniform: within
    # sqrt(3) std; truncated normal: within 2 of its stddev before correction).
    t = dynemb.create_table(tf.int64, 16, "vs", make())
    rows = dynemb.sparse_lookup(t, tf.range(4000, dtype=tf.int64))
    with tf.compat.v1.Session() as s:
        got = s.run(rows)
    assert abs(got.mean()) < 0.01
    np.testing.assert_allclose(got.std(), want_std, rtol=0.03)
    bound = np.sqrt(3) * want_std if "niform" in type(make()).__name__ else \
        2 * want_std / 0.87962566103423978
    assert np.abs(got).max() <= bound + 1e-6


def test_tf1_random_uniform_default_range():
    # TF1's random_uniform_initializer() has maxval=None: [0, 1) for floats,
    # as tf.random.uniform (a None once failed create_table).
    t = dynemb.create_table(tf.int64, 8, "unif01", tf.compat.v1.random_uniform_initializer(seed=2))
    rows = dynemb.sparse_lookup(t, tf.range(2000, dtype=tf.int64))
    with tf.compat.v1.Session() as s:
        got = s.run(rows)
    assert got.min() >= 0.0 and got.max() < 1.0
    np.testing.assert_allclose(got.mean(), 0.5, atol=0.02)
