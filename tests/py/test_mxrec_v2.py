"""mxRec's second API generation (``import dynemb.v2 as mxrec``) against
independent references.

* AdamWOptimizer against Loshchilov & Hutter's update written out here in
  float64 NumPy, with the lazy semantics (rows absent from a step neither
  step nor decay; the bias correction counts every step);
* init(toml_path): every kind of bad entry fails naming its section and key;
* min_used_times against a counting reference of the "more than" rule;
* EmbeddingTableSaver: a save / load round trip is exact (keys, embeddings,
  AdamW's slots, step count), beside a plain Saver of the dense variables;
* a quick-start-shaped script (train, save with both savers, load in a
  fresh graph, predict) gives the predictions of the same training written
  with the first generation's API (create_table, sparse_lookup).
"""
import ctypes
import textwrap

import numpy as np
import pytest
import tensorflow as tf

import dynemb
import dynemb.v2 as mxrec
from dynemb import _lib
from dynemb.optimizers.adamw import AdamWOptimizer as FirstGenAdamW

GOOD_TOML = """\
[mxrec]
log_level = "WARNING"
use_ranktable = true

[model]
mode = "train_and_evaluate"
deterministic = false
saved_path = "saved_model"
train_steps = 20
train_interval = 10
eval_steps = 2
batch_number = 20

[model.distribution]
interface = "lo"
local_rank_size = 1
num_server = 1
"""


@pytest.fixture
def toml(tmp_path):
    path = tmp_path / "demo.toml"
    path.write_text(GOOD_TOML)
    return str(path)


def snapshot(name):
    """(keys, rows with their slots, apply steps) of engine table `name`."""
    snap = _lib.Snapshot()
    with _lib.table_handle(name) as h:
        _lib.check(_lib.clib.dynemb_table_snapshot(h, ctypes.byref(snap)), "snapshot")
    try:
        n = snap.rows
        keys = np.ctypeslib.as_array(snap.keys, (n,)).copy() if n else np.zeros([0])
        rows = np.ctypeslib.as_array(snap.values, (n, snap.row_floats)).copy() if n else \
            np.zeros([0, snap.row_floats])
        return keys, rows, snap.apply_steps, snap.optimizer_kind
    finally:
        _lib.clib.dynemb_snapshot_free(ctypes.byref(snap))


# --------------------------------------------------------------------------
# AdamW against the paper's update
# --------------------------------------------------------------------------

