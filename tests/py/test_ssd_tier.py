"""The SSD tier from the user API: create_table(..., host_vocabulary_size,
ssd_vocabulary_size, ssd_data_path) keeps that many rows in memory and the
rest in a file, and training gives exactly the numbers of the same model on
a table that keeps every row in memory (automatic graph modification, so
rows are brought back into memory in the input pipeline, ahead of the
step). The reference is the memory-only table; the engine's tier moves are
checked in tests/c/test_ssd.c and test_model.c. Checkpoints: save_tables /
restore_tables, and Saver / Estimator checkpoints, whose rows of tiered tables
go to <checkpoint>.dynemb (tests/py/test_saver.py has the Saver side)."""
import os

import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb import _lib
from dynemb.graph.modifier import get_initializer, modify_graph_and_start_emb_cache
from dynemb.optimizers import adagrad, lazy_adam
from estimator_models import cmp_model_fn
from table_export import export_sorted as _export

N, BATCH, STEPS = 240, 12, 20

def _train(ssd_dir, make_opt):
    """Losses, the exported table and its stats after STEPS steps; with
    ssd_dir, the table keeps 8 rows in memory (device 4 + host 4)."""
    tf.compat.v1.reset_default_graph()
    dynemb.clear_tables()
    dynemb.init(use_dynamic_expansion=ssd_dir is None)
    rng = np.random.RandomState(3)
    data = {"ids": rng.randint(0, 60, size=[N, 3]).astype(np.int64),
            "label": rng.randint(0, 2, size=[N]).astype(np.float32)}
    b = tf.compat.v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensor_slices(data).batch(BATCH)).get_next()
    opt = make_opt()
    tiers = ({} if ssd_dir is None else
             {"device_vocabulary_size": 4, "host_vocabulary_size": 4,
              "ssd_vocabulary_size": 1000, "ssd_data_path": [str(ssd_dir)]})
    t = dynemb.create_table(tf.int64, 4, "users",
                            tf.compat.v1.random_uniform_initializer(-0.5, 0.5, seed=1),
                            optimizer_list=[opt], **tiers)
    emb = dynemb.sparse_lookup(t, b["ids"] * 7919, modify_graph=True)
    logits = tf.reduce_sum(emb, axis=[1, 2])
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=b["label"],
                                                                  logits=logits))
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    modify_graph_and_start_emb_cache(prefetch=3)
    with tf.compat.v1.Session() as s:
        s.run(get_initializer(True))
        losses = [s.run([loss, train])[0] for _ in range(STEPS)]
    return np.array(losses), _export("users"), t.stats()


@pytest.mark.parametrize("make_opt", [
    lambda: adagrad.create_hash_optimizer(learning_rate=0.2),
    lambda: lazy_adam.create_hash_optimizer(learning_rate=0.05)], ids=["adagrad", "adam"])
def test_training_over_the_ssd_tier_matches_memory_only(tmp_path, make_opt):
    ref_losses, (ref_keys, ref_values), ref_stats = _train(None, make_opt)
    losses, (keys, values), stats = _train(tmp_path / "ssd", make_opt)
    np.testing.assert_array_equal(losses, ref_losses)
    np.testing.assert_array_equal(keys, ref_keys)
    np.testing.assert_array_equal(values, ref_values)
    assert stats["size"] == ref_stats["size"] == len(ref_keys) > 50
    assert stats["host_rows"] == 8 and stats["ssd_rows"] == stats["size"] - 8
    assert stats["ssd_reads"] > 100 and stats["ssd_writes"] > 100
    assert ref_stats["ssd_rows"] == ref_stats["ssd_reads"] == ref_stats["ssd_lookups"] == 0
    assert 0 < stats["ssd_lookups"] < stats["hits"]  # memory's misses as a cache
    assert (tmp_path / "ssd").is_dir()


def test_ssd_tier_errors(tmp_path):
    with pytest.raises(ValueError, match="rows in memory"):
        dynemb.create_table(tf.int64, 2, "t1", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=0, host_vocabulary_size=0,
                            ssd_vocabulary_size=10, ssd_data_path=str(tmp_path))
    # the engine's check of the size (and its message) reaches the user
    with pytest.raises(Exception, match="ssd_vocabulary_size.*limit"):
        dynemb.create_table(tf.int64, 2, "t2", tf.compat.v1.zeros_initializer(),
                            host_vocabulary_size=4, ssd_vocabulary_size=2**31,
                            ssd_data_path=str(tmp_path))


