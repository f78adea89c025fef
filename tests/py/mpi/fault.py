"""Run under mpirun by tests/py/test_sharded_faults.py: a one-table model
trained for 6 steps, in which rank 1 misbehaves at step 2 as $FAULT says:
  stall  stops taking part (stays alive, as a rank whose input stalls
         would), then exits after 60 s;
  exit   dies (os._exit(7)), as a killed process;
  raise  raises in its input (a batch of the wrong shape);
  send_count  every rank runs in static-shape mode with send_count = 2,
         below the unique ids it sends to an owner;
  short  runs out of data: ends its run normally after 2 steps;
  eval   runs out of data after 2 steps and goes on to an eval lookup
         while the others still train (the ranks run different exchanges);
  kill   (under mpirun --enable-recovery, which keeps the others running)
         kills itself with SIGKILL $KILL_AFTER seconds into a training of
         large batches, wherever it is (in a transfer, most likely); the
         others train until they fail;
  freeze as kill, but stops itself (SIGSTOP) instead: a hung host;
  train  every rank trains large batches for up to 60 s, and the test does
         the harm from outside (a host's link cut, tests/hosts/hosts.sh).
Every rank writes what happened to it into $RESULTS/<rank>.json, with its
pid and the time.time() of the event."""
import json
import os
import signal
import threading
import time

import numpy as np
import tensorflow as tf

import dynemb
from dynemb.util.communication import hccl_ops

tf.compat.v1.disable_eager_execution()
fault = os.environ["FAULT"]
dynemb.init(use_dynamic=fault != "send_count")
rank = hccl_ops.get_rank_id()
LONG = ("kill", "freeze", "train")  # faults in a long training of large batches
dim = 64 if fault in LONG else 4  # (parts above the eager size)
table = dynemb.create_table(tf.int64, dim, "t", tf.compat.v1.zeros_initializer())
ids = tf.compat.v1.placeholder(tf.int64, [None, 2])
emb = tf.reshape(dynemb.sparse_lookup(table, ids, send_count=2), [-1, 2 * dim])
evaluated = dynemb.sparse_lookup(table, ids, is_train=False, name="read")
w = tf.compat.v1.get_variable("w", initializer=tf.ones([2 * dim, 1]))
loss = tf.reduce_sum(tf.matmul(emb, w))
gw, gt = tf.gradients(loss, [w, table.anchor])
lr = 1e-6 if fault in LONG else 0.1  # (a long training stays finite)
train = tf.group(
    dynemb.optimizers.gradient_descent.create_hash_optimizer(lr).apply_gradients([(gt, table.anchor)]),
    tf.compat.v1.train.GradientDescentOptimizer(lr).apply_gradients(
        [(hccl_ops.allreduce(gw, "sum"), w)]))


def report(**what):
    with open(os.path.join(os.environ["RESULTS"], "%d.json" % rank), "w") as f:
        json.dump(dict(rank=rank, pid=os.getpid(), at=time.time(), **what), f)


def die_later():
    time.sleep(float(os.environ["KILL_AFTER"]))
    report(did="killed" if fault == "kill" else "froze")
    os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)


start = time.time()
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    step, mark = 0, None
    try:
        if fault in LONG:
            if rank == 1 and fault != "train":
                threading.Thread(target=die_later, daemon=True).start()
            else:
                report(did="started")  # (its pid, for the test's clean-up)
            rng = np.random.default_rng(rank)
            while time.time() - start < 60:
                sess.run(train, {ids: rng.integers(0, 1 << 20, (4096, 2))})
                step += 1
        for step in range(6 if fault not in LONG else 0):
            batch = np.arange(8).reshape(4, 2) + step
            if step == 2:
                mark = time.time()
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
                if fault == "eval":
                    report(did="evaluates")
                    sess.run(evaluated, {ids: batch})
                    break
                if fault == "raise":
                    batch = np.arange(9)  # not [n, 2]: the feed raises
            sess.run(train, {ids: batch})
        if not (rank == 1 and fault == "short"):
            report(did="finished", seconds=time.time() - start)
    except Exception as e:  # pylint: disable=broad-except
        report(did="failed", error="%s: %s" % (type(e).__name__, e),
               seconds=time.time() - start, step=step,
               after_step_2=None if mark is None else time.time() - mark)
        if fault in LONG:  # each survivor says why, none ends the others
            os._exit(3)
        raise
