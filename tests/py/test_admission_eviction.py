"""Feature admission (rare ids read the default value and are not trained)
and eviction by global step (EvictHook)."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.optimizers import gradient_descent


def _model(cfg, name="adm"):
    opt = gradient_descent.create_hash_optimizer(learning_rate=1.0)
    t = dynemb.create_table(tf.int64, 2, name, tf.compat.v1.constant_initializer(0.5),
                            optimizer_list=[opt])
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    gs = tf.compat.v1.train.get_or_create_global_step()
    e = dynemb.sparse_lookup(t, ids, access_and_evict_config=cfg)
    loss = tf.reduce_sum(e)
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse), global_step=gs)
    return t, ids, e, train


def test_admission_rare_ids_read_default_and_are_not_trained():
    t, ids, e, train = _model({"access_threshold": 3})
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        seen = []
        for _ in range(4):
            v, _ = s.run([e, train], {ids: [7, 8, 8]})
            seen.append(v)
        st = t.stats()
    # id 8 appears twice per step: admitted at its 3rd occurrence (step 2).
    # id 7: default value (zeros) at steps 1-2, admitted with its initial
    # value at step 3 and trained (SGD lr 1, grad 1) from then on.
    np.testing.assert_array_equal(seen[0], [[0, 0], [0, 0], [0, 0]])
    np.testing.assert_array_equal(seen[1][1:], [[0.5, 0.5], [0.5, 0.5]])
    np.testing.assert_array_equal(seen[1][0], [0, 0])
    np.testing.assert_array_equal(seen[2][0], [0.5, 0.5])
    np.testing.assert_array_equal(seen[3][0], [-0.5, -0.5])
    np.testing.assert_array_equal(seen[3][1], [0.5 - 2 * 2, 0.5 - 2 * 2])
    assert st["size"] == 2 and st["dropped_gradients"] > 0 and st["rejected"] > 0


def test_set_threshold_at_run_time():
    t, ids, e, train = _model({"access_threshold": 5})
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        s.run(train, {ids: [1]})
        assert t.size() == 0
        ops = dynemb.ConfigInitializer.get_instance().host_pipeline_ops
        op = ops.set_threshold(1, emb_name=t.table_name)   # mxRec: an op to run
        s.run(train, {ids: [1]})
        assert t.size() == 0
        s.run(op)
        s.run(train, {ids: [1]})
        assert t.size() == 1
        # by FeatureSpec name (ids_name), as mxRec scripts call it
        dynemb.FeatureSpec("feat_for_threshold", table_name=t.table_name)
        s.run(ops.set_threshold(9, ids_name="feat_for_threshold"))
        # mxRec's little demo: a tensor, the table and its lookup's name
        s.run(ops.set_threshold(tf.constant(9), emb_name=t.table_name,
                                ids_name=t.table_name + "_lookup"))
        s.run(train, {ids: [2]})
        assert t.size() == 1  # id 2 now needs 9 sightings
        with pytest.raises(ValueError, match="no_such_feature"):
            dynemb.ConfigInitializer.get_instance().host_pipeline_ops.set_threshold(
                1, ids_name="no_such_feature")


def test_eviction_by_global_step_with_evict_hook():
    t, ids, e, train = _model({"eviction_threshold": 2}, name="evi")
    hook = dynemb.EvictHook(evict_enable=True, evict_step_interval=1, evict_time_interval=None)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as s:
        s.run(train, {ids: [1, 2]})          # step 0: both rows stamped 0
        assert t.size() == 2
        for _ in range(4):                   # steps 1..4: only id 1
            s.run(train, {ids: [1]})
        st = t.stats()
    assert st["size"] == 1 and st["evicted"] == 1
    with tf.compat.v1.Session() as s:      # the evicted id reads its initial value again
        s.run(tf.compat.v1.global_variables_initializer())
        np.testing.assert_array_equal(s.run(e, {ids: [2]}), [[0.5, 0.5]])


# --------------------------------------------------------------------------
# EvictHook triggers and clocks (no sleeps: injectable clocks)
# --------------------------------------------------------------------------

class _Clock:
    def __init__(self, t):
        self.t = float(t)

    def __call__(self):
        return self.t


def _gs_model(cfg, name="ev", init=None, dim=2):
    """A table trained with SGD on loss = sum(emb); ids fed per step."""
    opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
    t = dynemb.create_table(tf.int64, dim, name,
                            init or tf.compat.v1.constant_initializer(0.5), optimizer_list=[opt])
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    gs = tf.compat.v1.train.get_or_create_global_step()
    e = dynemb.sparse_lookup(t, ids, access_and_evict_config=cfg)
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(tf.reduce_sum(e), sparse), sparse),
                                global_step=gs)
    return t, ids, e, train


def _keys(name):
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        return sorted(s.run(dynemb._lib.ops.dynemb_export(table_name=name))[1].tolist())


def test_eviction_by_time_interval_with_an_injected_clock():
    t, ids, _, train = _gs_model({"eviction_threshold": 2})
    clock = _Clock(1000)
    hook = dynemb.EvictHook(evict_enable=True, evict_time_interval=60, evict_step_interval=None,
                            clock=clock)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as s:
        s.run(train, {ids: [1, 2]})            # step 0: both stamped 0
        for _ in range(4):                     # id 2 is old, but no time has passed
            clock.t += 10
            s.run(train, {ids: [1]})
        assert _keys("ev") == [1, 2] and hook.evicted_total == 0
        clock.t += 30                          # 70 s since the session started
        s.run(train, {ids: [1]})
        assert _keys("ev") == [1] and hook.evicted_total == 1
        clock.t += 59                          # not yet 60 s since the last eviction
        s.run(train, {ids: [3]})
        s.run(train, {ids: [1]})
        s.run(train, {ids: [1]})
        s.run(train, {ids: [1]})
        assert _keys("ev") == [1, 3]
    assert t.stats()["evicted"] == 1


def test_disabled_hook_does_not_evict():
    t, ids, _, train = _gs_model({"eviction_threshold": 1})
    hook = dynemb.EvictHook(evict_enable=False, evict_step_interval=1)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as s:
        s.run(train, {ids: [1, 2]})
        for _ in range(4):
            s.run(train, {ids: [1]})
    assert t.size() == 2


def test_wall_clock_table(monkeypatch):
    # Lookups stamp dynemb.core.lookup.wall_time(); EvictHook evicts with its clock.
    from dynemb.core import lookup
    wall = tf.compat.v1.placeholder(tf.int64, [], name="wall")
    monkeypatch.setattr(lookup, "wall_time", lambda: wall)
    t, ids, _, train = _gs_model({"eviction_threshold": 100, "eviction_clock": "wall"})
    clock = _Clock(0)
    hook = dynemb.EvictHook(evict_enable=True, evict_time_interval=1, clock=clock)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as s:
        for now, batch, want in ((1000, [1, 2], [1, 2]), (1050, [1], [1, 2]),
                                 (1100, [1], [1, 2]), (1101, [1], [1])):
            clock.t = now
            s.run(train, {ids: batch, wall: now})
            assert _keys("ev") == want, now   # id 2 (stamp 1000) goes at 1101 > 1000 + 100


@pytest.mark.parametrize("how", ["lookup", "feature_spec"])
def test_eviction_threshold_zero_evicts_what_was_not_seen_at_the_eviction(monkeypatch, how):
    # mxRec: an eviction_threshold >= 0 turns eviction on, so 0 removes every
    # row not accessed at the eviction's time; None and -1 are off.
    from dynemb.core import lookup
    wall = tf.compat.v1.placeholder(tf.int64, [], name="wall")
    monkeypatch.setattr(lookup, "wall_time", lambda: wall)
    cfg = {"eviction_threshold": 0, "eviction_clock": "wall"}
    if how == "feature_spec":  # (the FeatureSpec's config, as sparse_lookup reads it)
        spec = dynemb.FeatureSpec("zero", table_name="ev", access_threshold=1,
                                  eviction_threshold=0)
        cfg = dict(spec.access_and_evict_config, eviction_clock="wall")
        assert spec.access_and_evict_config["eviction_threshold"] == 0
    t, ids, _, train = _gs_model(cfg)
    clock = _Clock(0)
    hook = dynemb.EvictHook(evict_enable=True, evict_time_interval=1, clock=clock)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as s:
        for now, batch, want in ((1000, [1, 2], [1, 2]), (1000, [3], [1, 2, 3]),
                                 (1001, [1], [1]), (1003, [2, 4], [2, 4])):
            clock.t = now
            s.run(train, {ids: batch, wall: now})
            assert _keys("ev") == want, now
    for off in (None, -1):
        assert dynemb.FeatureSpec("off", table_name="x", access_threshold=1,
                                  eviction_threshold=off).access_and_evict_config[
                                      "eviction_threshold"] is None


def test_data_time_eviction_plain_lookups():
    # A timestamp tensor in ASCEND_TIMESTAMP: thresholds count data seconds.
    ts = tf.compat.v1.placeholder(tf.int64, [None])
    tf.compat.v1.add_to_collection(dynemb.core.embedding.ASCEND_TIMESTAMP, ts)
    t, ids, _, train = _gs_model({"eviction_threshold": 20})
    hook = dynemb.EvictHook(evict_enable=True, evict_step_interval=1)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as s:
        for stamp, batch, want in ((100, [1, 2], [1, 2]), (105, [1], [1, 2]),
                                   (120, [1, 3], [1, 2, 3]), (121, [3], [1, 3]),
                                   (141, [3], [3]), (142, [4], [3, 4])):
            s.run(train, {ids: batch, ts: [stamp, stamp - 1]})
            assert _keys("ev") == want, stamp


def test_evicted_ids_come_back_with_their_initial_value():
    # The engine's initializer is a pure function of (seed, key): an evicted id
    # seen again gets the value it had the first time, not its trained value.
    init = tf.compat.v1.random_uniform_initializer(-1, 1, seed=5)
    t, ids, e, train = _gs_model({"eviction_threshold": 1}, init=init, dim=4)
    hook = dynemb.EvictHook(evict_enable=True, evict_step_interval=1)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as s:
        first, _ = s.run([e, train], {ids: [7, 8]})    # rows read before the update
        trained, _ = s.run([e, train], {ids: [7, 8]})
        s.run(train, {ids: [8]})
        s.run(train, {ids: [8]})                        # 7 evicted
        assert _keys("ev") == [8]
        again, _ = s.run([e, train], {ids: [7, 8]})
    np.testing.assert_allclose(trained, first - 0.1, rtol=1e-6)  # SGD, grad 1
    np.testing.assert_array_equal(again[0], first[0])              # fresh initial value
    np.testing.assert_allclose(again[1], first[1] - 0.4, rtol=1e-5)  # 8 kept training
    assert len(np.unique(first[0])) == 4  # a random row, not a constant


def _restore_run(ckpt_dir, steps, batches):
    """Trains with MonitoredTrainingSession (restoring ckpt_dir if it holds a
    checkpoint); returns the keys after each step."""
    tf.compat.v1.reset_default_graph()
    _, ids, _, train = _gs_model({"eviction_threshold": 4})
    hook = dynemb.EvictHook(evict_enable=True, evict_step_interval=1)
    keys = []
    with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=ckpt_dir, hooks=[hook], save_checkpoint_steps=1000,
            save_checkpoint_secs=None, save_summaries_steps=None,
            log_step_count_steps=None) as s:
        for b in batches[:steps]:
            s.run(train, {ids: b})
            keys.append(_keys("ev"))
    return keys


def test_eviction_after_restore_uses_last_access_from_the_checkpoint(tmp_path):
    # id 2 is last seen at step 1, so it goes at the evict after step 6 (the
    # step that ran: 6 > 1 + 4), whether or not the run was restored between.
    batches = [[1, 2], [2, 1]] + [[1]] * 6
    straight = _restore_run(None, 8, batches)
    assert straight[5] == [1, 2] and straight[6] == [1]
    dynemb.clear_tables()
    first = _restore_run(str(tmp_path), 3, batches)          # saves at step 3 on close
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("-3")
    dynemb.clear_tables()                                   # a new process: no table
    second = _restore_run(str(tmp_path), 5, batches[3:])    # restores step 3
    assert first + second == straight


def test_data_time_eviction_feature_spec_mode():
    from dynemb.core.asc.feature_spec import FeatureSpec
    from dynemb.core.asc.helper import get_asc_insert_func
    stamps = [100, 105, 120, 121, 141, 142]
    batches = [[1, 2], [1, 1], [1, 3], [3, 3], [3, 3], [4, 4]]
    ds = tf.data.Dataset.from_tensor_slices(
        {"user": np.array(batches, np.int64), "ts": np.array(stamps, np.int64)}).batch(1)
    specs = [FeatureSpec("user", table_name="ev", eviction_threshold=20),
             FeatureSpec("ts", is_timestamp=True)]
    b = tf.compat.v1.data.make_one_shot_iterator(
        ds.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True))).get_next()
    opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
    t = dynemb.create_table(tf.int64, 2, "ev", tf.compat.v1.constant_initializer(0.5),
                            optimizer_list=[opt])
    gs = tf.compat.v1.train.get_or_create_global_step()
    e = dynemb.sparse_lookup(t, specs[0], batch=b)
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(tf.reduce_sum(e), sparse), sparse),
                                global_step=gs)
    hooks = [dynemb.GraphModifierHook(modify_graph=False),
             dynemb.EvictHook(evict_enable=True, evict_step_interval=1)]
    with tf.compat.v1.train.SingularMonitoredSession(hooks=hooks) as s:
        for _ in stamps:
            s.run(train)
    # As with plain lookups: 2 (last seen at 100) goes at 121, 1 (at 120) at 141.
    assert _keys("ev") == [3, 4]
    assert t.stats()["evicted"] == 2


@pytest.mark.parametrize("weight, threshold, admitted_at", [(4, 6, 2), (3, 6, 2), (2, 6, 3),
                                                            (1, 6, 6), (10, 6, 1)])
def test_faae_coefficient_weighs_each_sighting(weight, threshold, admitted_at):
    # mxRec's weighted admission: a key is admitted once its sightings times
    # faae_coefficient reach access_threshold. The reference: that rule.
    t = dynemb.create_table(tf.int64, 2, "faae", tf.compat.v1.ones_initializer())
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    out = dynemb.sparse_lookup(t, ids, access_and_evict_config={
        "access_threshold": threshold, "faae_coefficient": weight})
    with tf.compat.v1.Session() as s:
        for sighting in range(1, 8):
            row = s.run(out, {ids: [5]})[0]
            assert bool(row[0] == 1.0) == (sighting * weight >= threshold), sighting
    assert min(s for s in range(1, 8) if s * weight >= threshold) == admitted_at


def _weighed_reference(batches, weights, threshold):
    """The keys a table admits when each sighting of feature f weighs
    weights[f] (mxRec's faae_coefficient) and a key needs `threshold`."""
    count, admitted = {}, set()
    for batch in batches:
        for f, ids in enumerate(batch):
            for k in ids.reshape(-1).tolist():
                if k not in admitted:
                    count[k] = count.get(k, 0) + weights[f]
                    if count[k] >= threshold:
                        admitted.add(k)
    return sorted(admitted)


@pytest.mark.parametrize("mode", ["plain", "feature_spec", "modify_graph"])
def test_features_of_one_table_weigh_their_sightings_each_by_its_coefficient(mode):
    # Two features share a table: "a" with faae_coefficient 1, "b" with 3,
    # access_threshold 4. A key is admitted once the sum of its sightings'
    # weights, in either feature, reaches 4 (the reference above).
    from dynemb.core.asc.helper import get_asc_insert_func
    from dynemb.core.asc.manager import start_asc_pipeline
    rng = np.random.default_rng(5)
    steps, weights, threshold = 6, (1, 3), 4
    a_all = rng.integers(0, 30, size=(steps, 8, 2)).astype(np.int64)
    b_all = rng.integers(20, 50, size=(steps, 8, 1)).astype(np.int64)
    batches = list(zip(a_all, b_all))
    want = _weighed_reference(batches, weights, threshold)
    assert want != _weighed_reference(batches, (1, 1), threshold)  # the weights matter
    assert want != _weighed_reference(batches, (3, 3), threshold)
    t = dynemb.create_table(tf.int64, 2, "weighed_" + mode, tf.compat.v1.ones_initializer())
    cfg = [{"access_threshold": threshold, "faae_coefficient": w} for w in weights]
    ds = tf.data.Dataset.from_tensor_slices({"a": a_all, "b": b_all})
    if mode == "plain":
        a = tf.compat.v1.placeholder(tf.int64, [None, 2])
        b = tf.compat.v1.placeholder(tf.int64, [None, 1])
        outs = [dynemb.sparse_lookup(t, x, access_and_evict_config=c)
                for x, c in zip((a, b), cfg)]
        feeds = [{a: x, b: y} for x, y in batches]
    elif mode == "feature_spec":
        specs = [dynemb.FeatureSpec(f, table_name=t.table_name, access_threshold=threshold,
                                    faae_coefficient=w) for f, w in zip("ab", weights)]
        ds = ds.map(get_asc_insert_func(tgt_key_specs=specs, is_training=True))
        batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        outs = [dynemb.sparse_lookup(t, s, batch=batch) for s in specs]
        start_asc_pipeline()
        feeds = [None] * steps
    else:
        batch = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        outs = [dynemb.sparse_lookup(t, batch[f], access_and_evict_config=c, modify_graph=True)
                for f, c in zip("ab", cfg)]
        dynemb.modify_graph_and_start_emb_cache()
        feeds = [None] * steps
    with tf.compat.v1.Session() as s:
        for feed in feeds:
            s.run(outs, feed)
    assert _keys(t.table_name) == want


def test_eviction_threshold_zero_by_global_step_keeps_the_last_steps_rows():
    # The step clock: a row survives eviction_threshold steps that do not see
    # it; with 0, an eviction after each step keeps only that step's rows.
    t, ids, _, train = _gs_model({"eviction_threshold": 0})
    hook = dynemb.EvictHook(evict_enable=True, evict_step_interval=1, evict_time_interval=None)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as s:
        for batch in ([1, 2], [2, 3], [3], [4, 1]):
            s.run(train, {ids: batch})
            assert _keys("ev") == sorted(set(batch)), batch


@pytest.mark.parametrize("threshold", [0, 1])
def test_step_clock_eviction_counts_from_the_batches_the_pipeline_prepared(threshold):
    # Graph modification prepares batches ahead, stamping their rows with the
    # step it reads then; eviction counts from the latest batch a step
    # trained, so the rows a step trains are never evicted before or right
    # after it (before, a threshold of 0 or 1 evicted them), and old ones go.
    from dynemb.graph.modifier import modify_graph_and_start_emb_cache
    steps = 6
    data = np.array([[10 * k, 10 * k + 1] for k in range(steps)], np.int64)
    opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
    t = dynemb.create_table(tf.int64, 2, "lag", tf.compat.v1.constant_initializer(0.5),
                            optimizer_list=[opt])
    gs = tf.compat.v1.train.get_or_create_global_step()
    batch = tf.compat.v1.data.make_one_shot_iterator(
        tf.data.Dataset.from_tensor_slices(data).batch(1)).get_next()
    e = dynemb.sparse_lookup(t, batch, modify_graph=True,
                             access_and_evict_config={"eviction_threshold": threshold})
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(tf.reduce_sum(e), sparse), sparse),
                                global_step=gs)
    modify_graph_and_start_emb_cache(prefetch=2)
    hook = dynemb.EvictHook(evict_enable=True, evict_step_interval=1, evict_time_interval=None)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as s:
        for k in range(steps):
            rows, _ = s.run([e, train])
            np.testing.assert_array_equal(rows.reshape(-1, 2), 0.5, err_msg=str(k))
            keys = set(_keys("lag"))
            assert {10 * k, 10 * k + 1} <= keys, (k, keys)       # trained, kept
    assert not {0, 1} & set(_keys("lag"))                       # idle long enough: gone
    assert t.stats()["evicted"] > 0
