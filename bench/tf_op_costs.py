"""CPU cost of the embedding ops of one training step: dynemb vs TF native.

    .venv/bin/python bench/tf_op_costs.py --json [--batch-size 1024 --dim 16]

Companion of bench/tf_train.py: it explains its figures op by op. The step of the
Criteo Wide&Deep model touches 27 tables (26 deep tables with --batch-size ids,
one wide table with 26 x --batch-size field-aware ids). Each group of ops below is
built for all 27 tables on real Criteo batches and run alone, in one thread
(intra- and inter-op parallelism 1), after the tables hold every id of the data;
its cost is the process CPU time per batch minus that of feeding the same inputs
to a no-op. dynemb's groups are the ones automatic graph modification builds
(dynemb.graph.rewrite); native's are what tf.nn.embedding_lookup and
tf.compat.v1.train.AdagradOptimizer run.

  dynemb (pipeline)  prepare          DynembPrepare (admission count, insert, stamp;
                                      an admission ticket per id: where its row is)
  dynemb (step)      lookup_prepared  DynembLookup reading rows through the tickets
                     apply_prepared   DynembApply (Adagrad) finding rows by ticket
  dynemb (by key)    lookup, apply    the same ops finding rows by key (plain-mode
                                      reads, and the fallback filter's apply)
  native (step)      hash             floormod
                     gather           ResourceGather
                     sparse_adagrad   Unique + UnsortedSegmentSum + ResourceSparseApplyAdagrad

Each figure is the median of --rounds rounds of --runs batches. The last line of
stdout is one JSON object (--json); progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf_train  # noqa: E402  (data preparation and table names)


def table_ids(arrays, batches: int) -> List:
    """Each of the 27 tables' ids as a [batches, ids per batch] array: the 26
    deep tables', then the wide table's (the field index above the raw id,
    tf_train.field_aware_ids)."""
    import numpy as np
    wide = np.stack([arrays[n] + (i << 33) for i, n in enumerate(tf_train.CAT_NAMES)], axis=2)
    return [arrays[n] for n in tf_train.CAT_NAMES] + [wide.reshape(batches, -1)]


def dump_ids(path: str, arrays, batches: int, dim: int) -> None:
    """The 27 tables' ids of every batch, in bench/step_costs.c's format: int32
    batches, int32 tables, per table int32 ids per batch and int32 dim, then per
    table its [batches][ids] int64 ids."""
    import struct
    import numpy as np
    tables = table_ids(arrays, batches)
    dims = [dim] * tf_train.NUM_CAT + [1]
    with open(path, "wb") as f:
        f.write(struct.pack("<ii", batches, len(tables)))
        for t, d in zip(tables, dims):
            f.write(struct.pack("<ii", t.shape[1], d))
        for t in tables:
            f.write(np.ascontiguousarray(t, dtype=np.int64).tobytes())
    print(f"[tf_op_costs] wrote the ids of {batches} batches to {path}", file=sys.stderr)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true")
    p.add_argument("--data", default=None)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--batches", type=int, default=32)
    p.add_argument("--runs", type=int, default=40, help="batches per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--access-threshold", type=int, default=2)
    p.add_argument("--dump-ids", default=None, metavar="FILE",
                   help="only write the batches' ids for build/step_costs (bench/step_costs.c) "
                        "to FILE and exit")
    args = p.parse_args(argv)

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    with tempfile.TemporaryDirectory(prefix="dynemb_op_costs_") as tmp:
        data_file = os.path.join(tmp, "batches.npz")
        info = tf_train.prepare_data(args.data, args.batch_size, args.batches, 1, data_file)
        import numpy as np
        z = np.load(data_file)
        arrays = {k: z[k] for k in z.files}
    if args.dump_ids:
        dump_ids(args.dump_ids, arrays, args.batches, args.dim)
        return 0
    import tensorflow as tf
    import dynemb
    from dynemb.graph import rewrite
    from dynemb.optimizers import adagrad

    tf.get_logger().setLevel("ERROR")
    tf.compat.v1.disable_eager_execution()
    dynemb.init(use_dynamic_expansion=True)
    B, names = args.batch_size, list(tf_train.CAT_NAMES) + ["wide"]
    dims = [args.dim] * tf_train.NUM_CAT + [1]
    sizes = [B] * tf_train.NUM_CAT + [B * tf_train.NUM_CAT]
    tables = table_ids(arrays, args.batches)
    batches = [[t[b] for t in tables] for b in range(args.batches)]
    ids = [tf.compat.v1.placeholder(tf.int64, [n], name=f"ids_{t}") for n, t in zip(sizes, names)]
    rng = np.random.default_rng(0)
    grads = [tf.constant(rng.standard_normal((n, d)).astype(np.float32) * 0.01)
             for n, d in zip(sizes, dims)]

    opt = adagrad.create_hash_optimizer(learning_rate=0.05, initial_accumulator_value=0.1)
    tables = [dynemb.create_table(tf.int64, d, t, tf.compat.v1.truncated_normal_initializer(
        stddev=0.05, seed=i), optimizer_list=[opt]) for i, (t, d) in enumerate(zip(names, dims))]
    from dynemb.core.embedding import set_access_threshold
    for t in names:
        set_access_threshold(args.access_threshold, emb_name=t)
    now = tf.constant(0, tf.int64)
    ops = dynemb._lib.ops
    lr = tf.constant(0.05)
    prepared = [rewrite.prepare(t, i, now) for t, i in zip(names, ids)]
    tickets = [tf.compat.v1.placeholder(tf.int64, [n], name=f"tickets_{t}")
               for n, t in zip(sizes, names)]
    none = tf.zeros([0], tf.int64)
    lookups = [ops.dynemb_lookup(ids=i, now=now, anchor=tb.anchor, tickets=none, table_name=t,
                                 is_train=False)[0]
               for t, i, tb in zip(names, ids, tables)]
    lookups_prepared = [ops.dynemb_lookup(ids=i, now=now, anchor=tb.anchor, tickets=k,
                                          use_tickets=True, table_name=t, is_train=False)[0]
                        for t, i, tb, k in zip(names, ids, tables, tickets)]

    native_vars = [tf.compat.v1.get_variable(f"native_{t}", [2**18 if t != "wide" else 2**22, d],
                                             initializer=tf.compat.v1.zeros_initializer())
                   for t, d in zip(names, dims)]
    hashed = [tf.math.floormod(i, v.shape[0]) for i, v in zip(ids, native_vars)]
    native_adagrad = tf.compat.v1.train.AdagradOptimizer(0.05, initial_accumulator_value=0.1)
    groups = {
        "dynemb.prepare": prepared,
        "dynemb.lookup": lookups,
        "dynemb.lookup_prepared": lookups_prepared,
        "dynemb.apply": [ops.dynemb_apply(keys=i, grads=g, learning_rate=lr, trainable=none,
                                          tickets=none, table_name=t)
                         for i, g, t in zip(ids, grads, names)],
        "dynemb.apply_prepared": [ops.dynemb_apply(keys=i, grads=g, learning_rate=lr,
                                                   trainable=none, tickets=k, use_tickets=True,
                                                   table_name=t)
                                  for i, g, k, t in zip(ids, grads, tickets, names)],
        "native.hash": hashed,
        "native.hash+gather": [tf.nn.embedding_lookup(v, h) for v, h in zip(native_vars, hashed)],
        "native.hash+sparse_adagrad": native_adagrad.apply_gradients(
            [(tf.IndexedSlices(g, h), v) for g, h, v in zip(grads, hashed, native_vars)]),
    }
    conf = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1,
                                    inter_op_parallelism_threads=1)
    feeds = [dict(zip(ids, b)) for b in batches]
    cost = {}
    with tf.compat.v1.Session(config=conf) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for _ in range(max(args.access_threshold, 1)):  # every id gets its row
            for f in feeds:
                f.update(zip(tickets, sess.run(prepared, f)))  # (no eviction: places stay valid)
        for name, fetch in [("feed", tf.no_op())] + list(groups.items()):
            for f in feeds[:5]:
                sess.run(fetch, f)
            rounds = []
            for r in range(args.rounds):
                c0 = time.process_time()
                for i in range(args.runs):
                    sess.run(fetch, feeds[(r * args.runs + i) % len(feeds)])
                rounds.append(1000.0 * (time.process_time() - c0) / args.runs)
            cost[name] = statistics.median(rounds)
            print(f"[tf_op_costs] {name:32s} {cost[name] - cost.get('feed', 0):6.2f} CPU ms/batch",
                  file=sys.stderr, flush=True)
    feed = cost.pop("feed")
    c = {k: v - feed for k, v in cost.items()}
    result = {
        "benchmark": "tf_op_costs", "unit": "CPU ms per batch (27 tables), one thread",
        "dynemb": {
            "pipeline.prepare": c["dynemb.prepare"],
            "step.lookup_prepared": c["dynemb.lookup_prepared"],
            "step.apply_prepared": c["dynemb.apply_prepared"],
        },
        "dynemb_by_key": {
            "step.lookup": c["dynemb.lookup"],
            "step.apply": c["dynemb.apply"],
        },
        "native": {
            "step.hash": c["native.hash"],
            "step.gather": c["native.hash+gather"] - c["native.hash"],
            "step.sparse_adagrad": c["native.hash+sparse_adagrad"] - c["native.hash"],
        },
        "config": {"batch_size": B, "dim": args.dim, "ids_per_batch": sum(sizes),
                   "access_threshold": args.access_threshold, "runs": args.runs,
                   "rounds": args.rounds, "statistic": "median", "feed_ms": feed, **info},
    }
    for side in ("dynemb", "dynemb_by_key", "native"):
        result[side] = {k: round(v, 3) for k, v in result[side].items()}
        result[side]["total"] = round(sum(result[side].values()), 3)
    print(json.dumps(result) if args.json else json.dumps(result, indent=1), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
