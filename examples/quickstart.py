"""The smallest complete dynemb training script, written like an mxRec sess.run
script (replace `mx_rec` by `dynemb` in the imports of yours). README's quick
start shows this file.

    .venv/bin/python examples/quickstart.py
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from dynemb.core.embedding import create_table, sparse_lookup  # noqa: E402
from dynemb.graph.modifier import modify_graph_and_start_emb_cache  # noqa: E402
from dynemb.optimizers.lazy_adam import create_hash_optimizer  # noqa: E402
from dynemb.util.initialize import get_initializer, init, terminate_config_initializer  # noqa: E402
from dynemb.util.variable import get_dense_and_sparse_variable  # noqa: E402

tf.compat.v1.disable_eager_execution()
init(use_dynamic_expansion=True)

# Any ids, any number per batch: raw 64-bit hashes need no vocabulary.
rng = np.random.default_rng(0)
user = rng.zipf(1.3, 4096).astype(np.int64) * 1_000_003
label = (user % 3 == 0).astype(np.float32)
dataset = tf.data.Dataset.from_tensor_slices({"user": user, "label": label}).batch(256)
batch = tf.compat.v1.data.make_initializable_iterator(dataset).get_next()

sparse_optimizer = create_hash_optimizer(learning_rate=0.01)
table = create_table(key_dtype=tf.int64, dim=8, name="user_table",
                     emb_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1),
                     optimizer_list=[sparse_optimizer])
emb = sparse_lookup(table, batch["user"], modify_graph=True,
                    access_and_evict_config={"access_threshold": 2, "eviction_threshold": 100})
w = tf.compat.v1.get_variable("w", [8], initializer=tf.compat.v1.zeros_initializer())
logits = tf.reduce_sum(emb * w, axis=1)
loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=batch["label"],
                                                              logits=logits))

dense_variables, sparse_variables = get_dense_and_sparse_variable()
train_ops = [tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, var_list=dense_variables)]
sparse_grads = tf.gradients(loss, sparse_variables)
train_ops.append(sparse_optimizer.apply_gradients(zip(sparse_grads, sparse_variables)))

modify_graph_and_start_emb_cache()  # rebuilds the input pipeline: ids reach the engine early
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(get_initializer(True))
    for step in range(16):
        _, value = sess.run([train_ops, loss])
    print(f"loss {value:.4f}; table rows {table.size()}")
terminate_config_initializer()
