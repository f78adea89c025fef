"""Feature admission (rare ids read the default value and are not trained)
and eviction by global step (EvictHook)."""
import numpy as np
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
        dynemb.ConfigInitializer.get_instance().host_pipeline_ops.set_threshold(1, emb_name=t.table_name)
        s.run(train, {ids: [1]})
        assert t.size() == 1


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
