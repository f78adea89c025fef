"""What an incremental checkpoint costs against a full one.

    make bench-incremental     # or: .venv/bin/python bench/incremental.py --json

One table of --rows rows of width --dim (Adagrad: one slot per row), filled by
train lookups; a full save (save_tables(..., incremental=True) the first
time); then --changed of the rows get a gradient and a delta is saved; then
the delta is restored (its chain: the full save, then the delta) against
restoring a full save of the same moment.

Reported (the last stdout line is one JSON object with --json):
  plain_full_s              a full save that no delta builds on (the baseline)
  full_s, full_bytes        the first incremental save (a full one, whose
                            rows are also fingerprinted for the next delta),
  tracked_over_plain_full_s and its time against the baseline
  delta_s, delta_bytes      the delta after changing --changed of the rows
  delta_over_full_bytes     their ratio (the rows changed are changed / rows)
  delta_over_full_s         the delta's time against the full save's: a delta
                            fingerprints every row (one pass, as a full save
                            reads every row) and writes only the changed ones
  restore_chain_s, restore_full_s, restore_chain_over_full
                            restoring the chain against a full checkpoint of
                            the same moment
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("DYNEMB_LOG_LEVEL", "WARNING")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import dynemb  # noqa: E402
from dynemb.optimizers import adagrad  # noqa: E402


def du(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=10_000_000)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--changed", type=float, default=0.01, help="share of rows changed")
    p.add_argument("--work", default=None)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    tf.compat.v1.disable_eager_execution()
    dynemb.init()
    work = args.work or tempfile.mkdtemp(prefix="dynemb-bench-incremental-")
    out = {"rows": args.rows, "dim": args.dim, "changed": args.changed,
           "machine_cores": os.cpu_count()}
    try:
        opt = adagrad.create_hash_optimizer(0.1)
        t = dynemb.create_table(tf.int64, args.dim, "inc", tf.compat.v1.random_uniform_initializer(
            -0.1, 0.1, seed=1), optimizer_list=[opt])
        ids = tf.compat.v1.placeholder(tf.int64, [None])
        rows = dynemb.sparse_lookup(t, ids)
        fill = tf.reduce_sum(rows[:1])
        train = opt.minimize(tf.reduce_sum(rows))
        keys = np.arange(args.rows, dtype=np.int64) * 7919 + 13
        with tf.compat.v1.Session() as s:
            for i in range(0, args.rows, 1 << 20):
                s.run(fill, {ids: keys[i:i + (1 << 20)]})
            t0 = time.perf_counter()
            dynemb.save_tables(os.path.join(work, "plain"), [t])
            out["plain_full_s"] = time.perf_counter() - t0
            shutil.rmtree(os.path.join(work, "plain"))
            t0 = time.perf_counter()
            dynemb.save_tables(os.path.join(work, "full"), [t], incremental=True)
            out["full_s"] = time.perf_counter() - t0
            out["tracked_over_plain_full_s"] = out["full_s"] / out["plain_full_s"]
            out["full_bytes"] = du(os.path.join(work, "full"))
            n = int(args.rows * args.changed)
            changed = np.random.default_rng(1).choice(keys, n, replace=False)
            for i in range(0, n, 1 << 18):
                s.run(train, {ids: changed[i:i + (1 << 18)]})
            t0 = time.perf_counter()
            dynemb.save_tables(os.path.join(work, "delta"), [t], incremental=True)
            out["delta_s"] = time.perf_counter() - t0
            out["delta_bytes"] = du(os.path.join(work, "delta"))
            dynemb.save_tables(os.path.join(work, "ref"), [t])  # (starts a new chain)
        t0 = time.perf_counter()
        dynemb.restore_tables(os.path.join(work, "delta"), [t])
        out["restore_chain_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        dynemb.restore_tables(os.path.join(work, "ref"), [t])
        out["restore_full_s"] = time.perf_counter() - t0
        out["delta_over_full_bytes"] = out["delta_bytes"] / out["full_bytes"]
        out["delta_over_full_s"] = out["delta_s"] / out["full_s"]
        out["restore_chain_over_full"] = out["restore_chain_s"] / out["restore_full_s"]
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()},
              flush=True)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
