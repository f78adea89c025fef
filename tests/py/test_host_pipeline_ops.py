"""mxRec's host-pipeline ops and training-parameter config at mxRec's paths:
``dynemb.util.ops.import_host_pipeline_ops`` / ``util.initialize
.get_host_pipeline_ops`` (set_threshold, return_timestamp, clear_channel) and
``ConfigInitializer.get_instance()`` (if_load, use_dynamic_expansion,
train_params_config), each run in a session with mxRec's meaning."""
import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.core import embedding
from dynemb.constants.constants import ASCEND_TIMESTAMP
from dynemb.graph import GraphModificationError
from dynemb.graph.modifier import modify_graph_and_start_emb_cache
from dynemb.optimizers import gradient_descent
from dynemb.util.initialize import (ConfigInitializer, get_host_pipeline_ops, get_if_load,
                                    set_if_load)
from dynemb.util.ops import import_host_pipeline_ops


def _table(name, opt):
    return dynemb.create_table(tf.int64, 2, name, tf.compat.v1.constant_initializer(0.5),
                               optimizer_list=[opt])


def _train_op(opt, loss, global_step=False):
    _, sparse = dynemb.get_dense_and_sparse_variable()
    gs = tf.compat.v1.train.get_or_create_global_step() if global_step else None
    return opt.apply_gradients(zip(tf.gradients(loss, sparse), sparse), global_step=gs)


def _rows(name):
    """{key: last access stamp} of the table's rows."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        out = s.run(dynemb._lib.ops.dynemb_export(table_name=name))
    return dict(zip(out[1].tolist(), out[3].tolist()))


def test_one_object_at_both_mxrec_paths():
    ops = import_host_pipeline_ops()
    assert get_host_pipeline_ops() is ops
    assert import_host_pipeline_ops(so_pkg_name=dynemb.constants.constants.LIBASC_OPS_SO) is ops
    for name in ("set_threshold", "return_timestamp", "clear_channel"):
        assert callable(getattr(ops, name))
    with pytest.raises(ValueError, match="so_pkg_name"):
        import_host_pipeline_ops(so_pkg_name="")


# --------------------------------------------------------------------------
# set_threshold
# --------------------------------------------------------------------------

def _fed_model(threshold, name="adm"):
    opt = gradient_descent.create_hash_optimizer(learning_rate=1.0)
    t = _table(name, opt)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    e = dynemb.sparse_lookup(t, ids, access_and_evict_config={"access_threshold": threshold},
                             name=name + "_lookup")
    return t, ids, _train_op(opt, tf.reduce_sum(e))


def test_set_threshold_is_an_op_that_changes_admission_when_run():
    t, ids, train = _fed_model(3)
    # Built before training, with mxRec's arguments (an int32 tensor, the
    # table's name and the lookup's name): nothing changes until it runs.
    op = get_host_pipeline_ops().set_threshold(tf.constant(1, tf.int32), emb_name="adm",
                                               ids_name="adm_lookup")
    assert isinstance(op, tf.Operation) and op.type == "DynembSetAccessThreshold"
    with tf.compat.v1.Session() as s:
        s.run(train, {ids: [7]})
        s.run(train, {ids: [8]})
        assert t.size() == 0           # each seen once, threshold 3
        assert s.run(op.outputs[0]) == 3  # the previous threshold
        s.run(train, {ids: [7]})       # 2nd sighting of 7: admitted now (threshold 1)
        assert t.size() == 1
        s.run(train, {ids: [9]})       # a new id: admitted at once
        assert t.size() == 2
        assert s.run(op.outputs[0]) == 1


def test_set_threshold_finds_the_table_by_ids_name_alone():
    t, ids, train = _fed_model(5, name="by_lookup")
    op = import_host_pipeline_ops().set_threshold(1, ids_name="by_lookup_lookup")
    with tf.compat.v1.Session() as s:
        s.run(train, {ids: [1]})
        assert t.size() == 0
        s.run(op)
        s.run(train, {ids: [2]})
        assert t.size() == 1
    dynemb.FeatureSpec("feat", table_name="by_lookup")
    spec_op = import_host_pipeline_ops().set_threshold(4, ids_name="feat")
    with tf.compat.v1.Session() as s:
        assert s.run(spec_op.outputs[0]) == 1
    with pytest.raises(ValueError, match="no_such_name"):
        import_host_pipeline_ops().set_threshold(1, ids_name="no_such_name")
    with pytest.raises(ValueError, match="no table of that name"):
        import_host_pipeline_ops().set_threshold(1, emb_name="no_such_table")
    # With emb_name, ids_name has no effect (mxRec: a legacy parameter).
    assert import_host_pipeline_ops().set_threshold(2, emb_name="by_lookup",
                                                    ids_name="anything").type == \
        "DynembSetAccessThreshold"


@pytest.mark.parametrize("how", ["int", "fed tensor", "legacy call"])
def test_set_threshold_weighs_sightings_by_the_faae_coefficient(how):
    # mxRec's rule for the run-time threshold too: a key is admitted when
    # its sightings x faae_coefficient reach the threshold. The reference is
    # that rule, counted here.
    weight, first, second = 3, 9, 5     # admitted at 3 sightings, then at ceil(5/3) = 2
    opt = gradient_descent.create_hash_optimizer(learning_rate=1.0)
    t = _table("weighed", opt)
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    e = dynemb.sparse_lookup(t, ids, access_and_evict_config={
        "access_threshold": first, "faae_coefficient": weight})
    train = _train_op(opt, tf.reduce_sum(e))
    fed = tf.compat.v1.placeholder(tf.int32, [])
    op = (import_host_pipeline_ops().set_threshold(second if how == "int" else fed,
                                                   emb_name="weighed")
          if how != "legacy call" else None)

    def sightings_to_admit(s, key):
        for n in range(1, 10):
            s.run(train, {ids: [key]})
            if key in _rows("weighed"):
                return n
        return None

    with tf.compat.v1.Session() as s:
        assert sightings_to_admit(s, 1) == min(n for n in range(1, 10) if n * weight >= first)
        if how == "legacy call":   # the same object: an op to run
            s.run(ConfigInitializer.get_instance().host_pipeline_ops.set_threshold(
                second, emb_name="weighed"))
        else:
            s.run(op, {fed: second} if how == "fed tensor" else None)
        assert sightings_to_admit(s, 2) == min(n for n in range(1, 10)
                                               if n * weight >= second) == 2


def _candidates(name):
    """{key: sightings counted} of the table's admission candidates."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        out = s.run(dynemb._lib.ops.dynemb_export(table_name=name))
    return dict(zip(out[4].tolist(), out[5].tolist()))


