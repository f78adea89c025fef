"""Custom warm start (tf.estimator.WarmStartSettings with dynemb tables):
single path, mxRec's multi-path form, table selection by name / regex / list,
renamed tables, dense variables by TensorFlow's rules, clear errors.

The reference for every warm-started value is the checkpoint itself, read back
with tf.train.load_checkpoint."""
import collections

import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.core import embedding
from dynemb.graph.modifier import GraphModifierHook
from dynemb.optimizers import adagrad
from table_export import checkpoint_rows


def WS(ckpt_to_initialize_from, vars_to_warm_start=".*", var_name_to_vocab_info=None,
       var_name_to_prev_var_name=None):
    """tf.estimator.WarmStartSettings where TensorFlow has Estimator (<= 2.15);
    the same fields in a plain namedtuple elsewhere (dynemb.warm_start reads
    either), so the sess.run tests also run on TensorFlow >= 2.16."""
    est = getattr(tf, "estimator", None)
    cls = est.WarmStartSettings if est is not None else _Settings
    return cls(ckpt_to_initialize_from, vars_to_warm_start, var_name_to_vocab_info,
               var_name_to_prev_var_name)


_Settings = collections.namedtuple("WarmStartSettings", [
    "ckpt_to_initialize_from", "vars_to_warm_start", "var_name_to_vocab_info",
    "var_name_to_prev_var_name"])

DIMS = {"user": 3, "item": 2}
DENSE = ("mlp/w", "out/b")


def _model(features, labels, names=None, seed=1, is_train=True, modify=False):
    """Two tables (user: [B, 2] ids, item: [B] ids) and two dense variables."""
    names = names or {"user": "user", "item": "item"}
    opt = adagrad.create_hash_optimizer(learning_rate=0.2, initial_accumulator_value=0.1)
    tabs = {role: dynemb.create_table(
        tf.int64, DIMS[role], names[role],
        tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=seed * 10 + i),
        optimizer_list=[opt]) for i, role in enumerate(("user", "item"))}
    eu = dynemb.sparse_lookup(tabs["user"], features["user"], is_train=is_train,
                              modify_graph=modify)
    ei = dynemb.sparse_lookup(tabs["item"], features["item"], is_train=is_train,
                              modify_graph=modify)
    with tf.compat.v1.variable_scope("mlp"):
        w = tf.compat.v1.get_variable(
            "w", [5, 1], initializer=tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=seed))
    with tf.compat.v1.variable_scope("out"):
        b = tf.compat.v1.get_variable("b", [1],
                                      initializer=tf.compat.v1.constant_initializer(0.1 * seed))
    logits = tf.matmul(tf.concat([tf.reduce_sum(eu, 1), ei], 1), w)[:, 0] + b
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if not is_train:
        return loss, None, tabs
    dense, sparse = dynemb.get_dense_and_sparse_variable()
    train = tf.group(
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense),
        opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse),
                            global_step=tf.compat.v1.train.get_or_create_global_step()))
    return loss, train, tabs


def _data(seed, n=32):
    rng = np.random.RandomState(seed)
    return ({"user": rng.randint(0, 30, size=[n, 2]).astype(np.int64) * 11,
             "item": rng.randint(0, 12, size=[n]).astype(np.int64) * 7},
            rng.randint(0, 2, size=[n]).astype(np.float32))


def _make_ckpt(directory, seed, names=None, steps=4):
    """Trains the model a few steps from initializers of `seed`; saves to `directory`."""
    dynemb.clear_tables()
    x, y = _data(seed)
    with tf.Graph().as_default():
        it = tf.compat.v1.data.make_one_shot_iterator(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(8))
        f, lab = it.get_next()
        _, train, _ = _model(f, lab, names=names, seed=seed)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for _ in range(steps):
                s.run(train)
            saver.save(s, str(directory / "model.ckpt"), global_step=steps)
    dynemb.clear_tables()
    return str(directory)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """make(seed, names=None): the checkpoint directory of _make_ckpt, made once
    per module (called inside tests, where dynemb is initialized)."""
    base = tmp_path_factory.mktemp("warm_start")
    cache = {}

    def make(seed, names=None):
        key = (seed, tuple(sorted((names or {}).items())))
        if key not in cache:
            cache[key] = _make_ckpt(base / f"ckpt{len(cache)}", seed, names)
        return cache[key]
    return make


