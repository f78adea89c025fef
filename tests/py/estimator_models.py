"""The small Estimator model the Estimator tests share: a dynemb table (Adagrad)
looked up with or without automatic graph modification, a dense layer trained by
plain SGD, and optionally the training losses recorded step by step."""
import tensorflow as tf

import dynemb
from dynemb.optimizers import adagrad


class RecordLoss(tf.compat.v1.train.SessionRunHook):
    def __init__(self, tensor, out):
        self.tensor, self.out = tensor, out

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self.tensor)

    def after_run(self, run_context, run_values):
        self.out.append(run_values.results)


def cmp_model_fn(modify=False, cfg=None, losses=None, name="cmp_t", tiers=None):
    """tiers: create_table's tier arguments (e.g. an SSD tier), or None."""
    def model_fn(features, labels, mode):
        opt = adagrad.create_hash_optimizer(learning_rate=0.1, initial_accumulator_value=0.1)
        t = dynemb.create_table(tf.int64, 4, name, tf.compat.v1.random_uniform_initializer(
            -0.05, 0.05, seed=2), optimizer_list=[opt], **(tiers or {}))
        is_train = mode == tf.estimator.ModeKeys.TRAIN
        e = dynemb.sparse_lookup(t, features["ids"] // 7, is_train=is_train, modify_graph=modify,
                                 access_and_evict_config=cfg)
        w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.ones_initializer())
        logits = tf.matmul(tf.reduce_sum(e, 1), w)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        if mode == tf.estimator.ModeKeys.EVAL:
            return tf.estimator.EstimatorSpec(mode, loss=loss)
        dense, sparse = dynemb.get_dense_and_sparse_variable()
        train_op = tf.group(
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense),
            opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse),
                                global_step=tf.compat.v1.train.get_global_step()))
        hooks = [RecordLoss(loss, losses)] if losses is not None else []
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                          training_hooks=hooks)
    return model_fn