@pytest.mark.parametrize("zero", ["int", "tensor", "fed", "legacy call"])
def test_threshold_zero_stops_counting(zero):
    """mxRec's set_threshold(0): the threshold stays, sightings of keys
    without a row are no longer counted (so they are not admitted), keys
    with a row train on; another threshold resumes counting."""
    t, ids, train = _fed_model(3, name="zero")
    ops = import_host_pipeline_ops()
    fed = tf.compat.v1.placeholder(tf.int64, [])
    stop = {"int": lambda: ops.set_threshold(0, emb_name="zero"),
            "tensor": lambda: ops.set_threshold(tf.constant(0, tf.int32), emb_name="zero"),
            "fed": lambda: ops.set_threshold(fed, emb_name="zero"),
            "legacy call": lambda: None}[zero]()
    resume = ops.set_threshold(fed, emb_name="zero")
    with tf.compat.v1.Session() as s:
        for _ in range(3):
            s.run(train, {ids: [1]})         # key 1: a row
        s.run(train, {ids: [2, 2]})          # key 2: counted twice
        if zero == "legacy call":
            assert ConfigInitializer.get_instance().host_pipeline_ops is ops
            s.run(ops.set_threshold(0, emb_name="zero"))
        else:
            assert s.run(stop.outputs[0], {fed: 0} if zero == "fed" else None) == 3
        before = _rows("zero")[1]
        for step in range(4):
            s.run(train, {ids: [1, 2, 3]})
        assert sorted(_rows("zero")) == [1] and _candidates("zero") == {2: 2}
        assert t.stats()["rejected"] >= 8
        assert s.run(resume.outputs[0], {fed: 3}) == 3   # the threshold stayed 3
        s.run(train, {ids: [2]})                          # counting again: 3rd sighting
        assert sorted(_rows("zero")) == [1, 2]
    del before


