"""Run alone and under mpirun by tests/py/test_sharded_training.py: the
dense side of several ranks. Each rank initialises its dense variables from
a seed of its own; BroadcastGlobalVariablesHook gives them rank 0's values
(written out as "initial"). Then a model with one table and a dense layer
trains 4 steps with DistributedOptimizer (averaged dense gradients) and
sum_gradients_and_div_by_ranksize for the table, each rank on its slice of
the global batch with its loss the mean over its slice: the same update as
one process with the mean over the whole batch. Results go to
$RESULTS/dense-<rank>.json."""
import json
import os

import numpy as np
import tensorflow as tf

import dynemb
from dynemb.util.communication import hccl_ops

tf.compat.v1.disable_eager_execution()
dynemb.init()
rank, size = hccl_ops.get_rank_id(), hccl_ops.get_rank_size()
B = 12
lo, hi = rank * B // size, (rank + 1) * B // size
rng = np.random.default_rng(11)
ids_data = rng.integers(0, 30, size=(4, B, 2))
y_data = rng.normal(size=(4, B, 1)).astype(np.float32)

table = dynemb.create_table(tf.int64, 3, "emb", tf.compat.v1.random_normal_initializer(seed=1),
                            all2all_gradients_op="sum_gradients_and_div_by_ranksize")
ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
y = tf.compat.v1.placeholder(tf.float32, [None, 1])
x = tf.reshape(dynemb.sparse_lookup(table, ids), [-1, 6])
# a seed of this rank's own: only the broadcast makes the ranks agree
w = tf.compat.v1.get_variable(
    "w", [6, 1], initializer=tf.compat.v1.random_normal_initializer(seed=100 + rank))
loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - y))
dense_opt = dynemb.DistributedOptimizer(tf.compat.v1.train.AdamOptimizer(0.1))
sparse_opt = dynemb.optimizers.adagrad.create_hash_optimizer(0.2, 0.1)
train = tf.group(dense_opt.minimize(loss, var_list=[w]),
                 sparse_opt.minimize(loss, var_list=[table.anchor]))
read = dynemb.sparse_lookup(table, tf.range(30, dtype=tf.int64), is_train=False, name="read")
with tf.compat.v1.train.MonitoredSession(
        hooks=[dynemb.BroadcastGlobalVariablesHook()]) as sess:
    initial = sess.run(w).tolist()
    losses = [float(sess.run([loss, train], {ids: ids_data[s, lo:hi], y: y_data[s, lo:hi]})[0])
              for s in range(4)]
    final = sess.run(w).tolist()
    rows = sess.run(read).tolist()
with open(os.path.join(os.environ["RESULTS"], "dense-%d.json" % rank), "w") as f:
    json.dump({"initial": initial, "losses": losses, "final": final, "rows": rows}, f)
