"""Wide & Deep CTR model on Criteo with dynemb tables and automatic graph modification.

    make demo                       # or: .venv/bin/python examples/criteo_demo.py [--help]

The model (examples/criteo_model.py, shared with criteo_estimator.py): one dynamic
table per categorical field (C1..C26) feeds the deep part; the raw 32-bit hash
values are the ids (no vocabulary, no modulo): tables start empty and grow as ids
arrive. A "wide" table holds one weight per (field, id). Ids must be seen
`--access-threshold` times before they get a trainable row (feature admission);
until then they read zeros.

The script is written like an mxRec sess.run script: lookups with
``modify_graph=True``, then ``modify_graph_and_start_emb_cache()`` rebuilds the
input pipelines so that each batch's ids reach the engine ahead of the step, and
``sess.run(get_initializer(True/False))`` starts the train / eval pipelines.
Data: the first 10,000 lines of the Criteo Display Advertising Challenge training
set (published by Criteo for non-commercial research); the last 20 % is held out.

Several ranks (``make demo RANKS=2``, i.e. ``mpirun -np 2 .venv/bin/python
examples/criteo_demo.py``): the tables are sharded across the ranks, and each
rank reads its slice of every global batch (the same global batches as one
process). The lookups exchange their ids with the rows' owners inside the
step (the pipeline that prepares batches ahead is one process's, so far), the
dense gradients are summed over ranks, every rank starts from rank 0's dense
variables, and rank 0 prints the progress and the held-out AUC of all ranks'
predictions (docs/distributed.md).

``--export DIR`` ends the run by writing the trained model as a SavedModel that
stock TensorFlow serves without dynemb (TensorFlow Serving, ``saved_model_cli``,
``tf.saved_model.load``): the tables become ordinary hash tables and variables
(docs/serving.md); on several ranks rank 0 writes it with every rank's rows.
``--predictions FILE`` writes the last epoch's held-out probabilities (NumPy, in
file order), e.g. to compare a served model with.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", message=".*tf.layers.dense.* is deprecated")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import criteo_data  # noqa: E402
import criteo_model  # noqa: E402
from criteo_model import auc, build_model  # noqa: E402,F401  (auc: used by the tests)

import dynemb  # noqa: E402
from dynemb.graph.modifier import get_initializer, modify_graph_and_start_emb_cache  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=None, help=f"Criteo TSV (default ${criteo_data.ENV_VAR} "
                   f"or {criteo_data.DEFAULT_PATH})")
    p.add_argument("--epochs", type=int, default=6)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--dim", type=int, default=8, help="embedding width of the deep tables")
    p.add_argument("--access-threshold", type=int, default=2,
                   help="occurrences before an id gets a trainable row (0/1: at once)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--export", default=None, metavar="DIR",
                   help="write the trained model as a SavedModel to DIR (must not exist)")
    p.add_argument("--predictions", default=None, metavar="FILE",
                   help="write the last epoch's held-out probabilities to FILE (.npy)")
    p.add_argument("--ssd-dir", default=None,
                   help="put each table's rows beyond --memory-rows in an SSD tier file here")
    p.add_argument("--memory-rows", type=int, default=1000,
                   help="rows each table keeps in memory with --ssd-dir (default 1000)")
    args = p.parse_args(argv)
    if args.ssd_dir is not None and args.memory_rows < 1:
        p.error("--memory-rows must be >= 1 with --ssd-dir")
    return args


def progress(epoch: int, epochs: int, step: int, steps: int, loss: float, rate: float) -> None:
    width = 30
    done = int(width * step / max(steps, 1))
    line = (f"epoch {epoch}/{epochs} [{'#' * done}{'.' * (width - done)}] "
            f"{step}/{steps}  loss {loss:.4f}  {rate:,.0f} samples/s")
    if sys.stdout.isatty():
        print("\r" + line, end="\n" if step == steps else "", flush=True)
    elif step == steps or step % 10 == 0:
        print(line, flush=True)


def rank_slice(rank: int, ranks: int):
    """A dataset map: this rank's slice of each global batch, [r*n/N, (r+1)*n/N),
    with the global batch's size in features["global_rows"] (for the loss)."""
    def take(features, label):
        rows = tf.shape(label, out_type=tf.int64)[0]
        lo, hi = rows * rank // ranks, rows * (rank + 1) // ranks
        out = {k: v[lo:hi] for k, v in features.items()}
        out["global_rows"] = rows
        return out, label[lo:hi]
    return take


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        path = criteo_data.data_path(args.data)
    except FileNotFoundError as e:
        print(f"criteo_demo: {e}", file=sys.stderr)
        return 2
    n_train, n_eval = criteo_data.split_sizes(path)
    steps = -(-n_train // args.batch_size)
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.set_random_seed(args.seed)
    dynemb.init(use_dynamic_expansion=True)
    rank, ranks = dynemb.get_rank_id(), dynemb.get_rank_size()
    say = print if rank == 0 else (lambda *a, **k: None)

    datasets = [criteo_data.make_dataset("train", args.batch_size, path, shuffle_seed=args.seed),
                criteo_data.make_dataset("eval", args.batch_size, path)]
    if ranks > 1:
        datasets = [ds.map(rank_slice(rank, ranks)) for ds in datasets]
    train_it, eval_it = (tf.compat.v1.data.make_initializable_iterator(ds) for ds in datasets)
    train_x, train_y = train_it.get_next()
    eval_x, eval_y = eval_it.get_next()

    sparse_opt = criteo_model.sparse_optimizer()
    tables, wide = criteo_model.create_tables(args.dim, args.seed, sparse_opt,
                                              args.ssd_dir, args.memory_rows)
    access_cfg = {"access_threshold": args.access_threshold}

    _, loss = build_model(train_x, train_y, tables, wide, True, access_cfg, args.seed)
    eval_pred, _ = build_model(eval_x, eval_y, tables, wide, False, access_cfg, args.seed)
    train_op = criteo_model.train_op(loss, sparse_opt)

    modify_graph_and_start_emb_cache()
    start_train, start_eval = get_initializer(True), get_initializer(False)
    same_start = dynemb.broadcast_global_variables()  # (rank 0's; a no-op alone)

    say(f"Criteo: {n_train} train / {n_eval} held-out rows from {path}"
        + (f", on {ranks} ranks (each a slice of every batch)" if ranks > 1 else ""))
    say(f"model: Wide&Deep, {len(tables)} deep tables (dim {args.dim}) + wide table, "
        f"admission after {args.access_threshold} sightings")
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(same_start)
        t_all, seen = time.time(), 0
        for epoch in range(1, args.epochs + 1):
            sess.run(start_train)
            t0, n, step, losses = time.time(), 0, 0, []
            while True:
                try:
                    lv, _ = sess.run([loss, train_op])
                except tf.errors.OutOfRangeError:
                    break
                step += 1
                losses.append(lv)
                n += min(args.batch_size, n_train - (step - 1) * args.batch_size)
                if rank == 0:  # (n, the loss: the global batch's; the ranks' loss summed)
                    progress(epoch, args.epochs, step, steps,
                             float(np.mean(losses[-10:])) * ranks, n / (time.time() - t0))
            seen += n
            sess.run(start_eval)
            preds = []
            while True:
                try:
                    preds.append(sess.run([eval_pred, eval_y]))
                except tf.errors.OutOfRangeError:
                    break
            # every rank's held-out predictions (one process: its own), in
            # the file's order: batch by batch, each batch's rank slices
            parts = dynemb.allgather_object((preds, float(np.mean(losses))))
            p = np.concatenate([np.concatenate([pr[i][0] for pr, _ in parts])
                                for i in range(len(preds))])
            y = np.concatenate([np.concatenate([pr[i][1] for pr, _ in parts])
                                for i in range(len(preds))])
            train_loss = sum(lv for _, lv in parts)
            say(f"epoch {epoch}: train loss {train_loss:.4f}  held-out AUC "
                f"{auc(y, p):.4f}  logloss {criteo_model.logloss(y, p):.4f}")
        elapsed = time.time() - t_all
        if args.predictions and rank == 0:
            np.save(args.predictions, p)
        if args.export:
            # A serving head on placeholders, sharing the trained tables and
            # dense layers; the export turns its lookups into stock ops.
            serve_x = criteo_model.serving_inputs()
            serve_p, _ = build_model(serve_x, None, tables, wide, False, access_cfg, args.seed,
                                     modify_graph=False)
            dynemb.export_saved_model(sess, args.export, inputs=serve_x,
                                      outputs={"probability": serve_p})
            say(f"SavedModel for serving written to {args.export}")
    # (several ranks: each holds a shard; the figures are summed over ranks)
    sizes = {name: sum(dynemb.allgather_object(t.size())) for name, t in tables.items()}
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    wide_stats = dynemb.allgather_object(wide.stats())
    say(f"trained {seen} samples in {elapsed:.1f} s ({seen / elapsed:,.0f} samples/s incl. "
        f"evaluation{f', {ranks} ranks' if ranks > 1 else ''})")
    say(f"table rows: deep total {sum(sizes.values()):,} (largest: "
        + ", ".join(f"{k} {v:,}" for k, v in biggest)
        + f"), wide {sum(s['size'] for s in wide_stats):,}")
    say(f"wide table: {sum(s['rejected'] for s in wide_stats):,} sightings read the default "
        f"value before admission, {sum(s['candidates'] for s in wide_stats):,} ids still "
        f"waiting for admission")
    if args.ssd_dir is not None:
        all_stats = [t.stats() for t in list(tables.values()) + [wide]]
        where = args.ssd_dir if ranks == 1 else f"{args.ssd_dir}, rank {rank}"
        print(f"SSD tier ({where}): {sum(s['host_rows'] for s in all_stats):,} rows in "
              f"memory, {sum(s['ssd_rows'] for s in all_stats):,} on SSD; "
              f"{sum(s['ssd_reads'] for s in all_stats):,} rows read from and "
              f"{sum(s['ssd_writes'] for s in all_stats):,} written to the files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
