"""mxRec's create_table keywords: padding keys are never updated (the
reference: the same training without padding keys, where only the padding
key's row differs), in plain and graph-modification mode; is_dp and
enable_merge are accepted (one process: one copy of a table either way); the
padding keywords are checked together as mxRec documents them."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.optimizers import lazy_adam

from table_export import export_sorted, run_pipeline

IDS = np.array([[0, 1, 2], [0, 2, 3], [1, 0, 0]], np.int64)


def _train(name, modify, **table_kw):
    with tf.Graph().as_default():
        opt = lazy_adam.create_hash_optimizer(learning_rate=0.1)
        t = dynemb.create_table(tf.int64, 2, name, tf.compat.v1.constant_initializer(0.5),
                                **table_kw)
        ds = tf.data.Dataset.from_tensor_slices(IDS).batch(1)
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        emb = dynemb.sparse_lookup(t, it.get_next(), modify_graph=modify)
        loss = tf.reduce_sum(tf.square(emb - 1.0))
        _, sparse = dynemb.get_dense_and_sparse_variable()
        train = opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse))
        run_pipeline(it, train, modify, len(IDS))
    keys, values = export_sorted(name)
    return dict(zip(keys.tolist(), values[:, :2]))


@pytest.mark.parametrize("modify", [False, True], ids=["plain", "modify_graph"])
def test_padding_keys_are_never_updated(modify):
    ref = _train("ref", modify)
    got = _train("pad", modify, padding_keys=[0], padding_keys_mask=True,
                 padding_keys_len=3)
    assert sorted(got) == sorted(ref) == [0, 1, 2, 3]
    np.testing.assert_array_equal(got[0], [0.5, 0.5])  # its initial row
    assert not np.allclose(ref[0], [0.5, 0.5])          # which training moves
    for k in (1, 2, 3):
        np.testing.assert_allclose(got[k], ref[k], rtol=1e-6)


def test_is_dp_and_enable_merge_are_accepted():
    t = dynemb.create_table(tf.int64, 2, "dp", tf.compat.v1.zeros_initializer(), is_dp=True,
                            enable_merge=True)
    assert t.is_dp


@pytest.mark.parametrize("kw, match", [
    ({"padding_keys": [0]}, "padding_keys_mask is False"),
    ({"padding_keys_mask": True}, "needs padding_keys"),
    ({"padding_keys": [], "padding_keys_mask": True}, "non-empty list"),
    ({"padding_keys": 2**63, "padding_keys_mask": True}, "int64"),
])
def test_padding_keywords_go_together(kw, match):
    with pytest.raises(ValueError, match=match):
        dynemb.create_table(tf.int64, 2, "bad_pad", tf.compat.v1.zeros_initializer(), **kw)
