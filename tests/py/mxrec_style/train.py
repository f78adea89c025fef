"""An mxRec-style training script, written for dynemb's tests in the shape of
mxRec's little demo (two tables, a small CTR model, train / load_and_train /
predict, cache modes, both graph modes, timestamps, one-shot iterators, static
shapes, several lookups of a table, dynamic expansion), after the migration
edits only: the import prefix is dynemb's, and nothing Ascend-specific is left.
The mode comes from environment variables, as mxRec's run scripts set them;
it prints one "RESULT ..." line that the test reads."""
import glob
import os
import re
import shutil
import time

import numpy as np
import tensorflow as tf

from dynemb.constants.constants import ASCEND_TIMESTAMP
from dynemb.core.asc.feature_spec import FeatureSpec
from dynemb.core.asc.helper import get_asc_insert_func
from dynemb.core.asc.manager import start_asc_pipeline
from dynemb.core.embedding import create_table, sparse_lookup
from dynemb.graph.modifier import modify_graph_and_start_emb_cache
from dynemb.optimizers.lazy_adam import create_hash_optimizer
from dynemb.optimizers.lazy_adam_by_addr import create_hash_optimizer_by_address
from dynemb.util.communication.hccl_ops import get_rank_id, get_rank_size
from dynemb.util.initialize import (ConfigInitializer, get_host_pipeline_ops, init,
                                    terminate_config_initializer)
from dynemb.util.ops import import_host_pipeline_ops
from dynemb.util.variable import get_dense_and_sparse_variable

tf.compat.v1.disable_eager_execution()

ENV = {k: os.environ.get(k, d) for k, d in (
    ("USE_MODE", "train"), ("CACHE_MODE", "HBM"), ("USE_MODIFY_GRAPH", "1"),
    ("USE_TIMESTAMP", "0"), ("USE_ONE_SHOT", "0"), ("USE_DYNAMIC", "1"),
    ("USE_MULTI_LOOKUP", "0"), ("USE_DYNAMIC_EXPANSION", "0"))}
MODIFY = ENV["USE_MODIFY_GRAPH"] == "1"
TIMESTAMP = ENV["USE_TIMESTAMP"] == "1"
EXPANSION = ENV["USE_DYNAMIC_EXPANSION"] == "1"
BATCH, USER_FEATS, ITEM_FEATS, DIM = 32, 4, 6, 8
TRAIN_STEPS, EVAL_EVERY, EVAL_STEPS, SAVE_EVERY = 24, 8, 3, 12
MODEL_DIR = "./saved-model"


def batches(seed, n):
    """Synthetic samples: user and item ids drawn from skewed vocabularies, a
    label that depends on them, and a data timestamp per batch."""
    rng = np.random.default_rng(seed)
    for b in range(n):
        user = (rng.zipf(1.4, [BATCH, USER_FEATS]) % 5000).astype(np.int64)
        item = (rng.zipf(1.3, [BATCH, ITEM_FEATS]) % 20000).astype(np.int64) + 100000
        label = ((user[:, 0] + item[:, 0]) % 3 == 0).astype(np.float32)
        yield {"user_ids": user, "item_ids": item, "label_0": label,
               "timestamp": np.full([BATCH], 1_700_000_000 + 60 * b, np.int64)}


def dataset(seed, n, specs, is_training):
    shapes = {"user_ids": [BATCH, USER_FEATS], "item_ids": [BATCH, ITEM_FEATS],
              "label_0": [BATCH], "timestamp": [BATCH]}
    ds = tf.data.Dataset.from_generator(
        lambda: batches(seed, n), output_types={k: (tf.float32 if k == "label_0" else tf.int64)
                                                for k in shapes},
        output_shapes={k: tf.TensorShape(v) for k, v in shapes.items()})
    if TIMESTAMP and MODIFY:
        ds = ds.map(lambda b: dict(b, timestamp=get_host_pipeline_ops().return_timestamp(
            b["timestamp"])))
    if not MODIFY:
        ds = ds.map(get_asc_insert_func(tgt_key_specs=specs, is_training=is_training))
    if ENV["USE_ONE_SHOT"] == "1":
        return None, tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    return it, it.get_next()