def test_threshold_out_of_range_is_refused():
    t, ids, train = _fed_model(2, name="range")
    ops = import_host_pipeline_ops()
    with pytest.raises(ValueError, match="out of range"):
        ops.set_threshold(-1, emb_name="range")
    fed = tf.compat.v1.placeholder(tf.int64, [])
    op = ops.set_threshold(fed, emb_name="range")
    with tf.compat.v1.Session() as s:
        with pytest.raises(tf.errors.InvalidArgumentError, match="'range'.*out of range"):
            s.run(op, {fed: 2 ** 32})
        s.run(train, {ids: [1]})
        assert t.size() == 0  # the failed run left the threshold at 2
        s.run(op, {fed: 1})
        s.run(train, {ids: [2]})
        assert t.size() == 1


def test_feature_spec_and_lookup_config_threshold_zero():
    """mxRec's access_threshold=0 in a FeatureSpec or access_and_evict_config:
    admission without counting, where a count of 0 reaches the threshold: at
    once (as before this change); None and -1 are off."""
    from dynemb.core.asc.feature_spec import FeatureSpec
    assert FeatureSpec("f", table_name="x", access_threshold=0).access_and_evict_config[
        "access_threshold"] == 0
    t, ids, train = _fed_model(0, name="zero_cfg")
    with tf.compat.v1.Session() as s:
        s.run(train, {ids: [4, 4, 5]})
        assert t.size() == 2 and _candidates("zero_cfg") == {}
    off = _table("off", gradient_descent.create_hash_optimizer(learning_rate=1.0))
    e = dynemb.sparse_lookup(off, ids, access_and_evict_config={
        "access_threshold": None, "eviction_threshold": -1, "faae_coefficient": None})
    with tf.compat.v1.Session() as s:
        s.run(e, {ids: [4]})
    assert off.size() == 1


# --------------------------------------------------------------------------
# return_timestamp
# --------------------------------------------------------------------------

# (data time of the batch, its ids): id 2 is last seen at 100 and goes once
# a step's time passes 100 + 20; id 1 at 120 (gone at 141).
STEPS = ((100, [1, 2]), (105, [1, 1]), (120, [1, 3]), (121, [3, 3]), (141, [3, 3]),
         (142, [4, 4]))
KEYS_AFTER = ([1, 2], [1, 2], [1, 2, 3], [1, 3], [3], [3, 4])


def _dataset(steps=STEPS):
    ids = np.array([i for _, i in steps], np.int64)
    label = np.array([[ts, ts - 1] for ts, _ in steps], np.float32)

    def add_timestamp(batch):
        batch["timestamp"] = get_host_pipeline_ops().return_timestamp(
            tf.cast(batch["label"], tf.int64))
        return batch

    return tf.compat.v1.data.Dataset.from_tensor_slices(
        {"ids": ids, "label": label}).map(add_timestamp).prefetch(2)


class _RunAtStart(tf.compat.v1.train.SessionRunHook):
    def __init__(self, op):
        self._op = op

    def after_create_session(self, session, coord):
        session.run(self._op)


@pytest.mark.parametrize("one_shot", [False, True])
def test_return_timestamp_drives_data_time_eviction(one_shot):
    ds = _dataset()
    it = (tf.compat.v1.data.make_one_shot_iterator(ds) if one_shot
          else tf.compat.v1.data.make_initializable_iterator(ds))
    batch = it.get_next()
    opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
    t = _table("ts", opt)
    e = dynemb.sparse_lookup(t, batch["ids"], access_and_evict_config={
        "eviction_threshold": 20})
    train = _train_op(opt, tf.reduce_sum(e), global_step=True)
    # The collection now holds the get_next output that the lookup took its
    # time from (not the map function's tensor).
    stamps = tf.compat.v1.get_collection(ASCEND_TIMESTAMP)
    assert [s.name for s in stamps] == [batch["timestamp"].name]
    hook = dynemb.EvictHook(evict_enable=True, evict_step_interval=1)
    hooks = [hook] if one_shot else [hook, _RunAtStart(it.initializer)]
    with tf.compat.v1.train.SingularMonitoredSession(hooks=hooks) as s:
        for (stamp, _), want in zip(STEPS, KEYS_AFTER):
            s.run(train)
            assert sorted(_rows("ts")) == want, stamp


def test_a_timestamp_nobody_reads_yet_stays_pending():
    ds = _dataset()
    pending = tf.compat.v1.get_collection(ASCEND_TIMESTAMP)
    assert len(pending) == 1 and not isinstance(pending[0], tf.Tensor)
    # Converted before any iterator reads the dataset, it matches no iterator.
    ts = tf.convert_to_tensor(pending[0])
    assert ts.dtype == tf.int64 and not ts.op.inputs
    batch = tf.compat.v1.data.make_initializable_iterator(ds).get_next()
    assert tf.convert_to_tensor(pending[0]) is batch["timestamp"]
    assert tf.compat.v1.get_collection(ASCEND_TIMESTAMP) == [batch["timestamp"]]