def _ckpt_table(path, name, dim):
    """(keys, embeddings) of table `name` in the checkpoint, sorted by key."""
    keys, values = checkpoint_rows(path, name)
    return keys, values[:, :dim]


def _ckpt_dense(path, name):
    return tf.train.load_checkpoint(path).get_tensor(name)


class _Snapshot(tf.compat.v1.train.SessionRunHook):
    """Records tables and dense variables right after the session is created
    (before the first step)."""

    def __init__(self, out):
        self.out = out

    def begin(self):
        st = embedding.graph_state()
        self._exports = {n: list(t.export_op()) for n, t in st.tables.items()}
        self._dense = {v.op.name: v for v in tf.compat.v1.global_variables()}

    def after_create_session(self, session, coord):
        for n, ex in self._exports.items():
            meta, keys, values, _, cand_keys, _, _, steps = session.run(ex)
            o = np.argsort(keys)
            self.out[n] = (keys[o], values[o], len(cand_keys), int(np.reshape(steps, -1)[0]))
        for n, v in self._dense.items():
            self.out[n] = session.run(v)


def _sessrun_warm(settings, names=None, seed=9, use_function=True):
    """Builds the model (fresh initializers of `seed`) in a new graph, warm-starts
    it, runs the initializer and returns the snapshot of tables and dense vars."""
    dynemb.clear_tables()
    x, y = _data(99)
    out = {}
    with tf.Graph().as_default():
        f = {k: tf.constant(v) for k, v in x.items()}
        _model(f, tf.constant(y), names=names, seed=seed)
        if use_function == "args":
            op = dynemb.warm_start(*settings)
        elif use_function:
            op = dynemb.warm_start(settings)
        else:  # TensorFlow's own entry point, which import dynemb extends
            tf.compat.v1.train.warm_start(*settings)
            op = tf.no_op()
        snap = _Snapshot(out)
        snap.begin()
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            s.run(op)
            snap.after_create_session(s, None)
    return out


def _assert_table_from(out, name, path, prev=None):
    keys, emb = _ckpt_table(path, prev or name, DIMS[name])
    got_keys, got_values, cands, steps = out[name]
    np.testing.assert_array_equal(got_keys, keys, err_msg=name)
    np.testing.assert_array_equal(got_values[:, :DIMS[name]], emb, err_msg=name)
    # Fresh optimizer slots (Adagrad accumulators at initial_accumulator_value),
    # step count and admission state, as TensorFlow leaves optimizer slots alone.
    np.testing.assert_allclose(got_values[:, DIMS[name]:], 0.1, err_msg=name)
    assert cands == 0 and steps == 0


def _assert_fresh(out, name):
    assert len(out[name][0]) == 0, f"table {name} was warm-started"


def test_single_path_tables_and_dense_from_the_checkpoint(ckpt):
    a = ckpt(1)
    out = _sessrun_warm(WS(a))  # vars_to_warm_start='.*': everything
    for name in DIMS:
        _assert_table_from(out, name, a)
    for v in DENSE:
        np.testing.assert_array_equal(out[v], _ckpt_dense(a, v), err_msg=v)
    # The global step is not trainable: TensorFlow's '.*' leaves it alone.
    assert out["global_step"] == 0
    # TensorFlow's own tf.compat.v1.train.warm_start does the same once dynemb is imported.
    out2 = _sessrun_warm(WS(a), use_function=False)
    for name in DIMS:
        _assert_table_from(out2, name, a)


@pytest.mark.parametrize("sel,tables,dense", [
    ("user", {"user"}, set()),                     # a table's name: that table only
    ("us.*", {"user"}, set()),                     # regex over whole table names
    (["user", "item"], {"user", "item"}, set()),   # list of names
    (["item", "mlp/.*"], {"item"}, {"mlp/w"}),     # tables and dense regexes together
    (".*", {"user", "item"}, set(DENSE)),
])
def test_selection_by_name_regex_and_list(ckpt, sel, tables, dense):
    a = ckpt(1)
    out = _sessrun_warm(WS(a, vars_to_warm_start=sel), seed=9)
    for name in DIMS:
        if name in tables:
            _assert_table_from(out, name, a)
        else:
            _assert_fresh(out, name)
    for v in DENSE:
        same = np.array_equal(out[v], _ckpt_dense(a, v))
        assert same == (v in dense), v


