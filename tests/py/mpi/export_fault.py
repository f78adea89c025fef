"""Run under mpirun by tests/py/test_serving.py: an export that fails on
rank 1 (its table was dropped) fails on every rank at once, with rank 1's
error, and the job trains on. Prints one line per rank: seconds taken,
the error, and whether the next step ran."""
import os
import sys
import time

import tensorflow as tf

import dynemb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import start  # noqa: E402

rank, size = start()
t = dynemb.create_table(tf.int64, 2, "t", tf.compat.v1.ones_initializer())
ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
rows = dynemb.sparse_lookup(t, ids, is_train=True)
with tf.compat.v1.Session() as s:
    s.run(rows, {ids: [1, 2, 3]})
    if rank == 1:
        dynemb.drop_table("t")  # (its export cannot read the table)
    t0 = time.time()
    try:
        dynemb.export_saved_model(s, sys.argv[1], {"ids": ids}, {"out": rows})
        error = "none"
    except Exception as e:  # pylint: disable=broad-except
        error = str(e).replace("\n", " ")
    took = time.time() - t0
    allgathered = dynemb.allgather_object(rank)  # (the job's exchange still works)
    print("RESULT rank=%d seconds=%.1f next=%s error=%s"
          % (rank, took, allgathered == list(range(size)), error), flush=True)
