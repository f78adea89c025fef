"""Run under mpirun by tests/py/test_sharded_faults.py: a one-table model
trained for 6 steps, in which rank 1 misbehaves at step 2 as $FAULT says:
  stall  stops taking part (stays alive, as a rank whose input ran dry
         would if it waited), then exits after 60 s;
  exit   dies (os._exit(7)), as a killed process;
  raise  raises in its input (a batch of the wrong shape);
  send_count  every rank runs in static-shape mode with send_count = 2,
         below the unique ids it sends to an owner;
  short  runs out of data: ends its run normally after 2 steps.
Every rank writes what happened to it into $RESULTS/<rank>.json."""
import json
import os
import time

import numpy as np
import tensorflow as tf

import dynemb
from dynemb.util.communication import hccl_ops

tf.compat.v1.disable_eager_execution()
fault = os.environ["FAULT"]
dynemb.init(use_dynamic=fault != "send_count")
rank = hccl_ops.get_rank_id()
table = dynemb.create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer())
ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
emb = tf.reshape(dynemb.sparse_lookup(table, ids, send_count=2), [-1, 8])
w = tf.compat.v1.get_variable("w", initializer=tf.ones([8, 1]))
loss = tf.reduce_sum(tf.matmul(emb, w))
gw, gt = tf.gradients(loss, [w, table.anchor])
train = tf.group(
    dynemb.optimizers.gradient_descent.create_hash_optimizer(0.1).apply_gradients([(gt, table.anchor)]),
    tf.compat.v1.train.GradientDescentOptimizer(0.1).apply_gradients(
        [(hccl_ops.allreduce(gw, "sum"), w)]))


def report(**what):
    with open(os.path.join(os.environ["RESULTS"], "%d.json" % rank), "w") as f:
        json.dump(dict(rank=rank, **what), f)


start = time.time()
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    try:
        for step in range(6):
            batch = np.arange(8).reshape(4, 2) + step
            if rank == 1 and step == 2:
                if fault == "stall":
                    report(did="stalled")
                    time.sleep(60)
                    os._exit(0)
                if fault == "exit":
                    report(did="exited")
                    os._exit(7)
                if fault == "short":
                    report(did="ran out of data")
                    break
                if fault == "raise":
                    batch = np.arange(9)  # not [n, 2]: the feed raises
            sess.run(train, {ids: batch})
        if not (rank == 1 and fault == "short"):
            report(did="finished", seconds=time.time() - start)
    except Exception as e:  # pylint: disable=broad-except
        report(did="failed", error="%s: %s" % (type(e).__name__, e),
               seconds=time.time() - start)
        raise
