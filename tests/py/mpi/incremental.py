"""Run under mpirun by tests/py/test_incremental_checkpoints.py: several
ranks train one sharded table (each its slice of every batch, with
admission and eviction), then save a full incremental checkpoint, train
on, save a delta, and a plain full save of the same moment; at that moment
each rank also exports the rows it holds (export_tables into live/rank-<r>:
what the checkpoint's parts must add up to). Argument: the directory for
the three checkpoints (each with one part per rank)."""
import os
import sys

import numpy as np
import tensorflow as tf

import dynemb
from dynemb.optimizers import adagrad

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import start  # noqa: E402

rank, size = start()
out = sys.argv[1]
opt = adagrad.create_hash_optimizer(0.2)
t = dynemb.create_table(tf.int64, 3, "inc", tf.compat.v1.random_uniform_initializer(
    -1, 1, seed=4), optimizer_list=[opt])
ids = tf.compat.v1.placeholder(tf.int64, [None])
gs = tf.compat.v1.train.get_or_create_global_step()
rows = dynemb.sparse_lookup(t, ids, access_and_evict_config={"access_threshold": 2,
                                                             "eviction_threshold": 3})
train = opt.minimize(tf.reduce_sum(rows ** 2), global_step=gs)
evict = dynemb.EvictHook(evict_enable=True, evict_time_interval=None,
                         evict_step_interval=10**9)
evict.begin()
rng = np.random.default_rng(7)
with tf.compat.v1.Session() as s:
    s.run(tf.compat.v1.global_variables_initializer())

    def steps(n):
        for _ in range(n):
            batch = rng.integers(0, 200, 40)
            s.run(train, {ids: batch[rank * 40 // size:(rank + 1) * 40 // size]})
    steps(4)
    dynemb.save_tables(os.path.join(out, "base"), [t], incremental=True)
    steps(3)
    evict.evict(s)
    steps(2)
    dynemb.save_tables(os.path.join(out, "delta"), [t], incremental=True)
    dynemb.save_tables(os.path.join(out, "full"), [t])
    dynemb.export_tables(os.path.join(out, "live", "rank-%d" % rank), [t])
