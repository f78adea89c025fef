"""Dataset.eos_map on several ranks (tests/py/test_eos_map.py): rank r has
4 + 2r batches; with eos_map every rank gets the same number of batches (the
shortest rank's, or the step limit) in each of two epochs, and a sharded
lookup trains through them on every rank without an exchange error.
Writes $RESULTS/<rank>.json."""
import json
import os

import numpy as np
import tensorflow as tf

from common import start
import dynemb
from dynemb.constants.constants import LIBREC_EOS_OPS_SO
from dynemb.optimizers import gradient_descent
from dynemb.util.ops import import_host_pipeline_ops

rank, size = start()
librec = import_host_pipeline_ops(LIBREC_EOS_OPS_SO)
n_batches = 4 + 2 * rank
limit = int(os.environ.get("EOS_LIMIT", "-1"))


def dataset():
    ids = np.arange(n_batches * 3, dtype=np.int64).reshape([n_batches, 3]) + 100 * rank
    ds = tf.data.Dataset.from_tensor_slices({"ids": ids, "y": np.ones([n_batches, 1])})
    return ds.eos_map(librec, 0, limit, -1)


it = tf.compat.v1.data.make_initializable_iterator(dataset())
b = it.get_next()
table = dynemb.create_table(tf.int64, 2, "t", tf.compat.v1.constant_initializer(0.5))
emb = dynemb.sparse_lookup(table, b["ids"])
loss = tf.reduce_sum(emb)
opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
_, sparse = dynemb.get_dense_and_sparse_variable()
train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
steps = []
with tf.compat.v1.Session() as s:
    for epoch in range(2):
        s.run(it.initializer)
        n = 0
        while True:
            try:
                s.run(train)
                n += 1
            except tf.errors.OutOfRangeError:
                break
        steps.append(n)
with open(os.path.join(os.environ["RESULTS"], "%d.json" % rank), "w") as f:
    json.dump({"steps": steps, "rows": int(table.size())}, f)