def test_return_timestamp_outside_a_map_registers_the_tensor():
    ts = tf.compat.v1.placeholder(tf.int32, [None])
    out = import_host_pipeline_ops().return_timestamp(ts)
    assert out.dtype == tf.int64
    assert tf.compat.v1.get_collection(ASCEND_TIMESTAMP) == [out]
    with pytest.raises(TypeError, match="number tensor"):
        import_host_pipeline_ops().return_timestamp(tf.constant(["a"]))


# --------------------------------------------------------------------------
# clear_channel and train_params_config
# --------------------------------------------------------------------------

def test_clear_channel_takes_the_channel_ids_and_is_a_no_op():
    cfg = ConfigInitializer.get_instance().train_params_config
    assert (cfg.get_training_mode_channel_id(True), cfg.get_training_mode_channel_id(False)) \
        == (0, 1)
    ops = import_host_pipeline_ops()
    with tf.compat.v1.Session() as s:
        for channel in (cfg.get_training_mode_channel_id(False), 0, tf.constant(1)):
            s.run(ops.clear_channel(channel))
    with pytest.raises(ValueError, match="channels are 0"):
        ops.clear_channel(2)
    with pytest.raises(TypeError, match="channel_id"):
        ops.clear_channel(None)
    with pytest.raises(TypeError, match="is_training"):
        cfg.get_training_mode_channel_id("train")


def test_rebuilt_pipelines_through_train_params_config():
    """get_initializer and get_target_batch of the rebuilt train pipeline (and
    of the eval one), with timestamps from return_timestamp in both."""
    opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
    t = _table("mod", opt)
    train_it = tf.compat.v1.data.make_initializable_iterator(_dataset())
    train_batch = train_it.get_next()
    e = dynemb.sparse_lookup(t, train_batch["ids"], modify_graph=True)
    train = _train_op(opt, tf.reduce_sum(e))
    eval_steps = ((500, [1, 9]), (600, [2, 9]))
    eval_it = tf.compat.v1.data.make_initializable_iterator(_dataset(eval_steps))
    eval_batch = eval_it.get_next()
    ev = dynemb.sparse_lookup(t, eval_batch["ids"], is_train=False, modify_graph=True)
    cfg = ConfigInitializer.get_instance().train_params_config
    with pytest.raises(GraphModificationError, match="modify_graph_and_start"):
        cfg.get_target_batch(True)
    modify_graph_and_start_emb_cache()
    target = cfg.get_target_batch(True)   # the batch's own structure (a dict)
    assert isinstance(target, dict) and sorted(target) == sorted(train_batch)
    assert all(target[k] is not train_batch[k] for k in target)
    flat = tf.nest.flatten(train_batch)  # ids, label, timestamp
    target = tf.nest.flatten(target)
    assert len(target) == 3 and all(a is not b for a, b in zip(target, flat))
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        s.run(cfg.get_initializer(True))
        for stamp, ids in STEPS:
            got_ids, got_label, got_ts, _ = s.run(target + [train])
            np.testing.assert_array_equal(got_ids, ids)
            np.testing.assert_array_equal(got_label, [stamp, stamp - 1])
            np.testing.assert_array_equal(got_ts, [stamp, stamp - 1])
        # The rows carry data time (the batches' timestamps), not steps.
        want = {1: 120, 2: 100, 3: 141, 4: 142}
        assert _rows("mod") == want
        s.run(cfg.get_initializer(False))
        eval_target = tf.nest.flatten(cfg.get_target_batch(False))
        for stamp, ids in eval_steps:
            got_ids, _, got_ts, _ = s.run(eval_target + [ev])
            np.testing.assert_array_equal(got_ids, ids)
            assert got_ts.max() == stamp
        assert _rows("mod") == want  # eval lookups stamp nothing
        with pytest.raises(tf.errors.OutOfRangeError):
            s.run(eval_target)
        s.run(cfg.get_initializer(False))  # the eval pipeline starts again
        np.testing.assert_array_equal(s.run(eval_target[0]), [1, 9])


