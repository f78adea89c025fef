"""Run alone and under mpirun by tests/py/test_sharded_training.py: an
mxRec-style sess.run script in FeatureSpec mode (FeatureSpec with
admission, two features of one table weighing their sightings differently
(faae_coefficient), get_asc_insert_func, sparse_lookup(table, spec, batch=...),
start_asc_pipeline). Alone, the dataset's insert function prepares each
batch ahead of the step; on N ranks the lookups exchange in the step and
each rank reads its slice of every global batch. Both must train the same.
Results: $RESULTS/featurespec-<rank>.json."""
import json
import os

import numpy as np
import tensorflow as tf

import dynemb
from dynemb.core.asc.helper import get_asc_insert_func
from dynemb.core.asc.manager import start_asc_pipeline
from common import rank_slice, start

rank, size = start(use_dynamic_expansion=True)
B, STEPS, DIM = 12, 5, 4
rng = np.random.default_rng(21)
ids_all = rng.integers(0, 40, size=(STEPS * B, 3)).astype(np.int64)
y_all = rng.integers(0, 2, size=(STEPS * B, 1)).astype(np.float32)

table = dynemb.create_table(tf.int64, DIM, "fs", tf.compat.v1.random_uniform_initializer(
    -0.2, 0.2, seed=6))
spec = dynemb.FeatureSpec("ids", table_name="fs", access_threshold=3)
spec2 = dynemb.FeatureSpec("ids2", table_name="fs", access_threshold=3,
                           faae_coefficient=2)


ds = tf.data.Dataset.from_tensor_slices({"ids": ids_all[:, :2], "ids2": ids_all[:, 2:],
                                         "y": y_all}).batch(B)
ds = ds.map(rank_slice(rank, size))
ds = ds.map(get_asc_insert_func(tgt_key_specs=[spec, spec2], is_training=True))
iterator = tf.compat.v1.data.make_initializable_iterator(ds)
batch = iterator.get_next()
emb = tf.concat([dynemb.sparse_lookup(table, spec, batch=batch),
                 dynemb.sparse_lookup(table, spec2, batch=batch)], axis=1)
w = tf.compat.v1.get_variable("w", initializer=tf.constant(
    np.linspace(-1, 1, 3 * DIM, dtype=np.float32)[:, None]))
logits = tf.matmul(tf.reshape(emb, [-1, 3 * DIM]), w)
loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
    labels=batch["y"], logits=logits)) / tf.cast(batch["n"], tf.float32)
gw, gt = tf.gradients(loss, [w, table.anchor])
step = tf.group(
    tf.compat.v1.train.GradientDescentOptimizer(0.5).apply_gradients(
        zip(dynemb.allreduce_gradients([gw], average=False), [w])),
    dynemb.optimizers.adagrad.create_hash_optimizer(0.3, 0.1).apply_gradients(
        [(gt, table.anchor)]))
start_asc_pipeline()
read = dynemb.sparse_lookup(table, tf.range(40, dtype=tf.int64), is_train=False, name="read")

with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(iterator.initializer)
    losses = [float(sess.run([loss, step])[0]) for _ in range(STEPS)]
    rows = sess.run(read).tolist()
with open(os.path.join(os.environ["RESULTS"], "featurespec-%d.json" % rank), "w") as f:
    json.dump({"losses": losses, "rows": rows}, f)