def test_adamw_matches_dense_lazy_reference(toml):
    mxrec.init(toml)
    lr, wd, b1, b2, eps, dim = 0.05, 0.8, 0.8, 0.95, 1e-6, 3
    table = mxrec.get_embedding_table("w", dim, 100,
                                      tf.compat.v1.random_normal_initializer(seed=3))
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    coef = tf.compat.v1.placeholder(tf.float32, [None, dim])
    emb = mxrec.embedding_lookup(table, ids)
    loss = tf.reduce_sum(emb * coef)  # d loss / d row = coef, per occurrence
    opt = mxrec.AdamWOptimizer(learning_rate=lr, weight_decay=wd, beta_1=b1, beta_2=b2,
                               epsilon=eps)
    sparse = mxrec.get_sparse_embedding()
    train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    everything = mxrec.embedding_lookup(table, tf.range(6, dtype=tf.int64),
                                        is_train=False)
    rng = np.random.default_rng(7)
    ref, ref_no_decay = {}, {}  # id -> [theta, m, v], float64
    with tf.compat.v1.Session() as sess:
        sess.run(mxrec.get_init_hashtable_op())
        for t in range(1, 13):
            # a few ids, some repeated; ids 4 and 5 sit out whole steps
            batch = rng.choice(6 if t % 3 == 0 else 4, size=5)
            c = rng.normal(size=(5, dim)).astype(np.float32)
            before, _ = sess.run([emb, train], {ids: batch, coef: c})
            for r, k in ((ref, wd), (ref_no_decay, 0.0)):
                for i, key in enumerate(batch):  # new rows: the value read this step
                    r.setdefault(key, [before[i].astype(np.float64), np.zeros(dim),
                                       np.zeros(dim)])
                g = {key: np.zeros(dim) for key in set(batch)}
                for i, key in enumerate(batch):
                    g[key] += c[i]
                for key, gk in g.items():  # only the rows in the batch move
                    theta, m, v = r[key]
                    m = b1 * m + (1 - b1) * gk
                    v = b2 * v + (1 - b2) * gk * gk
                    step = lr * np.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                    theta = theta - lr * k * theta - step * m / (np.sqrt(v) + eps)
                    r[key] = [theta, m, v]
        got = sess.run(everything)
    want = np.stack([ref[k][0] if k in ref else np.zeros(dim) for k in range(6)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    no_decay = np.stack([ref_no_decay[k][0] if k in ref else np.zeros(dim)
                         for k in range(6)])
    assert np.abs(got - no_decay).max() > 1e-2  # (the decay is visible)
    keys, rows, steps, kind = snapshot("w")
    assert kind == _lib.OPT_ADAMW and steps == 12
    for key, row in zip(keys, rows):  # the slots are the reference's moments
        np.testing.assert_allclose(row[dim:], np.concatenate(ref[key][1:]),
                                   rtol=1e-5, atol=1e-7)


def test_adamw_arguments_are_checked():
    with pytest.raises(ValueError, match="weight_decay = 11"):
        mxrec.AdamWOptimizer(weight_decay=11)
    with pytest.raises(ValueError, match=r"beta_1 = 1\b.*\[0, 1\)"):
        mxrec.AdamWOptimizer(beta_1=1)
    with pytest.raises(ValueError, match="epsilon = 0 is not supported"):
        mxrec.AdamWOptimizer(epsilon=0.0)
    with pytest.raises(ValueError, match="name"):
        mxrec.AdamWOptimizer(name="")
    opt = mxrec.AdamWOptimizer(weight_decay=tf.constant(0.5))  # a constant tensor
    assert opt.decoupled_weight_decay == 0.5 and opt.weight_decay == 0.0


# --------------------------------------------------------------------------
# init(toml_path)
# --------------------------------------------------------------------------

@pytest.mark.parametrize("edit, named", [
    (lambda s: s.replace('[mxrec]\nlog_level = "WARNING"\nuse_ranktable = true\n', ""),
     "the [mxrec] table is missing"),
    (lambda s: s.replace('"WARNING"', '"LOUD"'), "[mxrec] log_level = 'LOUD'"),
    (lambda s: s.replace("use_ranktable = true\n", ""), "[mxrec] use_ranktable is missing"),
    (lambda s: s.replace("use_ranktable = true", 'use_ranktable = "yes"'),
     "[mxrec] use_ranktable = 'yes'"),
    (lambda s: s.replace("use_ranktable = true", "use_ranktable = false"),
     "[mxrec.cm-node-info] is missing"),
    (lambda s: s.replace("use_ranktable = true", "use_ranktable = false\n"
                         "[mxrec.cm-node-info]\ncm_chief_ip = \"127.0.0.1\"\n"
                         "cm_chief_port = 70000\ncm_chief_device = 0\n"
                         "cm_worker_ip = \"127.0.0.1\"\ncm_worker_size = 1"),
     "[mxrec.cm-node-info] cm_chief_port = 70000"),
    (lambda s: s.replace('"train_and_evaluate"', '"fit"'), "[model] mode = 'fit'"),
    (lambda s: s.replace("train_steps = 20", "train_steps = -1"),
     "[model] train_steps = -1"),
    (lambda s: s.replace("local_rank_size = 1", "local_rank_size = 0"),
     "[model.distribution] local_rank_size = 0"),
    (lambda s: s + "oops = [", "not valid TOML"),
])
def test_init_names_the_bad_key(tmp_path, edit, named):
    path = tmp_path / "bad.toml"
    path.write_text(edit(GOOD_TOML))
    with pytest.raises(mxrec.TomlConfigError) as e:
        mxrec.init(str(path))
    assert named in str(e.value) and str(path) in str(e.value)


def test_init_reads_the_demo_layout(toml, tmp_path):
    mxrec.init(toml)
    assert mxrec.get_config()["model"]["train_interval"] == 10
    with pytest.raises(FileNotFoundError, match="no such file"):
        mxrec.init(str(tmp_path / "missing.toml"))


# --------------------------------------------------------------------------
# get_embedding_table: ranges, reuse, fixed capacity, admission
# --------------------------------------------------------------------------

def test_table_arguments_and_reuse(toml):
    mxrec.init(toml)
    for kwargs, named in [({"name": "a b"}, "name"), ({"dimension": 513}, "dimension"),
                          ({"device_vocabulary_size": 0}, "device_vocabulary_size"),
                          ({"min_used_times": -1}, "min_used_times"),
                          ({"max_cold_secs": 2**64}, "max_cold_secs"),
                          ({"distribution_strategy": "DP"}, "distribution_strategy")]:
        args = {**dict(name="t", dimension=4, device_vocabulary_size=10), **kwargs}
        with pytest.raises(ValueError, match=named):
            mxrec.get_embedding_table(**args)
    with pytest.raises(TypeError, match="key_dtype"):
        mxrec.get_embedding_table("t", 4, 10, key_dtype=tf.int32)
    t = mxrec.get_embedding_table("t", 4, 3)
    assert mxrec.get_embedding_table("t", 4, 3) is t  # the demo's second model
    with pytest.raises(ValueError, match="dimension 4, now 5"):
        mxrec.get_embedding_table("t", 5, 3)
    assert mxrec.get_existing_tables() == [t] and mxrec.get_sparse_embedding() == [t.anchor]
    # mxRec's fixed capacity: a fourth id does not fit, and the error says which argument
    rows = mxrec.embedding_lookup(t, tf.constant([[1, 2], [3, 4]], tf.int64))
    assert rows.shape.as_list() == [2, 2, 4]
    with tf.compat.v1.Session() as sess, pytest.raises(
            tf.errors.OpError, match="device_vocabulary_size"):
        sess.run(rows)


def test_min_used_times_admits_after_more_than_m_sightings(toml):
    mxrec.init(toml)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    tables = {m: mxrec.get_embedding_table("adm%s" % m, 2, 1000,
                                           tf.compat.v1.constant_initializer(1.0),
                                           min_used_times=m) for m in (None, 0, 1, 3)}
    lookups = [mxrec.embedding_lookup(t, ids) for t in tables.values()]
    reads = {m: mxrec.embedding_lookup(t, tf.range(8, dtype=tf.int64), is_train=False)
             for m, t in tables.items()}
    counts = np.zeros(8, int)
    rng = np.random.default_rng(1)
    with tf.compat.v1.Session() as sess:
        for _ in range(6):
            batch = rng.choice(8, size=4, replace=False)  # (distinct within a step)
            sess.run(lookups, {ids: batch})
            counts[batch] += 1
            got = sess.run(reads)
            for m in tables:
                want = counts > (m or 0) if m is not None else counts > 0
                assert (got[m][:, 0] == 1.0).tolist() == want.tolist(), (m, counts)
    assert {1, 3} <= set(counts.tolist())  # ids seen exactly m times stayed out


# --------------------------------------------------------------------------
# EmbeddingTableSaver
# --------------------------------------------------------------------------

def _tiny_model(table, dense_init=0.3):
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    w = tf.compat.v1.get_variable("w", [3, 1],
                                  initializer=tf.compat.v1.constant_initializer(dense_init))
    emb = tf.reduce_sum(mxrec.embedding_lookup(table, ids), axis=1)
    return ids, tf.reduce_sum(tf.square(tf.matmul(emb, w) - 1.0)), w


def test_saver_round_trip_is_exact(toml, tmp_path):
    mxrec.init(toml)
    table = mxrec.get_embedding_table("rt", 3, 100, tf.compat.v1.random_normal_initializer(),
                                      min_used_times=1)
    ids, loss, w = _tiny_model(table)
    sparse = mxrec.get_sparse_embedding()
    train = [mxrec.AdamWOptimizer(0.1).apply_gradients(zip(tf.gradients(loss, sparse),
                                                           sparse)),
             tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, var_list=[w])]
    saver = tf.compat.v1.train.Saver()
    tsaver = mxrec.EmbeddingTableSaver(mxrec.get_existing_tables())
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for s in range(5):
            sess.run(train, {ids: [[s, s + 1], [7, 8], [s + 2, 7]]})
        saver.save(sess, str(tmp_path / "model"), global_step=5)
        tsaver.save(sess, str(tmp_path), 5)
        dense = sess.run(w)
    saved = snapshot("rt")
    assert saved[0].size and saved[3] == _lib.OPT_ADAMW
    assert not any(p.name.startswith("sparse-") for p in tmp_path.iterdir())  # (one copy)
    dynemb.drop_table("rt")
    with tf.Graph().as_default():
        mxrec.init(toml)
        table = mxrec.get_embedding_table("rt", 3, 100,
                                          tf.compat.v1.random_normal_initializer(),
                                          min_used_times=1)
        ids, loss, w = _tiny_model(table, dense_init=0.0)
        sparse = mxrec.get_sparse_embedding()
        mxrec.AdamWOptimizer(0.1).apply_gradients(zip(tf.gradients(loss, sparse), sparse))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as sess:
            assert snapshot("rt")[0].size == 0
            saver.restore(sess, str(tmp_path / "model-5"))
            mxrec.EmbeddingTableSaver(mxrec.get_existing_tables()).load(sess, str(tmp_path), 5)
            np.testing.assert_array_equal(sess.run(w), dense)
    loaded = snapshot("rt")
    for a, b in zip(saved, loaded):
        np.testing.assert_array_equal(a, b)
    with tf.compat.v1.Session() as sess, pytest.raises(
            ValueError, match="no tables were saved at step 6"):
        mxrec.EmbeddingTableSaver([table]).load(sess, str(tmp_path), 6)


def test_saver_evicts_cold_rows_first(toml, tmp_path, monkeypatch):
    mxrec.init(toml)
    clock = tf.compat.v1.placeholder(tf.int64, [])  # the lookups' wall clock, fed
    monkeypatch.setattr("dynemb.core.lookup.wall_time", lambda: clock)
    table = mxrec.get_embedding_table("cold", 2, 100, max_cold_secs=60)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    rows = mxrec.embedding_lookup(table, ids)
    tsaver = mxrec.EmbeddingTableSaver([table])
    with tf.compat.v1.Session() as sess:
        sess.run(rows, {ids: [1, 2, 3], clock: 1000})
        sess.run(rows, {ids: [2], clock: 1050})
        tsaver.clock = lambda: 1060  # idle 60 s at most: kept
        tsaver.save(sess, str(tmp_path), 1)
        assert sorted(snapshot("cold")[0]) == [1, 2, 3]
        tsaver.clock = lambda: 1061  # 1 and 3 idle 61 s: removed, then saved
        tsaver.save(sess, str(tmp_path), 2)
        assert sorted(snapshot("cold")[0]) == [2]


# --------------------------------------------------------------------------
# A quick-start-shaped script, and the same training on the first generation
# --------------------------------------------------------------------------

N_TRAIN, N_EVAL, BATCH = 400, 64, 32


def _data(seed):
    rng = np.random.default_rng(seed)
    n = N_TRAIN if seed == 0 else N_EVAL
    user = rng.integers(0, 50, size=(n, 3))
    item = rng.integers(0, 30, size=(n, 2))
    label = ((user.sum(1) + item.sum(1)) % 3 == 0).astype(np.float32)[:, None]
    return {"user": user, "item": item, "label": label}


def _batches(seed):
    ds = tf.data.Dataset.from_tensor_slices(_data(seed)).batch(BATCH, drop_remainder=True)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    return it.get_next(), it


def _forward(batch, lookup, tables):
    """The model: summed rows of each feature, one dense layer, a logit."""
    pooled = [tf.reduce_sum(lookup(t, batch[f]), axis=1) for t, f in zip(tables, ("user",
                                                                                    "item"))]
    with tf.compat.v1.variable_scope("dense", reuse=tf.compat.v1.AUTO_REUSE):
        w = tf.compat.v1.get_variable("w", [6, 1], initializer=tf.compat.v1.
                                      glorot_uniform_initializer(seed=11))
        b = tf.compat.v1.get_variable("b", [1], initializer=tf.zeros_initializer())
    logit = tf.matmul(tf.concat(pooled, 1), w) + b
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
        labels=batch["label"], logits=logit))
    return loss, tf.sigmoid(logit)


