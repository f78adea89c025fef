"""The Criteo Wide & Deep model shared by the demos (criteo_demo.py: sess.run,
criteo_estimator.py: Estimator).

One dynamic table per categorical field (C1..C26) feeds the deep part; the raw
32-bit hash values are the ids (no vocabulary, no modulo): tables start empty and
grow as ids arrive. A "wide" table holds one weight per (field, id). Lookups use
``modify_graph=True``: automatic graph modification sends each batch's ids to the
engine in the input pipeline (modify_graph_and_start_emb_cache() in sess.run
scripts, GraphModifierHook with an Estimator).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
import tensorflow as tf

import criteo_data
import dynemb
from dynemb.optimizers import adagrad

Tables = Dict[str, Any]


def sparse_optimizer() -> Any:
    return adagrad.create_hash_optimizer(learning_rate=0.05, initial_accumulator_value=0.1)


def create_tables(dim: int, seed: int, sparse_opt: Any, ssd_dir: Optional[str] = None,
                  memory_rows: int = 0) -> Tuple[Tables, Any]:
    """The 26 deep tables (width `dim`) and the wide table (width 1), in the
    default graph. Calling it again in another graph (Estimator) reuses them.
    With `ssd_dir`, each table keeps `memory_rows` rows in memory and the rest
    in an SSD tier file there (docs/ssd-tier.md)."""
    tiers = ({} if ssd_dir is None else
             {"device_vocabulary_size": 0, "host_vocabulary_size": memory_rows,
              "ssd_vocabulary_size": 1 << 24, "ssd_data_path": ssd_dir})
    tables = {name: dynemb.create_table(
        tf.int64, dim, name,
        tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=seed * 100 + i),
        optimizer_list=[sparse_opt], **tiers) for i, name in enumerate(criteo_data.CAT_NAMES)}
    wide = dynemb.create_table(tf.int64, 1, "wide", tf.compat.v1.zeros_initializer(),
                               optimizer_list=[sparse_opt], **tiers)
    return tables, wide


def build_model(features: Dict[str, tf.Tensor], label: Optional[tf.Tensor], tables: Tables,
                wide: Any, is_train: bool, access_cfg: Optional[dict],
                seed: int, modify_graph: bool = True) -> Tuple[tf.Tensor, Optional[tf.Tensor]]:
    """Wide & Deep probabilities and loss (None without a label) for one batch;
    the dense variables are shared between calls in one graph. The loss is
    the batch's mean, or with features["global_rows"] (several ranks, each
    on a slice of the global batch) the slice's sum divided by the global
    batch's rows: summed over ranks, the global batch's mean. modify_graph:
    the lookups' (False for a head on placeholders, such as a serving head:
    only ids from a tf.data pipeline are prepared ahead)."""
    deep = []
    for name in criteo_data.CAT_NAMES:
        emb = dynemb.sparse_lookup(tables[name], features[name], is_train=is_train,
                                   modify_graph=modify_graph, access_and_evict_config=access_cfg,
                                   name=f"{name}_lookup")
        deep.append(emb)
    # The wide table is shared by all fields: a field-aware id keeps the fields
    # apart (the raw ids are < 2^33, the field index goes above).
    field_ids = tf.stack([features[name] + (i << 33)
                          for i, name in enumerate(criteo_data.CAT_NAMES)], axis=1)
    wide_w = dynemb.sparse_lookup(wide, field_ids, is_train=is_train, modify_graph=modify_graph,
                                  access_and_evict_config=access_cfg, name="wide_lookup")
    with tf.compat.v1.variable_scope("dense", reuse=tf.compat.v1.AUTO_REUSE):
        x = tf.concat(deep + [features["dense"]], axis=1)

        def init(i):  # explicit seeds: Keras' default initializers ignore the graph seed
            return tf.compat.v1.glorot_uniform_initializer(seed=seed + i)
        for i, units in enumerate((128, 64)):
            x = tf.compat.v1.layers.dense(x, units, activation=tf.nn.relu, name=f"mlp{i}",
                                          kernel_initializer=init(i))
        deep_logit = tf.compat.v1.layers.dense(x, 1, name="out", kernel_initializer=init(2))[:, 0]
        dense_w = tf.compat.v1.layers.dense(features["dense"], 1, name="wide_dense",
                                            kernel_initializer=init(3))[:, 0]
    logits = deep_logit + dense_w + tf.reduce_sum(wide_w, axis=[1, 2])
    loss = None
    if label is not None:
        per_row = tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits)
        if "global_rows" in features:
            loss = tf.reduce_sum(per_row) / tf.cast(features["global_rows"], tf.float32)
        else:
            loss = tf.reduce_mean(per_row)
    return tf.sigmoid(logits), loss


def train_op(loss: tf.Tensor, sparse_opt: Any,
             global_step: Optional[tf.Tensor] = None) -> tf.Operation:
    """Adam on the dense variables, the tables' sparse optimizer on the embeddings
    (one backward pass for both); increments `global_step` when given. On
    several ranks the dense gradients are summed over ranks (the loss is
    then each rank's share of the global batch's mean) and the tables'
    are summed at each row's owner."""
    dense_vars, sparse_vars = dynemb.get_dense_and_sparse_variable()
    grads = tf.gradients(loss, dense_vars + sparse_vars)
    dense_grads = dynemb.allreduce_gradients(grads[:len(dense_vars)], average=False)
    return tf.group(
        tf.compat.v1.train.AdamOptimizer(1e-3).apply_gradients(
            zip(dense_grads, dense_vars)),
        sparse_opt.apply_gradients(zip(grads[len(dense_vars):], sparse_vars),
                                   global_step=global_step))


def serving_inputs() -> Dict[str, tf.Tensor]:
    """Placeholders for one batch of requests, the features of
    criteo_data's pipeline (a served model's inputs)."""
    x = {name: tf.compat.v1.placeholder(tf.int64, [None], name=name)
         for name in criteo_data.CAT_NAMES}
    x["dense"] = tf.compat.v1.placeholder(tf.float32, [None, criteo_data.NUM_INT], name="dense")
    return x


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U, ties get average ranks)."""
    labels = np.asarray(labels, bool)
    order = np.argsort(scores, kind="mergesort")
    s = scores[order]
    ranks = np.empty(len(s))
    i = 0
    while i < len(s):  # average ranks over runs of equal scores
        j = i
        while j + 1 < len(s) and s[j + 1] == s[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1
        i = j + 1
    pos = labels.sum()
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        return float("nan")
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def logloss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    return float(-np.mean(labels * np.log(probs + eps) + (1 - labels) * np.log(1 - probs + eps)))