def cache_sizes():
    mode = ENV["CACHE_MODE"]
    if EXPANSION or mode == "HBM":
        return {}
    sizes = {"device_vocabulary_size": 2000, "host_vocabulary_size": 100000}
    if mode == "SSD":
        os.makedirs("ssd_data", exist_ok=True)
        sizes = {"device_vocabulary_size": 500, "host_vocabulary_size": 1500,
                 "ssd_vocabulary_size": 200000, "ssd_data_path": ["ssd_data"]}
    return sizes


def feature_specs(is_training):
    if MODIFY:
        return None
    specs = [FeatureSpec("user_ids", table_name="user_table", access_threshold=2,
                         eviction_threshold=600, faae_coefficient=1),
             FeatureSpec("item_ids", table_name="item_table", access_threshold=2,
                         eviction_threshold=600, faae_coefficient=4)]
    if ENV["USE_MULTI_LOOKUP"] == "1":  # one more lookup of the user ids: same name
        specs.append(FeatureSpec("user_ids", table_name="user_table", access_threshold=2,
                                 eviction_threshold=600, faae_coefficient=1))
    if TIMESTAMP:
        specs.append(FeatureSpec("timestamp", is_timestamp=True))
    return specs


def model(batch, tables, is_train, specs):
    embs = []
    for t, key in ((tables[0], "user_ids"), (tables[1], "item_ids")):
        lookups = 2 if (ENV["USE_MULTI_LOOKUP"] == "1" and key == "user_ids") else 1
        cfg = ({"access_threshold": 2, "eviction_threshold": 600,
                "faae_coefficient": 1 if key == "user_ids" else 4} if TIMESTAMP else None)
        mine = [sp for sp in specs if sp.index_key == key] if specs else None
        for k in range(lookups):
            ids = mine[k] if specs else batch[key]
            send_count = None if ENV["USE_DYNAMIC"] == "1" else (
                BATCH * (USER_FEATS if key == "user_ids" else ITEM_FEATS))
            embs.append(sparse_lookup(t, ids, send_count, is_train=is_train,
                                      name=f"{key}_{k}_{'train' if is_train else 'eval'}",
                                      modify_graph=MODIFY, batch=batch,
                                      access_and_evict_config=cfg,
                                      serving_default_value=tf.ones(DIM) * 0.0))
    x = tf.concat([tf.reduce_sum(e, axis=1) for e in embs], axis=1)
    with tf.compat.v1.variable_scope("mlp", reuse=tf.compat.v1.AUTO_REUSE):
        h = tf.compat.v1.layers.dense(x, 16, activation=tf.nn.relu, name="h")
        logit = tf.squeeze(tf.compat.v1.layers.dense(h, 1, name="out"), -1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label_0"],
                                                                  logits=logit))
    return loss


