"""Table statistics in TensorBoard and the log: the summaries that
TableStatsHook adds are written by MonitoredTrainingSession's own summary
saver and read back from the event file; the values equal the engine's
counters (the reference: dynemb._lib.table_stats after the run, and the ids
the test fed); the hook logs one line per table."""
import glob
import logging

import numpy as np
import tensorflow as tf

import dynemb
from dynemb.optimizers import gradient_descent

STEPS = 4


def _events(model_dir):
    """{tag: {step: value}} of every scalar in the event files of model_dir."""
    out = {}
    for path in glob.glob(f"{model_dir}/events.out.tfevents.*"):
        for e in tf.compat.v1.train.summary_iterator(path):
            for v in e.summary.value:
                out.setdefault(v.tag, {})[e.step] = v.simple_value
    return out


def test_table_statistics_reach_tensorboard_and_the_log(tmp_path, caplog):
    opt = gradient_descent.create_hash_optimizer(0.1)
    t = dynemb.create_table(tf.int64, 2, "watched", tf.compat.v1.zeros_initializer(),
                            optimizer_list=[opt])
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    emb = dynemb.sparse_lookup(t, ids, access_and_evict_config={"access_threshold": 2})
    gs = tf.compat.v1.train.get_or_create_global_step()
    _, sparse = dynemb.get_dense_and_sparse_variable()
    train = opt.apply_gradients(zip(tf.gradients(tf.reduce_sum(emb), sparse), sparse),
                                global_step=gs)
    hook = dynemb.TableStatsHook(every_n_steps=1)
    # step k sees ids 100+k*10 .. 104+k*10 once, and id 1 every step: after STEPS
    # steps only id 1 has reached the threshold of 2 sightings.
    logger = logging.getLogger("dynemb")
    logger.propagate = True
    try:
        with caplog.at_level(logging.INFO, logger="dynemb"):
            with tf.compat.v1.train.MonitoredTrainingSession(
                    checkpoint_dir=str(tmp_path), hooks=[hook], save_summaries_steps=1,
                    save_checkpoint_secs=None, log_step_count_steps=None) as s:
                for k in range(STEPS):
                    s.run(train, {ids: np.r_[np.arange(100 + k * 10, 105 + k * 10), 1]})
    finally:
        logger.propagate = False
    stats = dynemb._lib.table_stats("watched")
    assert stats["size"] == 1 and stats["candidates"] == 5 * STEPS
    ev = _events(tmp_path)
    size, below = ev["dynemb/watched/size"], ev["dynemb/watched/below_threshold"]
    assert max(size) >= STEPS - 1  # one value per saved step
    last = max(size)
    # (the summaries run in the step's session.run, before or after its
    # lookup: the last one shows the table after the last step or before it)
    assert size[last] == stats["size"]
    assert below[last] in (5 * (STEPS - 1), 5 * STEPS)
    assert ev["dynemb/watched/admitted"][last] == stats["inserted"]
    assert ev["dynemb/watched/memory_hit_rate"][last] == 1.0
    for fig in ("capacity", "evicted", "ssd_rows"):
        assert f"dynemb/watched/{fig}" in ev
    lines = [r.getMessage() for r in caplog.records if "table 'watched'" in r.getMessage()]
    assert len(lines) >= STEPS
    assert "1 rows" in lines[-1] and "%d below the threshold" % (5 * STEPS) in lines[-1]
