"""Run alone and under mpirun by tests/py/test_sharded_training.py: the
schedule that would deadlock independent blocking exchanges. 12 tables with
2 train lookups each, an eval lookup per table in its own steps, one dense
all-reduce, 20 steps; TensorFlow runs the step on $INTER_OP inter-op threads
(1 is the hardest case: one blocked exchange holds the only thread), and
every lookup's ids pass through a random sleep of this rank's own, so each
rank reaches the step's ops in its own order. It must finish, and train as
one process does. Results: $RESULTS/stress-<rank>.json."""
import json
import os
import random
import time

import numpy as np
import tensorflow as tf

import dynemb
from dynemb.util.communication import hccl_ops

tf.compat.v1.disable_eager_execution()
dynemb.init()
rank, size = hccl_ops.get_rank_id(), hccl_ops.get_rank_size()
T, B, STEPS, DIM = 12, 6, 20, 2
lo, hi = rank * B // size, (rank + 1) * B // size
rng = np.random.default_rng(3)
data = rng.integers(0, 30, size=(STEPS, B, T, 2)).astype(np.int64)
chaos = random.Random(1000 + rank)


def jitter(ids):
    """ids, after a random pause of this rank's own (0-3 ms)."""
    def pause(x):
        time.sleep(chaos.random() * 0.003)
        return x
    out = tf.py_function(pause, [ids], tf.int64)
    out.set_shape(ids.shape)
    return out


ids = tf.compat.v1.placeholder(tf.int64, [None, T, 2])
tables = [dynemb.create_table(tf.int64, DIM, "s%d" % t,
                              tf.compat.v1.random_uniform_initializer(-0.1, 0.1, seed=t))
          for t in range(T)]
parts = []
for t, table in enumerate(tables):
    for j in range(2):
        parts.append(dynemb.sparse_lookup(table, jitter(ids[:, t, j]), name="f%d_%d" % (t, j)))
w = tf.compat.v1.get_variable("w", initializer=tf.ones([2 * T * DIM, 1]))
loss = tf.reduce_sum(tf.square(tf.matmul(tf.concat(parts, axis=1), w) - 1.0)) / B
grads = tf.gradients(loss, [w] + [t.anchor for t in tables])
step = tf.group(
    tf.compat.v1.train.GradientDescentOptimizer(0.05).apply_gradients(
        [(dynemb.allreduce_gradients(grads[:1], average=False)[0], w)]),
    dynemb.optimizers.adagrad.create_hash_optimizer(0.1, 0.1).apply_gradients(
        zip(grads[1:], [t.anchor for t in tables])))
every = tf.range(30, dtype=tf.int64)
reads = [dynemb.sparse_lookup(t, jitter(every), is_train=False, name="read") for t in tables]

threads = int(os.environ.get("INTER_OP", "1"))
config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads,
                                  intra_op_parallelism_threads=1)
losses = []
with tf.compat.v1.Session(config=config) as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    for s in range(STEPS):
        losses.append(float(sess.run([loss, step], {ids: data[s, lo:hi]})[0]))
        if s % 5 == 4:
            sess.run(reads)  # eval steps between train steps
    rows = [r.tolist() for r in sess.run(reads)]
with open(os.path.join(os.environ["RESULTS"], "stress-%d.json" % rank), "w") as f:
    json.dump({"losses": losses, "rows": rows}, f)
