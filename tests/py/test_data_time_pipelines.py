"""Lookups of a table that counts data time (a timestamp in ASCEND_TIMESTAMP)
read the clock of their own batch, and eval lookups read none: a train and an
eval pipeline over the same table each deliver every batch they hold.

The reference is the data itself: the test counts the batches each iterator
delivers (a step counter that stops at OutOfRangeError) and the data time the
table's rows were stamped with."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.constants.constants import ASCEND_TIMESTAMP
from dynemb.core.embedding import create_table, sparse_lookup
from dynemb import _lib
from dynemb.optimizers import gradient_descent

TRAIN_BATCHES, EVAL_BATCHES, BATCH = 6, 4, 4


def _pipeline(first_id, batches, first_time):
    """An iterator over `batches` batches of ids and a per-sample timestamp."""
    n = batches * BATCH
    ids = np.arange(first_id, first_id + n, dtype=np.int64)
    ts = first_time + np.arange(n, dtype=np.int64) // BATCH * 10
    ds = tf.data.Dataset.from_tensor_slices({"ids": ids, "ts": ts}).batch(BATCH)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    return it, it.get_next()


def _model(eval_timestamp_first):
    """A train and an eval pipeline on one table; both timestamps in
    ASCEND_TIMESTAMP (in either order). Returns the iterators and fetches."""
    opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
    table = create_table(key_dtype=tf.int64, dim=2, name="dt",
                         emb_initializer=tf.compat.v1.constant_initializer(1.0),
                         optimizer_list=[opt])
    train_it, train_b = _pipeline(0, TRAIN_BATCHES, 1000)
    eval_it, eval_b = _pipeline(10_000, EVAL_BATCHES, 5000)
    stamps = [eval_b["ts"], train_b["ts"]] if eval_timestamp_first else \
        [train_b["ts"], eval_b["ts"]]
    for ts in stamps:
        tf.compat.v1.add_to_collection(ASCEND_TIMESTAMP, ts)
    emb = sparse_lookup(table, train_b["ids"], is_train=True,
                        access_and_evict_config={"access_threshold": 1,
                                                 "eviction_threshold": 1000})
    loss = tf.reduce_sum(emb)
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
    ev = sparse_lookup(table, eval_b["ids"], is_train=False)
    return train_it, eval_it, train, tf.reduce_sum(ev)


def _count(sess, fetch):
    n = 0
    while True:
        try:
            sess.run(fetch)
        except tf.errors.OutOfRangeError:
            return n
        n += 1


@pytest.mark.parametrize("eval_timestamp_first", [False, True])
def test_each_pipeline_delivers_all_its_batches(eval_timestamp_first):
    train_it, eval_it, train, ev = _model(eval_timestamp_first)
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        s.run([train_it.initializer, eval_it.initializer])
        trained = evaluated = 0
        # Interleaved as a train-and-evaluate loop runs them.
        for _ in range(TRAIN_BATCHES):
            s.run(train)
            trained += 1
            if evaluated < EVAL_BATCHES:
                s.run(ev)
                evaluated += 1
        assert _count(s, train) == 0, "the train pipeline had batches left"
        assert trained == TRAIN_BATCHES
        s.run(eval_it.initializer)
        assert _count(s, ev) == EVAL_BATCHES
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        _, keys, _, last_access = s.run(list(_lib.ops.dynemb_export(table_name="dt"))[:4])
    order = np.argsort(keys)
    keys, last_access = keys[order], last_access[order]
    # Every training id got a row, stamped with its own batch's data time;
    # eval ids got none.
    np.testing.assert_array_equal(keys, np.arange(TRAIN_BATCHES * BATCH))
    np.testing.assert_array_equal(last_access, 1000 + keys // BATCH * 10)