INIT = dict(stddev=0.1, seed=5)


def _train_ops(loss, sparse, make_opt):
    dense = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    ops = [tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, var_list=dense)]
    for i, var in enumerate(sparse):  # one optimizer per table, as mxRec's demo
        ops.append(make_opt("AdamW_%d" % i).apply_gradients(
            zip(tf.gradients(loss, [var]), [var])))
    return ops


def _v2_tables():
    return [mxrec.get_embedding_table(n, d, 1000,
                                      tf.compat.v1.truncated_normal_initializer(**INIT))
            for n, d in (("user_table", 4), ("item_table", 2))]


def _quick_start_v2(toml, saved):
    """Train with evaluation every 5 steps, save with both savers; then a
    fresh graph loads and predicts."""
    mxrec.init(toml)
    batch, it = _batches(0)
    loss, _ = _forward(batch, mxrec.embedding_lookup, _v2_tables())
    ebatch, eit = _batches(1)
    eloss, _ = _forward(ebatch, mxrec.embedding_lookup, _v2_tables())  # (same tables)
    ops = _train_ops(loss, mxrec.get_sparse_embedding(),
                     lambda n: mxrec.AdamWOptimizer(0.02, 0.05, name=n))
    with tf.compat.v1.Session() as sess:
        sess.run(mxrec.get_init_hashtable_op())
        sess.run([it.initializer, tf.compat.v1.global_variables_initializer()])
        saver = tf.compat.v1.train.Saver()
        tsaver = mxrec.EmbeddingTableSaver(mxrec.get_existing_tables())
        for step in range(1, N_TRAIN // BATCH + 1):
            sess.run(ops)
            if step % 5 == 0:
                sess.run(eit.initializer)
                sess.run(eloss)
        saver.save(sess, saved + "/model", global_step=step)
        tsaver.save(sess, saved, step)
    dynemb.clear_tables()  # (the loading graph finds nothing in the engine)
    with tf.Graph().as_default():
        mxrec.init(toml)
        ebatch, eit = _batches(1)
        _, pred = _forward(ebatch, lambda t, i: mxrec.embedding_lookup(t, i, is_train=False),
                           _v2_tables())
        with tf.compat.v1.Session() as sess:
            sess.run(mxrec.get_init_hashtable_op())
            tf.compat.v1.train.Saver().restore(sess, "%s/model-%d" % (saved, step))
            mxrec.EmbeddingTableSaver(mxrec.get_existing_tables()).load(sess, saved, step)
            sess.run(eit.initializer)
            return sess.run(pred)


def _first_generation():
    """The same training with create_table / sparse_lookup, predicting in
    the training session."""
    dynemb.init(use_dynamic_expansion=False)
    tables = [dynemb.create_table(tf.int64, d, n,
                                  tf.compat.v1.truncated_normal_initializer(**INIT),
                                  device_vocabulary_size=1000)
              for n, d in (("user_table", 4), ("item_table", 2))]
    batch, it = _batches(0)
    loss, _ = _forward(batch, dynemb.sparse_lookup, tables)
    ebatch, eit = _batches(1)
    eloss, _ = _forward(ebatch, dynemb.sparse_lookup, tables)
    epred = _forward(ebatch, lambda t, i: dynemb.sparse_lookup(t, i, is_train=False),
                     tables)[1]
    ops = _train_ops(loss, [t.anchor for t in tables],
                     lambda n: FirstGenAdamW(0.02, 0.05, name=n))
    with tf.compat.v1.Session() as sess:
        sess.run([it.initializer, tf.compat.v1.global_variables_initializer()])
        for step in range(1, N_TRAIN // BATCH + 1):
            sess.run(ops)
            if step % 5 == 0:
                sess.run(eit.initializer)
                sess.run(eloss)
        sess.run(eit.initializer)
        return sess.run(epred)


def test_quick_start_script_equals_first_generation(toml, tmp_path):
    got = _quick_start_v2(toml, str(tmp_path))
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    want = _first_generation()
    assert got.shape == (BATCH, 1)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    assert np.ptp(got) > 1e-3  # (a model that learned something per example)
