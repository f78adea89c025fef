"""Which optimizer state a table restores (docs/checkpoint-format.md,
"Optimizer state on restore"): a graph that only reads a table (no sparse
optimizer applies to it: predict, eval, serving, as mxRec's little_demo
predicts) restores the rows whatever optimizer trained them, bit for bit; a
graph that trains the table gets the saved slots when its optimizer is the
one that trained it (and trains on as if never interrupted), and an error
naming the table, both optimizers and the fix when it is not. Through the
Saver, Estimator and restore_tables. A new process is simulated by
clear_tables() (the engine's tables go; the checkpoint stays)."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.optimizers import adagrad, ftrl, gradient_descent, lazy_adam

DIM, VOCAB = 3, 40
OPTIMIZERS = {
    "lazy_adam": lambda: lazy_adam.create_hash_optimizer(learning_rate=0.05),
    "ftrl": lambda: ftrl.create_hash_optimizer(learning_rate=0.2,
                                               l1_regularization_strength=0.001),
    "adagrad": lambda: adagrad.create_hash_optimizer(learning_rate=0.3),
    "sgd": lambda: gradient_descent.create_hash_optimizer(learning_rate=0.3),
}


def _batches(n, seed):
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, VOCAB, size=(8, 2)), rng.normal(size=8).astype(np.float32))
            for _ in range(n)]


def _graph(kind=None, listed=None):
    """A model on table "ro_t": trained by sparse optimizer `kind` (None: a
    graph that only reads the table; `listed`: the optimizer create_table is
    given, applied or not). Returns (table, ids, y, loss, train op or None,
    eval lookup of every id)."""
    opt = OPTIMIZERS[kind]() if kind else None
    given = opt if listed == kind and opt is not None else \
        OPTIMIZERS[listed]() if listed else None
    t = dynemb.create_table(tf.int64, DIM, "ro_t", tf.compat.v1.random_normal_initializer(
        stddev=0.2, seed=3), optimizer_list=[given] if given else None)
    ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
    y = tf.compat.v1.placeholder(tf.float32, [None])
    e = dynemb.sparse_lookup(t, ids, is_train=opt is not None)
    w = tf.compat.v1.get_variable("w", [DIM], initializer=tf.compat.v1.ones_initializer())
    loss = tf.reduce_mean(tf.square(tf.reduce_sum(tf.reduce_sum(e, 1) * w, 1) - y))
    gs = tf.compat.v1.train.get_or_create_global_step()
    train = None
    if opt is not None:
        dense, sparse = dynemb.get_dense_and_sparse_variable()
        train = tf.group(
            tf.compat.v1.train.GradientDescentOptimizer(0.05).minimize(loss, var_list=dense),
            opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse), global_step=gs))
    every = dynemb.sparse_lookup(t, tf.range(VOCAB, dtype=tf.int64), is_train=False,
                                 name="every_id")
    return t, ids, y, loss, train, every


def _train_and_save(tmp_path, kind, steps=6):
    """Trains with `kind` and saves (Saver, step `steps`); returns the
    checkpoint prefix, the training graph's own lookup of every id and its
    whole table (rows, slots, candidates, step count) at the save."""
    with tf.Graph().as_default():
        t, ids, y, _, train, every = _graph(kind, listed=kind)
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for a, b in _batches(steps, 1):
                s.run(train, {ids: a, y: b})
            path = saver.save(s, str(tmp_path / "model"), global_step=steps)
            return path, s.run(every), s.run(t.export_op())


def _same_state(got, want):
    for field, a, b in zip(want._fields, want, got):
        np.testing.assert_array_equal(b, a, err_msg=field)


@pytest.mark.parametrize("kind", ["lazy_adam", "ftrl"])
@pytest.mark.parametrize("listed", [None, "sgd"], ids=["no_optimizer", "sgd_listed"])
def test_a_reading_graph_restores_rows_of_any_optimizer(tmp_path, kind, listed):
    """A predict-only graph (create_table without an optimizer, or with SGD
    that it never applies) reads exactly the rows the training graph read,
    and holds the table exactly as saved (slots and step count too)."""
    path, want, state = _train_and_save(tmp_path, kind)
    dynemb.clear_tables()
    with tf.Graph().as_default():
        t, _, _, _, train, every = _graph(None, listed=listed)
        assert train is None
        with tf.compat.v1.Session() as s:
            tf.compat.v1.train.Saver().restore(s, path)
            np.testing.assert_array_equal(s.run(every), want)
            _same_state(s.run(t.export_op()), state)


def test_a_training_graph_with_another_optimizer_is_refused(tmp_path):
    """The error names the table, both optimizers, and both ways on; the
    table is left as it was (empty)."""
    path, _, _ = _train_and_save(tmp_path, "lazy_adam", steps=3)
    dynemb.clear_tables()
    with tf.Graph().as_default():
        t, _, _, _, _, _ = _graph("adagrad", listed="adagrad")
        with tf.compat.v1.Session() as s:
            with pytest.raises(dynemb.DynembError) as e:
                tf.compat.v1.train.Saver().restore(s, path)
        assert t.size() == 0
    msg = str(e.value)
    for part in ("'ro_t'", "trained with adam", "adagrad", "lazy_adam.create_hash_optimizer",
                 "embedding_only=True", "warm start"):
        assert part in msg, (part, msg)
    # the second way: embeddings only, fresh Adagrad state
    dynemb.clear_tables()
    with tf.Graph().as_default():
        t, _, _, _, _, _ = _graph("adagrad", listed="adagrad")
        dynemb.restore_tables(str(tmp_path / "sparse-model-3"), [t], embedding_only=True)
        assert t.size() > 0 and t.stats()["apply_steps"] == 3


def test_the_same_optimizer_trains_on_as_if_never_interrupted(tmp_path):
    """Saved at step 4 of 8 with lazy Adam: a new process first reads the
    table in a predict graph (which takes Adam's layout), then a training
    graph with lazy Adam restores and trains steps 5..8: its losses and
    final table equal those of the run that never stopped."""
    data = _batches(8, 2)
    with tf.Graph().as_default():
        t, ids, y, loss, train, _ = _graph("lazy_adam", listed="lazy_adam")
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for a, b in data[:4]:
                s.run(train, {ids: a, y: b})
            path = saver.save(s, str(tmp_path / "model"), global_step=4)
            straight = [s.run([train, loss], {ids: a, y: b})[1] for a, b in data[4:]]
            final = s.run(t.export_op())
    dynemb.clear_tables()
    with tf.Graph().as_default():
        _graph(None)
        with tf.compat.v1.Session() as s:
            tf.compat.v1.train.Saver().restore(s, path)
    with tf.Graph().as_default():
        t, ids, y, loss, train, _ = _graph("lazy_adam")  # (no optimizer_list)
        with tf.compat.v1.Session() as s:
            tf.compat.v1.train.Saver().restore(s, path)
            resumed = [s.run([train, loss], {ids: a, y: b})[1] for a, b in data[4:]]
            _same_state(s.run(t.export_op()), final)
    np.testing.assert_array_equal(resumed, straight)


def test_restore_tables_follows_the_same_rule(tmp_path):
    """restore_tables: into a table only read, the saved Adam rows; into
    one trained with SGD in its graph, the error."""
    with tf.Graph().as_default():
        t, ids, y, _, train, _ = _graph("lazy_adam", listed="lazy_adam")
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            for a, b in _batches(3, 3):
                s.run(train, {ids: a, y: b})
            state = s.run(t.export_op())
        dynemb.save_tables(str(tmp_path / "ck"), [t])
    dynemb.clear_tables()
    with tf.Graph().as_default():
        t, _, _, _, _, _ = _graph(None)
        dynemb.restore_tables(str(tmp_path / "ck"), [t])
        with tf.compat.v1.Session() as s:
            _same_state(s.run(t.export_op()), state)
    dynemb.clear_tables()
    with tf.Graph().as_default():
        t, _, _, _, _, _ = _graph("sgd")
        with pytest.raises(dynemb.DynembError, match="'ro_t' was trained with adam.*"
                           "GradientDescent \\(sgd state\\)"):
            dynemb.restore_tables(str(tmp_path / "ck"), ["ro_t"])


@pytest.mark.estimator
def test_estimator_predicts_with_a_model_fn_that_builds_no_optimizer(tmp_path):
    """Estimator trains with lazy Adam; a new process's Estimator.predict,
    whose model_fn builds no optimizer in PREDICT mode (and creates the table
    without one), returns the trained rows."""
    def model_fn(features, labels, mode):
        train = mode == tf.estimator.ModeKeys.TRAIN
        opt = lazy_adam.create_hash_optimizer(learning_rate=0.05) if train else None
        t = dynemb.create_table(tf.int64, DIM, "est_ro", tf.compat.v1.random_normal_initializer(
            stddev=0.2, seed=3), optimizer_list=[opt] if opt else None)
        e = dynemb.sparse_lookup(t, features["ids"], is_train=train)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"rows": e})
        loss = tf.reduce_mean(tf.square(tf.reduce_sum(e, [1, 2]) - labels))
        _, sparse = dynemb.get_dense_and_sparse_variable()
        op = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse),
                                 global_step=tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=op)

    batches = _batches(5, 4)

    def train_input():
        return tf.data.Dataset.from_tensor_slices(
            ({"ids": np.stack([a for a, _ in batches])}, np.stack([b for _, b in batches])))

    def predict_input():
        return tf.data.Dataset.from_tensor_slices(
            {"ids": np.arange(VOCAB, dtype=np.int64).reshape(-1, 2)}).batch(4)

    est = tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "m"))
    est.train(train_input, steps=5)
    dynemb.export_tables(str(tmp_path / "live"), ["est_ro"])  # the table after training
    keys = np.load(tmp_path / "live" / "est_ro" / "keys.npy")
    rows = np.load(tmp_path / "live" / "est_ro" / "embeddings.npy")
    assert len(keys) > 10
    dynemb.clear_tables()
    got = list(tf.estimator.Estimator(model_fn, model_dir=str(tmp_path / "m")).predict(
        predict_input))
    looked = np.concatenate([p["rows"] for p in got])  # ids 0..VOCAB-1, in order
    np.testing.assert_array_equal(looked[keys], rows)