@pytest.mark.parametrize("path", [None, []], ids=["default", "empty_list"])
def test_ssd_data_path_defaults_to_the_working_directory(tmp_path, monkeypatch, path):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    kw = {} if path is None else {"ssd_data_path": path}
    t = dynemb.create_table(tf.int64, 2, "cwd", tf.compat.v1.zeros_initializer(),
                            host_vocabulary_size=2, ssd_vocabulary_size=10, **kw)
    with tf.compat.v1.Session() as s:
        s.run(dynemb.sparse_lookup(t, tf.constant(np.arange(8), tf.int64)))
    assert t.stats()["ssd_rows"] == 6


def test_full_tiers_name_both_sizes(tmp_path):
    t = dynemb.create_table(tf.int64, 2, "small", tf.compat.v1.zeros_initializer(),
                            device_vocabulary_size=2, host_vocabulary_size=2,
                            ssd_vocabulary_size=6, ssd_data_path=str(tmp_path))
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    out = dynemb.sparse_lookup(t, ids)
    with tf.compat.v1.Session() as s:
        s.run(out, {ids: np.arange(10)})  # 4 in memory + 6 on SSD: full
        with pytest.raises(tf.errors.OpError, match="ssd_vocabulary_size = 6"):
            s.run(out, {ids: [10]})
    st = t.stats()
    assert st["size"] == 10 and st["host_rows"] == 4 and st["ssd_rows"] == 6


def test_save_and_restore_tables_of_a_tiered_table(tmp_path):
    # dynemb.save_tables / restore_tables: the engine's own checkpoint, which
    # streams a tiered table's rows (no copy of the table in memory)
    t = dynemb.create_table(tf.int64, 4, "big", tf.compat.v1.random_normal_initializer(seed=3),
                            device_vocabulary_size=0, host_vocabulary_size=8,
                            ssd_vocabulary_size=1000, ssd_data_path=str(tmp_path / "ssd"),
                            optimizer_list=[lazy_adam.create_hash_optimizer(learning_rate=0.1)])
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = dynemb.sparse_lookup(t, ids)
    loss = tf.reduce_sum(tf.square(emb))
    _, sparse = dynemb.get_dense_and_sparse_variable()
    opt = t.optimizer
    train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    batches = [np.random.RandomState(i).randint(0, 200, size=16) for i in range(12)]
    with tf.compat.v1.Session() as s:
        for b in batches[:6]:
            s.run(train, {ids: b})
        assert dynemb.save_tables(str(tmp_path / "ckpt"), [t]) == ["big"]
        first = [s.run([loss, train], {ids: b})[0] for b in batches[6:]]
        rows_after = _export("big")
        assert t.stats()["ssd_rows"] > 20
        dynemb.restore_tables(str(tmp_path / "ckpt"))  # every table of the process
        again = [s.run([loss, train], {ids: b})[0] for b in batches[6:]]
        np.testing.assert_array_equal(first, again)
        for a, b in zip(rows_after, _export("big")):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(dynemb.DynembError, match="no table 'other'.*'big'"):
        dynemb.restore_tables(str(tmp_path / "ckpt"), ["big"], name_map={"big": "other"})
    with pytest.raises(dynemb.DynembError, match="'nope' does not exist"):
        dynemb.save_tables(str(tmp_path / "ckpt"), ["nope"])


def _est_input_fn():
    rng = np.random.default_rng(0)
    ids = (rng.integers(0, 60, size=(64, 3)) * 7919).astype(np.int64)
    y = (ids[:, :1] % 3 == 0).astype(np.float32)
    return tf.compat.v1.data.Dataset.from_tensor_slices(({"ids": ids}, y)).batch(16)


def test_estimator_checkpoints_a_tiered_table(tmp_path):
    # Estimator's checkpoints (Saver) hold the tiered table's rows in
    # <checkpoint>.dynemb; evaluation in a fresh process state restores them
    # and gives the loss of the same model kept in memory.
    evals = {}
    for tiered in (False, True):
        dynemb.clear_tables()
        model_dir = tmp_path / ("tiered" if tiered else "memory")
        tiers = ({"device_vocabulary_size": 0, "host_vocabulary_size": 10,
                  "ssd_vocabulary_size": 1000, "ssd_data_path": str(tmp_path / "ssd")}
                 if tiered else None)
        est = tf.estimator.Estimator(cmp_model_fn(name="est_tier", tiers=tiers),
                                     model_dir=str(model_dir))
        est.train(_est_input_fn, steps=4)
        dynemb.clear_tables()  # as a new process would start
        evals[tiered] = est.evaluate(_est_input_fn, steps=2)["loss"]
        if tiered:
            assert os.path.isfile(model_dir / "sparse-model.ckpt-4" / "MANIFEST")
            st = dynemb._lib.table_stats("est_tier")
            assert st["host_rows"] <= 10 and st["ssd_rows"] > 20
    assert evals[True] == evals[False]


