"""Run alone and under mpirun by tests/py/test_sharded_estimator.py:
Estimator train / evaluate / predict on several ranks, all with the same
model_dir. Training: each rank reads its slice of every global batch
(Dataset.shard), the loss is each rank's sum over its examples divided by
the global batch size, the dense gradients are summed by
DistributedOptimizer(average=False) and the tables' by their owners:
one process's update for the global batch. Checkpoints every 2 steps
(every rank's part of the tables, the dense variables once). Evaluate and
predict: every rank reads the whole eval set, so every rank's lookups need
rows that other ranks own. With MODIFY=1 the lookups use modify_graph=True
and every call gets GraphModifierHook (automatic graph modification).
Results: $RESULTS/est-<rank>.json. With EXPORT=<dir> (one process, after
a run of any rank count): no training; the model_dir's latest checkpoint
(every rank's part) is exported with export_saved_model under <dir>."""
import json
import os
import sys

import numpy as np
import tensorflow as tf

import dynemb
from dynemb.util.communication import hccl_ops

tf.compat.v1.disable_eager_execution()
dynemb.init()
rank, size = hccl_ops.get_rank_id(), hccl_ops.get_rank_size()
model_dir = sys.argv[1]
MODIFY = os.environ.get("MODIFY") == "1"
hooks = [dynemb.GraphModifierHook()] if MODIFY else []
B, STEPS, DIM = 12, 6, 4
rng = np.random.default_rng(5)
ids_all = rng.integers(0, 50, size=(STEPS * B, 3)).astype(np.int64)
y_all = rng.integers(0, 2, size=(STEPS * B, 1)).astype(np.float32)
eval_ids = rng.integers(0, 60, size=(20, 3)).astype(np.int64)  # (some never trained)
eval_y = rng.integers(0, 2, size=(20, 1)).astype(np.float32)


def train_input():
    ds = tf.data.Dataset.from_tensor_slices(({"ids": ids_all}, y_all)).batch(B)
    # each rank its slice of every global batch, in rank order
    return ds.unbatch().batch(B // size).shard(size, rank) if size > 1 else ds


def eval_input():
    return tf.data.Dataset.from_tensor_slices(({"ids": eval_ids}, eval_y)).batch(5)


def model_fn(features, labels, mode):
    table = dynemb.create_table(tf.int64, DIM, "est", tf.compat.v1.random_uniform_initializer(
        -0.3, 0.3, seed=2))
    train = mode == tf.estimator.ModeKeys.TRAIN
    emb = dynemb.sparse_lookup(table, features["ids"], is_train=train, name="ids",
                               modify_graph=MODIFY,
                               access_and_evict_config={"access_threshold": 2})
    w = tf.compat.v1.get_variable("w", initializer=tf.constant(
        np.linspace(-1, 1, 3 * DIM, dtype=np.float32)[:, None]))
    logits = tf.matmul(tf.reshape(emb, [-1, 3 * DIM]), w)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logit": logits})
    per_example = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
    if not train:
        return tf.estimator.EstimatorSpec(mode, loss=tf.reduce_mean(per_example))
    loss = tf.reduce_sum(per_example) / B
    gs = tf.compat.v1.train.get_or_create_global_step()
    dense = dynemb.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.5),
                                        average=False)
    sparse = dynemb.optimizers.gradient_descent.create_hash_optimizer(0.5)
    op = tf.group(dense.minimize(loss, var_list=[w], global_step=gs),
                  sparse.minimize(loss, var_list=[table.anchor]))
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=op)


config = tf.estimator.RunConfig(model_dir=model_dir, save_checkpoints_steps=2,
                                save_summary_steps=1000, log_step_count_steps=1000)
est = tf.estimator.Estimator(model_fn, config=config)
if os.environ.get("EXPORT"):
    def serving_input_fn():
        x = {"ids": tf.compat.v1.placeholder(tf.int64, [None, 3], name="ids")}
        return tf.estimator.export.ServingInputReceiver(x, x)
    est.export_saved_model(os.environ["EXPORT"], serving_input_fn)
    sys.exit(0)
est.train(train_input, steps=STEPS, hooks=hooks)
metrics = est.evaluate(eval_input, hooks=hooks)
logits = [p["logit"].tolist() for p in est.predict(eval_input, hooks=hooks)]
with open(os.path.join(os.environ["RESULTS"], "est-%d.json" % rank), "w") as f:
    json.dump({"loss": float(metrics["loss"]), "step": int(metrics["global_step"]),
               "logits": logits, "w": est.get_variable_value("w").tolist(),
               "checkpoints": sorted(os.listdir(model_dir))}, f)
