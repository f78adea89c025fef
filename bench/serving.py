"""What exporting for serving costs, and what the served model's lookups cost.

    make bench-serving        # or: .venv/bin/python bench/serving.py --json

Two models, each trained (or filled) in this process, then exported with
dynemb.export_saved_model and loaded back with TensorFlow's own loader in a
graph of stock ops only:

  demo   the Criteo demo's Wide&Deep model (examples/criteo_model.py), one
         epoch over the demo data; requests are held-out batches of --batch rows;
  big    one table of --rows rows of width --dim (SGD), filled by train
         lookups of --rows distinct keys; requests are --lookup-batch keys,
         9 in 10 of them in the table.

Reported per model (the last stdout line is one JSON object with --json):
  export_s, checkpoint_s, export_over_checkpoint
                      export time against a Saver checkpoint of the same
                      session (tables and dense variables), the baseline;
  savedmodel_bytes, checkpoint_bytes, savedmodel_over_checkpoint, and
  savedmodel_over_rows the SavedModel against the checkpoint (which also
                      holds optimizer state and admission counts) and against
                      the bytes of the tables' keys and embeddings alone;
  load_s              loading the SavedModel (restore + filling the hash tables
                      and rows from the assets);
  served_ms, eval_ms, served_over_eval
                      median time of one request through the served model
                      against the same request through the training graph's
                      eval lookups (DynembLookup) in the training session;
  max_abs_diff        between the two (0 expected; floats, at most rounding).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("DYNEMB_LOG_LEVEL", "WARNING")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import criteo_data  # noqa: E402
import criteo_model  # noqa: E402

import dynemb  # noqa: E402
from dynemb.optimizers import gradient_descent  # noqa: E402

SERVE = tf.compat.v1.saved_model.tag_constants.SERVING


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def median_ms(fn, repeat: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measure(sess, inputs, outputs, requests, work, repeat) -> dict:
    """Export and checkpoint `sess`, load the export, time `requests` (feeds
    by input name) through both."""
    out = {}
    t0 = time.perf_counter()
    tf.compat.v1.train.Saver().save(sess, os.path.join(work, "ckpt", "model"))
    out["checkpoint_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    dynemb.export_saved_model(sess, os.path.join(work, "served"), inputs, outputs)
    out["export_s"] = time.perf_counter() - t0
    out["export_over_checkpoint"] = out["export_s"] / out["checkpoint_s"]
    out["savedmodel_bytes"] = du(os.path.join(work, "served"))
    out["checkpoint_bytes"] = du(os.path.join(work, "ckpt"))
    out["savedmodel_over_checkpoint"] = out["savedmodel_bytes"] / out["checkpoint_bytes"]
    (name,) = outputs
    fetch = outputs[name]
    eval_ms = []
    ref = []
    for req in requests:
        feed = {inputs[k]: v for k, v in req.items()}
        eval_ms.append(median_ms(lambda f=feed: sess.run(fetch, f), repeat))
        ref.append(sess.run(fetch, feed))
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        t0 = time.perf_counter()
        mg = tf.compat.v1.saved_model.loader.load(s, [SERVE], os.path.join(work, "served"))
        out["load_s"] = time.perf_counter() - t0
        sig = mg.signature_def["serving_default"]
        served_ms, diff = [], 0.0
        for req, r in zip(requests, ref):
            feed = {sig.inputs[k].name: v for k, v in req.items()}
            served_ms.append(median_ms(lambda f=feed: s.run(sig.outputs[name].name, f), repeat))
            diff = max(diff, float(np.abs(s.run(sig.outputs[name].name, feed) - r).max()))
    out["served_ms"] = statistics.median(served_ms)
    out["eval_ms"] = statistics.median(eval_ms)
    out["served_over_eval"] = out["served_ms"] / out["eval_ms"]
    out["max_abs_diff"] = diff
    return out


def demo(args, work) -> dict:
    path = criteo_data.data_path(args.data)
    with tf.Graph().as_default():
        it = tf.compat.v1.data.make_initializable_iterator(
            criteo_data.make_dataset("train", 256, path, shuffle_seed=1))
        x, y = it.get_next()
        opt = criteo_model.sparse_optimizer()
        tables, wide = criteo_model.create_tables(8, 1, opt)
        cfg = {"access_threshold": 2}
        _, loss = criteo_model.build_model(x, y, tables, wide, True, cfg, 1)
        train = criteo_model.train_op(loss, opt)
        serve_x = criteo_model.serving_inputs()
        prob, _ = criteo_model.build_model(serve_x, None, tables, wide, False, cfg, 1,
                                           modify_graph=False)
        dynemb.modify_graph_and_start_emb_cache()
        eval_it = tf.compat.v1.data.make_one_shot_iterator(
            criteo_data.make_dataset("eval", args.batch, path))
        eval_x = eval_it.get_next()[0]
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(dynemb.get_initializer(True))
            while True:
                try:
                    sess.run(train)
                except tf.errors.OutOfRangeError:
                    break
            requests = []
            while True:
                try:
                    requests.append(sess.run(eval_x))
                except tf.errors.OutOfRangeError:
                    break
            requests = [r for r in requests if len(r["dense"]) == args.batch]
            out = measure(sess, serve_x, {"probability": prob}, requests, work, args.repeat)
        rows = sum(t.size() for t in list(tables.values()) + [wide])
        out["table_rows"] = rows
        out["savedmodel_over_rows"] = out["savedmodel_bytes"] / (
            sum(t.size() * (8 + 4 * t.dim) for t in list(tables.values()) + [wide]))
    dynemb.clear_tables()
    return out


def big(args, work) -> dict:
    with tf.Graph().as_default():
        opt = gradient_descent.create_hash_optimizer(0.1)
        t = dynemb.create_table(tf.int64, args.dim, "big", tf.compat.v1.random_uniform_initializer(
            -0.1, 0.1, seed=1), optimizer_list=[opt])
        ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
        fill = dynemb.sparse_lookup(t, ids, is_train=True)
        fill = tf.reduce_sum(fill[:1])  # (inserts every key; returns little)
        served = dynemb.sparse_lookup(t, ids, is_train=False)
        keys = np.arange(args.rows, dtype=np.int64) * 7919 + 13
        rng = np.random.default_rng(1)
        with tf.compat.v1.Session() as sess:
            t0 = time.perf_counter()
            for i in range(0, args.rows, 1 << 20):
                sess.run(fill, {ids: keys[i:i + (1 << 20)]})
            fill_s = time.perf_counter() - t0
            requests = []
            for _ in range(4):
                r = rng.choice(keys, args.lookup_batch)
                r[::10] = -1 - rng.integers(0, 1 << 40, len(r[::10]))  # not in the table
                requests.append({"ids": r})
            out = measure(sess, {"ids": ids}, {"rows": served}, requests, work, args.repeat)
        out["table_rows"] = t.size()
        out["fill_s"] = fill_s
        out["savedmodel_over_rows"] = out["savedmodel_bytes"] / (t.size() * (8 + 4 * args.dim))
    dynemb.clear_tables()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=None)
    p.add_argument("--batch", type=int, default=512, help="demo request rows")
    p.add_argument("--rows", type=int, default=10_000_000, help="rows of the big table")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--lookup-batch", type=int, default=4096, help="keys per big request")
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--work", default=None, help="directory for the files (default: a "
                   "temporary one, removed)")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    dynemb.init()
    work = args.work or tempfile.mkdtemp(prefix="dynemb-bench-serving-")
    try:
        out = {"machine_cores": os.cpu_count(), "tf": tf.__version__}
        for name, fn in (("demo", demo), ("big", big)):
            d = os.path.join(work, name)
            os.makedirs(d, exist_ok=True)
            out[name] = fn(args, d)
            print("%s: %s" % (name, {k: round(v, 4) if isinstance(v, float) else v
                                     for k, v in out[name].items()}), flush=True)
            shutil.rmtree(d, ignore_errors=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
