"""Run alone and under mpirun by tests/py/test_sharded_training.py: an
mxRec-style sess.run script with automatic graph modification
(sparse_lookup(..., modify_graph=True), modify_graph_and_start_emb_cache(),
get_initializer) and admission. Alone, the rebuilt pipeline prepares each
batch ahead of the step; on N ranks the lookups exchange in the step and
each rank reads its slice of every global batch. Both must train the same:
losses, an eval pass over held-out ids (eval iterator), and every row; and
stamp every row with the same last access, the global step that trained its
batch (eviction by step is on, with a threshold no row reaches).
Results: $RESULTS/modify-<rank>.json."""
import json
import os

import numpy as np
import tensorflow as tf

import dynemb
from dynemb.graph.modifier import get_initializer, modify_graph_and_start_emb_cache
from common import rank_slice, start

rank, size = start(use_dynamic_expansion=True)
B, STEPS, DIM = 12, 5, 4
rng = np.random.default_rng(9)
ids_all = rng.integers(0, 40, size=(STEPS * B, 3)).astype(np.int64)
y_all = rng.integers(0, 2, size=(STEPS * B, 1)).astype(np.float32)
eval_ids = rng.integers(0, 50, size=(2 * B, 3)).astype(np.int64)


def sliced(ds):
    return ds.map(rank_slice(rank, size))


train_ds = sliced(tf.data.Dataset.from_tensor_slices({"ids": ids_all, "y": y_all}).batch(B))
eval_ds = sliced(tf.data.Dataset.from_tensor_slices(
    {"ids": eval_ids, "y": np.zeros([2 * B, 1], np.float32)}).batch(B))
train = tf.compat.v1.data.make_initializable_iterator(train_ds).get_next()
held = tf.compat.v1.data.make_initializable_iterator(eval_ds).get_next()

opt = dynemb.optimizers.lazy_adam.create_hash_optimizer(learning_rate=0.05)
table = dynemb.create_table(tf.int64, DIM, "m", tf.compat.v1.random_uniform_initializer(
    -0.2, 0.2, seed=4))
cfg = {"access_threshold": 2, "eviction_threshold": 1000}
global_step = tf.compat.v1.train.get_or_create_global_step()
w = tf.compat.v1.get_variable("w", initializer=tf.constant(
    np.linspace(-1, 1, 3 * DIM, dtype=np.float32)[:, None]))


def logits_of(batch, is_train):
    emb = dynemb.sparse_lookup(table, batch["ids"], is_train=is_train, modify_graph=True,
                               access_and_evict_config=cfg, name="ids")
    return tf.matmul(tf.reshape(emb, [-1, 3 * DIM]), w)


per_row = tf.nn.sigmoid_cross_entropy_with_logits(labels=train["y"],
                                                  logits=logits_of(train, True))
loss = tf.reduce_sum(per_row) / tf.cast(train["n"], tf.float32)
eval_logits = logits_of(held, False)
gw, gt = tf.gradients(loss, [w, table.anchor])
step = tf.group(
    tf.compat.v1.train.GradientDescentOptimizer(0.5).apply_gradients(
        zip(dynemb.allreduce_gradients([gw], average=False), [w]), global_step=global_step),
    opt.apply_gradients([(gt, table.anchor)]))
modify_graph_and_start_emb_cache()
read = dynemb.sparse_lookup(table, tf.range(50, dtype=tf.int64), is_train=False, name="read")

with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(get_initializer(True))
    losses = [float(sess.run([loss, step])[0]) for _ in range(STEPS)]
    sess.run(get_initializer(False))
    logits = [sess.run(eval_logits).tolist() for _ in range(2)]
    rows = sess.run(read).tolist()
    # (this rank's rows: key -> last access)
    _, keys, _, last_access = sess.run(list(dynemb._lib.ops.dynemb_export(table_name="m"))[:4])
with open(os.path.join(os.environ["RESULTS"], "modify-%d.json" % rank), "w") as f:
    json.dump({"losses": losses, "logits": logits, "rows": rows,
               "stamps": dict(zip(map(str, keys.tolist()), last_access.tolist()))}, f)
