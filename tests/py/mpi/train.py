"""A small two-table model trained with plain sparse lookups, run by
tests/py/test_sharded_training.py both alone (the reference: one process,
the whole global batch) and under `mpirun -np N` (each rank its slice of
the global batch: rows [r*B/N, (r+1)*B/N)).

Every step's global loss is the sum of the ranks' losses (each rank's loss
is its examples' cross-entropy divided by the GLOBAL batch size, so the
gradients summed over ranks are the one-process gradients). Dense variables
start from fixed values and their gradients are summed with
hccl_ops.allreduce. At the end each process writes, as JSON into
$RESULTS/<rank>.json: its losses, its dense variables and every row it
holds (a rank holds the keys it owns).

It trains once per sparse optimizer (SGD, Adagrad, lazy Adam, FTRL), each
in a graph of its own, and after training reads every id of the vocabulary
with an eval lookup (most of them owned by other ranks).

Argument: STEPS. Checkpoints (tf.compat.v1.train.Saver, into
$CKPT/<optimizer>/model-<step>): with SAVE_AT=k the run saves after step k
and trains on; with RESTORE_AT=k it restores the step-k checkpoint before
training and trains steps k+1..STEPS (written by any number of ranks); with
WARM=1 as well, it warm-starts from it instead (dynemb.warm_start: rows and
dense variables, fresh optimizer state).
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

import dynemb
from dynemb.util.communication import hccl_ops

tf.compat.v1.disable_eager_execution()
STEPS = int(sys.argv[1])
SAVE_AT, RESTORE_AT = int(os.environ.get("SAVE_AT", -1)), int(os.environ.get("RESTORE_AT", 0))
B, DIM, VOCAB = 12, 4, 40  # global batch, row width, id range

dynemb.init(use_mpi=True)
rank, size = hccl_ops.get_rank_id(), hccl_ops.get_rank_size()
lo, hi = rank * B // size, (rank + 1) * B // size

# The global batches, the same in every process: ids of three features
# (a, b share table "user", which has an SSD tier; c uses table "item"), and
# labels.
rng = np.random.default_rng(7)
data_a = rng.integers(0, VOCAB, size=(STEPS, B, 2))
data_b = rng.integers(0, VOCAB, size=(STEPS, B, 1))
data_c = rng.integers(0, VOCAB + VOCAB // 2, size=(STEPS, B, 3))
labels = rng.integers(0, 2, size=(STEPS, B, 1)).astype(np.float32)
# Feature d: one id per step for the whole batch, from table "solo": the
# ranks that own no key of a step still count the step (lazy Adam).
data_d = np.repeat(rng.integers(0, 3, size=(STEPS, 1, 1)), B, axis=1)
# Feature e: table "dp", replicated (is_dp=True): every rank holds all of it.
data_e = rng.integers(0, 20, size=(STEPS, B, 1))


OPTIMIZERS = {
    "sgd": lambda: dynemb.optimizers.gradient_descent.create_hash_optimizer(
        learning_rate=0.5),
    "adagrad": lambda: dynemb.optimizers.adagrad.create_hash_optimizer(
        learning_rate=0.3, initial_accumulator_value=0.1),
    "lazy_adam": lambda: dynemb.optimizers.lazy_adam.create_hash_optimizer(
        learning_rate=0.05),
    "ftrl": lambda: dynemb.optimizers.ftrl.create_hash_optimizer(
        learning_rate=0.2, l1_regularization_strength=0.001),
}


def train(kind):
    """Trains the model with sparse optimizer `kind`; what this rank saw."""
    init = tf.compat.v1.random_uniform_initializer(-0.2, 0.2, seed=3)
    # "user" keeps 8 rows in memory and the rest in an SSD tier file (each
    # rank its own, under $RESULTS/ssd)
    user = dynemb.create_table(tf.int64, DIM, "user_" + kind, init, host_vocabulary_size=8,
                               ssd_vocabulary_size=1000,
                               ssd_data_path=os.path.join(os.environ["RESULTS"], "ssd"))
    item = dynemb.create_table(tf.int64, DIM, "item_" + kind, init)
    solo = dynemb.create_table(tf.int64, DIM, "solo_" + kind, init)
    dp = dynemb.create_table(tf.int64, DIM, "dp_" + kind, init, is_dp=True)
    a = tf.compat.v1.placeholder(tf.int64, [None, 2])
    b = tf.compat.v1.placeholder(tf.int64, [None, 1])
    c = tf.compat.v1.placeholder(tf.int64, [None, 3])
    d = tf.compat.v1.placeholder(tf.int64, [None, 1])
    e = tf.compat.v1.placeholder(tf.int64, [None, 1])
    y = tf.compat.v1.placeholder(tf.float32, [None, 1])
    # (admission on the table with one lookup: one process runs two train
    # lookups of a table in either order, which decides which occurrence of
    # an id is its admitting one)
    admit = {"access_threshold": 2, "eviction_threshold": 2}  # (global steps)
    ea = dynemb.sparse_lookup(user, a, name="a")
    eb = dynemb.sparse_lookup(user, b, name="b")
    ec = dynemb.sparse_lookup(item, c, name="c", access_and_evict_config=admit)
    ed = dynemb.sparse_lookup(solo, d, name="d")
    ee = dynemb.sparse_lookup(dp, e, name="e", access_and_evict_config={
        "access_threshold": 2})
    x = tf.concat([tf.reshape(ea, [-1, 2 * DIM]), tf.reshape(eb, [-1, DIM]),
                   tf.reshape(ec, [-1, 3 * DIM]), tf.reshape(ed, [-1, DIM]),
                   tf.reshape(ee, [-1, DIM])], axis=1)
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(
        np.linspace(-0.5, 0.5, 8 * DIM, dtype=np.float32)[:, None]))
    bias = tf.compat.v1.get_variable("bias", initializer=tf.constant([0.1]))
    logits = tf.matmul(x, w) + bias
    loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(labels=y, logits=logits)) / B
    sparse_vars, dense_vars = [user.anchor, item.anchor, solo.anchor, dp.anchor], [w, bias]
    grads = tf.gradients(loss, sparse_vars + dense_vars)
    dense_grads = [hccl_ops.allreduce(g, "sum") for g in grads[4:]]
    global_step = tf.compat.v1.train.get_or_create_global_step()
    step = tf.group(
        OPTIMIZERS[kind]().apply_gradients(zip(grads[:4], sparse_vars)),
        tf.compat.v1.train.GradientDescentOptimizer(0.5).apply_gradients(
            zip(dense_grads, dense_vars), global_step=global_step))
    # Rows of "item" not seen for 2 global steps go (each rank its own).
    evict = dynemb.EvictHook(evict_enable=True, evict_time_interval=None)
    evict.begin()
    every_id = tf.range(VOCAB, dtype=tf.int64)
    read = [dynemb.sparse_lookup(t, every_id, is_train=False, name="read")
            for t in (user, item, solo, dp)]
    losses = []
    saver = tf.compat.v1.train.Saver()
    prefix = os.path.join(os.environ.get("CKPT", ""), kind, "model")
    warm = RESTORE_AT and os.environ.get("WARM") == "1"
    if warm:  # (part of the variables' initialization)
        dynemb.warm_start("%s-%d" % (prefix, RESTORE_AT))
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        if RESTORE_AT and not warm:
            saver.restore(sess, "%s-%d" % (prefix, RESTORE_AT))
        initial_rows = sum(t.size() for t in (user, item, solo))  # (this rank's)
        initial_dp_rows = dp.size()  # (all of them, on every rank)
        for s in range(RESTORE_AT, STEPS):
            if s == SAVE_AT:
                saver.save(sess, prefix, global_step=s)
            feed = {a: data_a[s, lo:hi], b: data_b[s, lo:hi], c: data_c[s, lo:hi],
                    d: data_d[s, lo:hi], e: data_e[s, lo:hi], y: labels[s, lo:hi]}
            value, _ = sess.run([loss, step], feed)
            losses.append(float(value))
            if s == 4:
                evict.evict(sess)
        dense = {v.op.name: sess.run(v).tolist() for v in dense_vars}
        eval_rows = [r.tolist() for r in sess.run(read)]
    out_dir = os.path.join(os.environ["RESULTS"], "rows-%d" % rank)
    names = [user.table_name, item.table_name, solo.table_name, dp.table_name]
    dynemb.export_tables(out_dir, names)
    rows = {}
    for t in names:
        keys = np.load(os.path.join(out_dir, t, "keys.npy"))
        values = np.load(os.path.join(out_dir, t, "embeddings.npy"))
        rows[t.split("_")[0]] = {str(int(k)): v.tolist() for k, v in zip(keys, values)}
    return {"losses": losses, "dense": dense, "rows": rows, "eval": eval_rows,
            "evicted": evict.evicted_total, "initial_rows": initial_rows,
            "initial_dp_rows": initial_dp_rows,
            "ssd_rows": user.stats()["ssd_rows"]}


results = {}
for kind in OPTIMIZERS:
    with tf.Graph().as_default():
        results[kind] = train(kind)
with open(os.path.join(os.environ["RESULTS"], "%d.json" % rank), "w") as f:
    # (local_size: the launch's processes on this rank's host, as Open MPI sees them)
    json.dump({"rank": rank, "size": size, "results": results,
               "local_size": int(os.environ.get("OMPI_COMM_WORLD_LOCAL_SIZE", 1))}, f)