def test_multi_path_later_paths_override_earlier_ones(ckpt):
    a = ckpt(1)
    b = ckpt(2)
    c = ckpt(3)
    # Any object with WarmStartSettings' fields works (TensorFlow >= 2.16 has no
    # tf.estimator), as do the same fields as arguments.
    settings = _Settings([a, b, c], [".*", ["user"], ["item", "mlp/w"]], None, [{}, {}, {}])
    out = _sessrun_warm(settings)
    _assert_table_from(out, "user", b)   # path 2 overrides path 1 for user
    _assert_table_from(out, "item", c)   # path 3 overrides path 1 for item
    np.testing.assert_array_equal(out["mlp/w"], _ckpt_dense(c, "mlp/w"))
    np.testing.assert_array_equal(out["out/b"], _ckpt_dense(a, "out/b"))
    # The checkpoints really differ, so the check above tells which one won.
    assert not np.array_equal(_ckpt_table(a, "user", 3)[1], _ckpt_table(b, "user", 3)[1])
    assert not np.array_equal(_ckpt_dense(a, "mlp/w"), _ckpt_dense(c, "mlp/w"))


def test_renamed_tables_single_and_per_path(ckpt):
    old = ckpt(4, {"user": "users_v1", "item": "items_v1"})
    a = ckpt(1)
    out = _sessrun_warm(WS(old, ["user", "item", "mlp/w"],
                           var_name_to_prev_var_name={"user": "users_v1", "item": "items_v1"}),
                        use_function="args")
    _assert_table_from(out, "user", old, prev="users_v1")
    _assert_table_from(out, "item", old, prev="items_v1")
    np.testing.assert_array_equal(out["mlp/w"], _ckpt_dense(old, "mlp/w"))
    # Per path: item renamed in the second checkpoint only.
    out = _sessrun_warm(WS([a, old], [".*", ["item"]],
                           var_name_to_prev_var_name=[{}, {"item": "items_v1"}]))
    _assert_table_from(out, "user", a)
    _assert_table_from(out, "item", old, prev="items_v1")


def test_missing_table_is_a_clear_error(tmp_path):
    only_user = tmp_path / "u"
    dynemb.clear_tables()
    with tf.Graph().as_default():  # a checkpoint holding tables 'user' and 'wide5' only
        for name, dim in (("user", 3), ("wide5", 5)):
            t = dynemb.create_table(tf.int64, dim, name, tf.compat.v1.zeros_initializer())
            e = dynemb.sparse_lookup(t, tf.constant([1, 2], tf.int64))
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as s:
            s.run(e)
            saver.save(s, str(only_user / "m"))
    for settings, table in ((WS(str(only_user), "item"), "item"),
                            (WS(str(only_user), ["user", "item"]), "item"),
                            (WS(str(only_user), "user", var_name_to_prev_var_name={
                                "user": "user_v0"}), "user")):
        with pytest.raises(dynemb.WarmStartError) as err:
            _sessrun_warm(settings)
        msg = str(err.value)
        assert f"table '{table}'" in msg and str(only_user / "m") in msg, msg
        assert "tables there: ['user', 'wide5']" in msg, msg
    with pytest.raises(dynemb.WarmStartError, match="table 'item' has dim 2 but table 'wide5'"):
        _sessrun_warm(WS(str(only_user), "item", var_name_to_prev_var_name={"item": "wide5"}))
    with pytest.raises(dynemb.WarmStartError, match="matches no table and no variable"):
        _sessrun_warm(WS(str(only_user), ["no_such_table"]))
    with pytest.raises(dynemb.WarmStartError, match="one entry per path"):
        _sessrun_warm(WS([str(only_user)] * 2, ["user"]))
    with pytest.raises(dynemb.WarmStartError, match="holds no checkpoint"):
        _sessrun_warm(WS(str(tmp_path)))


# --------------------------------------------------------------------------
# Estimator: warm_start_from, unchanged tf.estimator.Estimator
# --------------------------------------------------------------------------

def _input_fn():
    x, y = _data(99)
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(8)