def main():
    init(use_dynamic=ENV["USE_DYNAMIC"] == "1", use_dynamic_expansion=EXPANSION,
         train_steps=EVAL_EVERY, eval_steps=EVAL_STEPS, save_steps=SAVE_EVERY)
    assert get_rank_id() == 0 and get_rank_size() == 1
    if ENV["USE_MODE"] == "train":
        shutil.rmtree(MODEL_DIR, ignore_errors=True)
    init_fn = tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=1)
    tables = [create_table(key_dtype=tf.int64, dim=tf.TensorShape([DIM]), name=n,
                           emb_initializer=init_fn, is_dp=False,
                           all2all_gradients_op="sum_gradients_and_div_by_ranksize",
                           padding_keys=None, padding_keys_mask=False, padding_keys_len=None,
                           **cache_sizes())
              for n in ("user_table", "item_table")]
    train_specs, eval_specs = feature_specs(True), feature_specs(False)
    # exactly the batches the steps train on: a pipeline that prepares ahead
    # (graph modification's, or tf.data's own prefetch) then admits the ids of
    # these batches and no others, so row counts compare across modes
    train_it, train_batch = dataset(1, TRAIN_STEPS, train_specs, True)
    eval_it, eval_batch = dataset(2, 200, eval_specs, False)
    if TIMESTAMP and MODIFY:  # (FeatureSpec mode: the timestamp FeatureSpec)
        assert tf.compat.v1.get_collection(ASCEND_TIMESTAMP)
    train_loss = model(train_batch, tables, True, train_specs)
    eval_loss = model(eval_batch, tables, False, eval_specs)
    dense_vars, sparse_vars = get_dense_and_sparse_variable()
    dense_opt = tf.compat.v1.train.AdamOptimizer(1e-3)
    gs = tf.compat.v1.train.get_or_create_global_step()
    train_ops = [dense_opt.apply_gradients(dense_opt.compute_gradients(train_loss,
                                                                       var_list=dense_vars))]
    if EXPANSION:
        from dynemb.constants.constants import (ASCEND_SPARSE_LOOKUP_ID_OFFSET,
                                                ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        sparse_opt = create_hash_optimizer_by_address(learning_rate=0.01)
        rows = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
        addresses = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
        train_ops.append(sparse_opt.apply_gradients(
            zip(tf.gradients(train_loss, rows), addresses)))
    else:
        sparse_opt = create_hash_optimizer(learning_rate=0.01)
        train_ops.append(sparse_opt.apply_gradients(
            zip(tf.gradients(train_loss, sparse_vars), sparse_vars)))
    train_op = tf.group(*train_ops, tf.compat.v1.assign_add(gs, 1))
    threshold_op = None
    if TIMESTAMP:
        threshold_op = import_host_pipeline_ops().set_threshold(
            tf.constant(3, tf.int64), emb_name="user_table", ids_name="user_ids_0_train")
    if MODIFY:
        modify_graph_and_start_emb_cache()
    else:
        start_asc_pipeline()
    cfg = ConfigInitializer.get_instance().train_params_config
    saver = tf.compat.v1.train.Saver(max_to_keep=2)
    step, losses, evals = 0, [], []
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for it_ in (train_it, eval_it):
            if it_ is not None:
                sess.run(cfg.get_initializer(it_ is train_it) if MODIFY else it_.initializer)
        if ENV["USE_MODE"] != "train":
            found = sorted(glob.glob(f"{MODEL_DIR}/sparse-model-*"),
                           key=lambda p: int(re.search(r"sparse-model-(\d+)", p).group(1)))
            if not found:
                raise SystemExit("no model file exist")
            step = int(re.search(r"sparse-model-(\d+)", found[-1]).group(1))
            saver.restore(sess, f"{MODEL_DIR}/model-{step}")
        if ENV["USE_MODE"] == "predict":
            evals = [float(sess.run(eval_loss)) for _ in range(EVAL_STEPS)]
        else:
            for i in range(TRAIN_STEPS):
                losses.append(float(sess.run([train_loss, train_op])[0]))
                step += 1
                if threshold_op is not None and i == TRAIN_STEPS // 2:
                    sess.run(threshold_op)
                if step % EVAL_EVERY == 0:
                    channel = cfg.get_training_mode_channel_id(False)
                    sess.run(import_host_pipeline_ops().clear_channel(channel))
                    evals.append(float(np.mean([sess.run(eval_loss)
                                                for _ in range(EVAL_STEPS)])))
                if step % SAVE_EVERY == 0:
                    saver.save(sess, f"{MODEL_DIR}/model", global_step=step)
        # The prepared pipelines work ahead of the step: let them finish the
        # batches they prefetch, so that the sizes count the same batches
        # whatever the machine's load (the test compares them across modes).
        sizes, t0 = None, time.time()
        while time.time() - t0 < 10:
            now_sizes = [t.size() for t in tables]
            if now_sizes == sizes:
                break
            sizes = now_sizes
            time.sleep(0.3)
    sizes = [t.size() for t in tables]
    terminate_config_initializer()
    # the item ids of the batches the steps trained on (a prepared pipeline
    # also admits the ids of the batches it prefetched beyond them)
    trained = [b["item_ids"] for b, _ in zip(batches(1, TRAIN_STEPS), range(len(losses)))]
    seen_items = len(np.unique(np.concatenate(trained))) if trained else 0
    print("RESULT mode=%s step=%d first_loss=%.4f last_loss=%.4f evals=%s sizes=%s "
          "seen_items=%d"
          % (ENV["USE_MODE"], step, losses[0] if losses else float("nan"),
             losses[-1] if losses else float("nan"),
             ",".join("%.4f" % e for e in evals), ",".join(map(str, sizes)), seen_items))


if __name__ == "__main__":
    main()
