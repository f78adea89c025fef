"""Run alone and under mpirun by tests/py/test_sharded_training.py: lookups
with serving_default_value tensors the graph computes (one per lookup). A
train lookup whose not-yet-admitted ids read a value computed from the ids,
an eval lookup of ids other ranks own (unknown ones read another computed
value), and, with EXPORT set, the SavedModel exported on every rank. Alone
and on N ranks (each with its slice of every global batch) they must give
the same rows. Results: $RESULTS/defaults-<rank>.json."""
import json
import os

import numpy as np
import tensorflow as tf

import dynemb
from common import rank_slice, start

rank, size = start()
B, STEPS, DIM = 8, 4, 2
rng = np.random.default_rng(3)
ids_all = rng.integers(0, 12, size=(STEPS * B, 2)).astype(np.int64)
y_all = rng.integers(0, 2, size=(STEPS * B, 1)).astype(np.float32)

table = dynemb.create_table(tf.int64, DIM, "sdv", tf.compat.v1.constant_initializer(0.5))
ds = tf.data.Dataset.from_tensor_slices({"ids": ids_all, "y": y_all}).batch(B)
batch = tf.compat.v1.data.make_one_shot_iterator(ds.map(rank_slice(rank, size))).get_next()
f = batch["ids"]
own = tf.cast(tf.reshape(f, [-1, 1]), tf.float32) * tf.constant([[1.0, 10.0]])
emb = dynemb.sparse_lookup(table, f, serving_default_value=own,
                           access_and_evict_config={"access_threshold": 2})
loss = tf.reduce_sum(tf.reshape(emb, [-1, 2 * DIM]) * batch["y"]) / tf.cast(batch["n"],
                                                                          tf.float32)
_, sparse = dynemb.get_dense_and_sparse_variable()
step = dynemb.optimizers.gradient_descent.create_hash_optimizer(0.1).apply_gradients(
    zip(tf.gradients(loss, sparse), sparse))
query = tf.compat.v1.placeholder(tf.int64, [None], name="query")
q = tf.cast(query, tf.float32)
read = dynemb.sparse_lookup(table, query, is_train=False, name="read",
                            serving_default_value=tf.stack([-q, q * q], axis=1))
probe = np.arange(16, dtype=np.int64)  # 12 .. 15: never seen

with tf.compat.v1.Session() as sess:
    outs = [sess.run([emb, loss, step])[:2] for _ in range(STEPS)]
    rows = sess.run(read, {query: probe}).tolist()
    if os.environ.get("EXPORT"):
        dynemb.export_saved_model(sess, os.environ["EXPORT"], {"query": query},
                                  {"rows": read})
with open(os.path.join(os.environ["RESULTS"], "defaults-%d.json" % rank), "w") as out:
    json.dump({"losses": [float(o[1]) for o in outs], "rows": rows,
               "emb": [o[0].tolist() for o in outs]}, out)