@pytest.mark.parametrize("into_tiered", [False, True], ids=["into_memory", "into_tiered"])
def test_warm_start_from_a_tiered_checkpoint(tmp_path, into_tiered):
    # a Saver checkpoint of a tiered table (rows in <prefix>.dynemb) warm-starts
    # a table (renamed, tiered or not): the embeddings come back, the optimizer
    # slots start afresh, as warm start does for ordinary checkpoints
    tiers = {"host_vocabulary_size": 3, "device_vocabulary_size": 0,
             "ssd_vocabulary_size": 100, "ssd_data_path": str(tmp_path / "ssd")}
    opt = adagrad.create_hash_optimizer(learning_rate=0.5)
    t = dynemb.create_table(tf.int64, 2, "ws_src", tf.compat.v1.random_normal_initializer(seed=5),
                            optimizer_list=[opt], **tiers)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    out = dynemb.sparse_lookup(t, ids)
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(tf.reduce_sum(out), sparse), sparse))
    tf.compat.v1.train.get_or_create_global_step()
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        s.run(train, {ids: np.arange(12)})
        path = saver.save(s, str(tmp_path / "m"))
        keys, values = _export("ws_src")
    dynemb.clear_tables()
    with tf.Graph().as_default():
        dst = dynemb.create_table(
            tf.int64, 2, "ws_dst", tf.compat.v1.zeros_initializer(),
            optimizer_list=[adagrad.create_hash_optimizer(learning_rate=0.5)],
            **(dict(tiers, ssd_data_path=str(tmp_path / "ssd2")) if into_tiered else {}))
        tf.compat.v1.train.get_or_create_global_step()
        op = dynemb.warm_start(path, vars_to_warm_start="ws_dst",
                               var_name_to_prev_var_name={"ws_dst": "ws_src"})
        with tf.compat.v1.Session() as s:
            s.run(tf.compat.v1.global_variables_initializer())
            s.run(op)
        k2, v2 = _export("ws_dst")
        np.testing.assert_array_equal(k2, keys)
        np.testing.assert_array_equal(v2[:, :2], values[:, :2])  # embeddings
        assert not np.array_equal(v2[:, 2:], values[:, 2:])  # fresh Adagrad slots
        st = dst.stats()
        assert st["size"] == 12 and st["ssd_rows"] == (9 if into_tiered else 0)


def _tier_files(directory):
    """This process's open files in `directory` (the tier's anonymous ones)."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if os.path.dirname(target) == str(directory):
            out.append(target)
    return out


def test_ssd_data_path_list_is_filled_in_order(tmp_path):
    # mxRec: the directories are used one after the other (the next when a
    # disk is full: tests/c/test_ssd.c). Every table starts in the first
    # one; the others get a file only when needed.
    dirs = [tmp_path / "nvme0", tmp_path / "nvme1"]
    tables = [dynemb.create_table(tf.int64, 2, "inorder%d" % i, tf.compat.v1.zeros_initializer(),
                                  host_vocabulary_size=2, ssd_vocabulary_size=50,
                                  ssd_data_path=[str(d) for d in dirs]) for i in range(3)]
    with tf.compat.v1.Session() as s:
        for t in tables:
            s.run(dynemb.sparse_lookup(t, tf.constant(np.arange(20), tf.int64)))
    assert [t.stats()["ssd_rows"] for t in tables] == [18, 18, 18]
    assert len(_tier_files(dirs[0])) == 3 and _tier_files(dirs[1]) == []
    with pytest.raises(ValueError, match="newline"):
        dynemb.create_table(tf.int64, 2, "nl", tf.compat.v1.zeros_initializer(),
                            host_vocabulary_size=2, ssd_vocabulary_size=10,
                            ssd_data_path=[str(tmp_path) + "\nx"])