def test_config_initializer_properties_follow_init():
    dynemb.init()
    c = ConfigInitializer.get_instance()
    assert (c.if_load, c.use_dynamic_expansion, c.use_dynamic, c.use_static) == \
        (False, False, True, False)
    dynemb.init(if_load=True, use_dynamic=False, use_dynamic_expansion=True)
    c = ConfigInitializer.get_instance()
    p = c.train_params_config
    assert (c.if_load, c.use_dynamic_expansion, c.use_dynamic, c.use_static) == \
        (True, True, False, True)
    assert (p.use_dynamic_expansion, p.use_dynamic, p.use_static) == (True, False, True)
    set_if_load(False)
    assert not c.if_load and not get_if_load()


def test_hashtable_collection_holds_the_tables():
    opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
    a = _table("coll_a", opt)
    cfg = ConfigInitializer.get_instance().train_params_config
    _, sparse = dynemb.get_dense_and_sparse_variable()
    assert cfg.ascend_global_hashtable_collection == "ASCEND_GLOBAL_HASHTABLE_COLLECTION"
    assert tf.compat.v1.get_collection(cfg.ascend_global_hashtable_collection) == sparse == \
        [a.variable]
    cfg.ascend_global_hashtable_collection = "test"
    assert tf.compat.v1.get_collection("test") == [a.variable]
    b = _table("coll_b", opt)      # goes into the renamed collection at once
    assert tf.compat.v1.get_collection("test") == [a.variable, b.variable]
    name = cfg.ascend_global_hashtable_collection
    assert name == "test"
    assert tf.compat.v1.get_collection(name) == [a.variable, b.variable]
    with pytest.raises(ValueError, match="1 to 255"):
        cfg.ascend_global_hashtable_collection = ""


def test_target_batch_keeps_its_keys_when_the_script_changes_the_dict():
    opt = gradient_descent.create_hash_optimizer(learning_rate=0.1)
    t = _table("popped", opt)
    ds = tf.data.Dataset.from_tensor_slices({"a_label": np.zeros(4, np.float32),
                                             "item": np.arange(4, dtype=np.int64),
                                             "user": np.arange(4, dtype=np.int64) + 100})
    batch = tf.compat.v1.data.make_initializable_iterator(ds.batch(2)).get_next()
    label = batch.pop("a_label")          # scripts take keys out of the batch...
    batch["extra"] = label * 2             # ...and put others in
    e = dynemb.sparse_lookup(t, batch["user"], modify_graph=True)
    _train_op(opt, tf.reduce_sum(e))
    modify_graph_and_start_emb_cache()
    target = ConfigInitializer.get_instance().train_params_config.get_target_batch(True)
    assert sorted(target) == ["a_label", "item", "user"]
    with tf.compat.v1.Session() as s:
        s.run(ConfigInitializer.get_instance().train_params_config.get_initializer(True))
        got = s.run(target)
    assert got["user"].tolist() == [100, 101] and got["item"].tolist() == [0, 1]


def test_access_threshold_above_int32_is_refused_everywhere():
    # Admission counts stop at 2^31-1 (mxRec's int32 range): a threshold above
    # would never admit a key, so every way to set one refuses it, naming the
    # argument and the range; 2^31-1 itself is taken.
    t = _table("wide", gradient_descent.create_hash_optimizer(learning_rate=1.0))
    ids = tf.constant([1], tf.int64)
    big, top = 2**31, 2**31 - 1
    with pytest.raises(ValueError, match=r"access_threshold'\] must be an int in \[0, 2\^31-1\]"):
        dynemb.sparse_lookup(t, ids, access_and_evict_config={"access_threshold": big})
    dynemb.sparse_lookup(t, ids, access_and_evict_config={"access_threshold": top})
    with pytest.raises(ValueError, match=r"access_threshold must be an int in \[0, 2\^31-1\]"):
        dynemb.FeatureSpec("wide_f", table_name="wide", access_threshold=big)
    with pytest.raises(ValueError, match=r"from 1 to 2147483647"):
        import_host_pipeline_ops().set_threshold(big, emb_name="wide")
    with pytest.raises(ValueError, match=r"threshold must be an int in \[0, 2\^31-1\]"):
        embedding.set_access_threshold(big, emb_name="wide")
    fed = tf.compat.v1.placeholder(tf.int64, [])
    op = import_host_pipeline_ops().set_threshold(fed, emb_name="wide")
    with tf.compat.v1.Session() as s:
        with pytest.raises(tf.errors.InvalidArgumentError, match="from 0 to 2147483647"):
            s.run(op, {fed: big})
        s.run(op, {fed: top})
