"""Estimator with input_fns that return the batch of a one-shot iterator
(tf.compat.v1.data.make_one_shot_iterator), in both pipeline modes: automatic
graph modification and FeatureSpec. The rebuilt pipeline reads the global step
(the tables evict by step), which a one-shot iterator cannot capture as a
variable; training must run and equal the same model trained with plain
lookups (the reference: no pipeline at all)."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb import GraphModifierHook
from dynemb.core.asc.feature_spec import FeatureSpec
from dynemb.core.asc.helper import get_asc_insert_func
from dynemb.optimizers import adagrad
from estimator_models import RecordLoss
from table_export import export_sorted

CFG = {"access_threshold": 2, "eviction_threshold": 50}
STEPS, BATCH = 10, 8


def _data():
    rng = np.random.RandomState(5)
    ids = rng.randint(0, 300, size=[STEPS * BATCH, 3]).astype(np.int64) * 11
    y = (ids[:, :1] % 3 == 0).astype(np.float32)
    return ids, y


def _dataset():
    ids, y = _data()
    return tf.compat.v1.data.Dataset.from_tensor_slices(({"ids": ids}, y)).batch(BATCH)


def _spec():
    return FeatureSpec("ids", table_name="os_t", access_threshold=CFG["access_threshold"],
                       eviction_threshold=CFG["eviction_threshold"])


def _input_fn(mode):
    def input_fn():
        ds = _dataset()
        if mode == "feature_spec":
            ds = ds.map(get_asc_insert_func(tgt_key_specs=[_spec()], is_training=True))
        if mode == "plain":
            return ds  # Estimator makes its own (initializable) iterator
        return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    return input_fn


def _model_fn(mode_name, losses):
    def model_fn(features, labels, mode):
        opt = adagrad.create_hash_optimizer(learning_rate=0.1, initial_accumulator_value=0.1)
        t = dynemb.create_table(tf.int64, 4, "os_t", tf.compat.v1.random_uniform_initializer(
            -0.05, 0.05, seed=2), optimizer_list=[opt])
        if mode_name == "feature_spec":
            e = dynemb.sparse_lookup(t, _spec(), batch=features)
        else:
            e = dynemb.sparse_lookup(t, features["ids"], modify_graph=mode_name == "modify",
                                     access_and_evict_config=CFG)
        w = tf.compat.v1.get_variable("w", [4, 1], initializer=tf.compat.v1.ones_initializer())
        logits = tf.matmul(tf.reduce_sum(e, 1), w)
        loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels,
                                                                      logits=logits))
        dense, sparse = dynemb.get_dense_and_sparse_variable()
        train_op = tf.group(
            tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=dense),
            opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse),
                                global_step=tf.compat.v1.train.get_global_step()))
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                          training_hooks=[RecordLoss(loss, losses)])
    return model_fn


def _train(mode, model_dir):
    dynemb.clear_tables()
    losses = []
    hooks = {"plain": [], "modify": [GraphModifierHook()],
             "feature_spec": [GraphModifierHook(modify_graph=False)]}[mode]
    est = tf.estimator.Estimator(_model_fn(mode, losses), str(model_dir))
    est.train(_input_fn(mode), hooks=hooks)
    return np.array(losses), export_sorted("os_t")


@pytest.mark.estimator
@pytest.mark.parametrize("mode", ["modify", "feature_spec"])
def test_estimator_trains_from_a_one_shot_iterator(tmp_path, mode):
    ref_losses, (ref_keys, ref_values) = _train("plain", tmp_path / "plain")
    losses, (keys, values) = _train(mode, tmp_path / mode)
    assert len(losses) == STEPS
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-6)
    np.testing.assert_array_equal(keys, ref_keys)
    np.testing.assert_allclose(values, ref_values, rtol=1e-6)
    assert 0 < len(keys) < len(np.unique(_data()[0]))  # admission left ids out
    # The pipeline stamped global steps, not a constant.
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        last_access = s.run(dynemb._lib.ops.dynemb_export(table_name="os_t")[3])
    assert last_access.max() > 0