def _est_model_fn(modify=False, out=None, seed=9):
    def model_fn(features, labels, mode):
        is_train = mode == tf.estimator.ModeKeys.TRAIN
        loss, train, _ = _model(features, labels, seed=seed, is_train=is_train, modify=modify)
        hooks = [_Snapshot(out)] if out is not None and is_train else []
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(mode, loss=loss)
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train,
                                          training_hooks=hooks)
    return model_fn


def test_estimator_warm_start_single_path_and_list_form(tmp_path, ckpt):
    a = ckpt(1)
    b = ckpt(2)
    # Single path, standard settings, plain tf.estimator.Estimator.
    out = {}
    est = tf.estimator.Estimator(_est_model_fn(out=out), str(tmp_path / "m1"),
                                 warm_start_from=WS(a, ["user", "out/b"]))
    est.train(_input_fn, steps=1)
    _assert_table_from(out, "user", a)
    _assert_fresh(out, "item")
    np.testing.assert_array_equal(out["out/b"], _ckpt_dense(a, "out/b"))
    assert not np.array_equal(out["mlp/w"], _ckpt_dense(a, "mlp/w"))
    # A checkpoint path string (Estimator makes it WarmStartSettings(path)).
    out = {}
    dynemb.clear_tables()
    est = tf.estimator.Estimator(_est_model_fn(out=out), str(tmp_path / "m2"), warm_start_from=b)
    est.train(_input_fn, steps=1)
    _assert_table_from(out, "user", b)
    _assert_table_from(out, "item", b)
    # mxRec's list form, which Estimator's own warm start would reject.
    out = {}
    dynemb.clear_tables()
    est = tf.estimator.Estimator(_est_model_fn(out=out), str(tmp_path / "m3"),
                                 warm_start_from=WS([a, b], [".*", "item"], None, [{}, {}]))
    est.train(_input_fn, steps=2)
    _assert_table_from(out, "user", a)
    _assert_table_from(out, "item", b)
    for v in DENSE:
        np.testing.assert_array_equal(out[v], _ckpt_dense(a, v))
    # Continuing in the same model_dir restores its own checkpoint: no warm start.
    own = tf.train.latest_checkpoint(str(tmp_path / "m3"))
    out.clear()
    est.train(_input_fn, steps=1)
    for name in DIMS:
        keys, emb = _ckpt_table(own, name, DIMS[name])
        np.testing.assert_array_equal(out[name][0], keys)
        np.testing.assert_array_equal(out[name][1][:, :DIMS[name]], emb)
        assert out[name][3] == 2  # the two steps trained, restored with the table


def test_estimator_warm_start_with_graph_modifier_hook_equals_plain(tmp_path, ckpt):
    # The pipeline that sends ids ahead must start after the tables are loaded.
    a = ckpt(1)
    results = {}
    for modify in (False, True):
        dynemb.clear_tables()
        est = tf.estimator.Estimator(_est_model_fn(modify=modify), str(tmp_path / f"m{modify}"),
                                     warm_start_from=WS(a))
        est.train(_input_fn, hooks=[GraphModifierHook()] if modify else [])
        with tf.Graph().as_default(), tf.compat.v1.Session() as s:
            results[modify] = {n: s.run(list(dynemb._lib.ops.dynemb_export(table_name=n)))[1:3]
                               for n in DIMS}
    for n in DIMS:
        np.testing.assert_array_equal(results[True][n][0], results[False][n][0])
        np.testing.assert_allclose(results[True][n][1], results[False][n][1], rtol=1e-6)
    # Warm-started ids were trained (not replaced by fresh rows).
    keys_a = _ckpt_table(a, "item", 2)[0]
    assert set(keys_a) <= set(results[True]["item"][0])


def test_warm_start_from_a_checkpoint_on_a_remote_file_system(ckpt):
    # The same checkpoint copied to TensorFlow's in-memory file system (a
    # stand-in for hdfs:// or s3://) warm-starts the same tables and dense
    # variables (its sparse directory is read through a local mirror).
    from dynemb.core import remote
    a = ckpt(1)
    remote.upload(str(a), "ram://dynemb_ws/ckpt1")
    out = _sessrun_warm(WS("ram://dynemb_ws/ckpt1"))
    for name in DIMS:
        _assert_table_from(out, name, a)
    for v in DENSE:
        np.testing.assert_array_equal(out[v], _ckpt_dense(a, v), err_msg=v)
