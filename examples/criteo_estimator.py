"""Wide & Deep CTR model on Criteo with a TensorFlow Estimator: automatic graph
modification (GraphModifierHook), eviction (EvictHook) and warm start.

    .venv/bin/python examples/criteo_estimator.py [--help]

Two runs, as a daily retraining job does them (the model is examples/criteo_model.py,
the same as the sess.run demo examples/criteo_demo.py):

1. "day 1": an Estimator trains on the first half of the training rows
   (model_dir DIR/day1) and is evaluated on the held-out rows (AUC).
2. "day 2": a new Estimator with an empty model_dir (DIR/day2) and
   ``warm_start_from=tf.estimator.WarmStartSettings(DIR/day1)`` starts from day 1's
   checkpoint -- the 27 dynemb tables and the dense layers -- trains on the second
   half, and is evaluated again. EvictHook removes ids not seen for
   --eviction-threshold steps (ids that only appeared on day 1 go first), and
   admission keeps ids out of the tables until seen --access-threshold times.
   For comparison, day 2 is also trained from scratch (--no-cold skips that).

``--export DIR`` then writes the day-2 model with ``estimator.export_saved_model``:
a SavedModel that stock TensorFlow serves without dynemb (docs/serving.md);
``--predictions FILE`` writes day 2's held-out probabilities (NumPy, file order).

The script is a plain ``tf.estimator.Estimator`` script: ``import dynemb`` makes
TensorFlow's warm start (which Estimator calls) load dynemb tables too, also for
mxRec's multi-path form (lists of paths; see docs/warm-start.md).
Data: the first 10,000 lines of the Criteo Display Advertising Challenge training
set (published by Criteo for non-commercial research); the last 20 % is held out.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("DYNEMB_LOG_LEVEL", "WARNING")
warnings.filterwarnings("ignore")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import criteo_data  # noqa: E402
import criteo_model  # noqa: E402

import dynemb  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=None, help=f"Criteo TSV (default ${criteo_data.ENV_VAR} "
                   f"or {criteo_data.DEFAULT_PATH})")
    p.add_argument("--model-dir", default=None,
                   help="where day1/ and day2/ go (default: a temporary directory, removed)")
    p.add_argument("--epochs", type=int, default=3, help="epochs over each day's rows")
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--dim", type=int, default=8, help="embedding width of the deep tables")
    p.add_argument("--access-threshold", type=int, default=2,
                   help="occurrences before an id gets a trainable row (0/1: at once)")
    p.add_argument("--eviction-threshold", type=int, default=24,
                   help="global steps without a sighting after which an id is evicted")
    p.add_argument("--evict-step-interval", type=int, default=8,
                   help="EvictHook runs the eviction every this many steps")
    p.add_argument("--no-cold", action="store_true", help="skip training day 2 from scratch")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--export", default=None, metavar="DIR",
                   help="write the day-2 model as a SavedModel under DIR")
    p.add_argument("--predictions", default=None, metavar="FILE",
                   help="write day 2's held-out probabilities to FILE (.npy)")
    return p.parse_args(argv)


def model_fn(features, labels, mode, params):
    sparse_opt = criteo_model.sparse_optimizer()
    tables, wide = criteo_model.create_tables(params["dim"], params["seed"], sparse_opt)
    is_train = mode == tf.estimator.ModeKeys.TRAIN
    access_cfg = {"access_threshold": params["access_threshold"],
                  "eviction_threshold": params["eviction_threshold"]}
    probs, loss = criteo_model.build_model(features, labels, tables, wide, is_train,
                                           access_cfg, params["seed"])
    if mode == tf.estimator.ModeKeys.PREDICT:
        out = {"prob": probs}
        if "label" in features:  # (the held-out pipeline's; requests have none)
            out["label"] = features["label"]
        return tf.estimator.EstimatorSpec(mode, predictions=out)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    op = criteo_model.train_op(loss, sparse_opt, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=op)


def input_fn(args, path, split, part=None, epochs=1):
    def fn():
        ds = criteo_data.make_dataset(split, args.batch_size, path, part=part, epochs=epochs,
                                      shuffle_seed=args.seed if split == "train" else None)
        if split == "eval":  # predict mode gets no labels: keep them as a feature
            ds = ds.map(lambda x, y: (dict(x, label=y), y))
        return ds
    return fn


def evaluate(est, args, path) -> tuple:
    preds = list(est.predict(input_fn(args, path, "eval"), hooks=[dynemb.GraphModifierHook()]))
    p = np.array([r["prob"] for r in preds])
    y = np.array([r["label"] for r in preds])
    return criteo_model.auc(y, p), criteo_model.logloss(y, p), p


def serving_input_fn():
    x = criteo_model.serving_inputs()
    return tf.estimator.export.ServingInputReceiver(x, x)


def rows() -> int:
    names = list(criteo_data.CAT_NAMES) + ["wide"]
    return sum(dynemb._lib.table_stats(n)["size"] for n in names)  # noqa: SLF001


def run_day(name, args, path, model_dir, part, warm_start_from=None) -> dict:
    """Trains one Estimator on `part` of the training rows; returns its figures."""
    dynemb.clear_tables()  # as a new process would: no table until created or loaded
    params = {k: getattr(args, k) for k in ("dim", "seed", "access_threshold",
                                            "eviction_threshold")}
    config = tf.estimator.RunConfig(tf_random_seed=args.seed, log_step_count_steps=None,
                                    save_summary_steps=None, save_checkpoints_steps=10**9)
    est = tf.estimator.Estimator(model_fn, model_dir=model_dir, params=params, config=config,
                                 warm_start_from=warm_start_from)
    evict = dynemb.EvictHook(evict_enable=True, evict_time_interval=None,
                             evict_step_interval=args.evict_step_interval)
    t0 = time.time()
    est.train(input_fn(args, path, "train", part, args.epochs),
              hooks=[dynemb.GraphModifierHook(), evict])
    seconds = time.time() - t0
    size = rows()
    auc, logloss, probs = evaluate(est, args, path)
    out = {"steps": est.get_variable_value("global_step"), "seconds": seconds, "rows": size,
           "evicted": evict.evicted_total, "auc": auc, "logloss": logloss, "probs": probs,
           "estimator": est}
    print(f"{name}: {out['steps']} steps in {seconds:.1f} s, {size:,} table rows, "
          f"{out['evicted']:,} evicted; held-out AUC {auc:.4f}  logloss {logloss:.4f}",
          flush=True)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    try:
        path = criteo_data.data_path(args.data)
    except FileNotFoundError as e:
        print(f"criteo_estimator: {e}", file=sys.stderr)
        return 2
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    dynemb.init(use_dynamic_expansion=True)
    base = args.model_dir or tempfile.mkdtemp(prefix="criteo_estimator_")
    n_train, n_eval = criteo_data.split_sizes(path)
    print(f"Criteo: {n_train} train rows (day 1: first half, day 2: second half), {n_eval} "
          f"held-out rows, from {path}")
    print(f"model: Wide&Deep, 26 deep tables (dim {args.dim}) + wide table; admission after "
          f"{args.access_threshold} sightings, eviction after {args.eviction_threshold} idle "
          f"steps (checked every {args.evict_step_interval})")
    try:
        day1 = os.path.join(base, "day1")
        first = run_day("day 1", args, path, day1, (0, 2))
        ckpt = tf.train.latest_checkpoint(day1)
        print(f"day 2 warm-starts from {ckpt}: its {first['rows']:,} table rows and the "
              f"dense layers")
        warm = run_day("day 2 (warm start)", args, path, os.path.join(base, "day2"), (1, 2),
                       warm_start_from=tf.estimator.WarmStartSettings(day1, ".*"))
        if args.predictions:
            np.save(args.predictions, warm["probs"])
        if args.export:
            out = warm["estimator"].export_saved_model(args.export, serving_input_fn)
            print(f"day 2's SavedModel for serving: {out.decode()}")
        if not args.no_cold:
            cold = run_day("day 2 (from scratch)", args, path, os.path.join(base, "day2_cold"),
                           (1, 2))
            print(f"warm start vs from scratch on day 2: AUC {warm['auc']:.4f} vs "
                  f"{cold['auc']:.4f}")
    finally:
        if args.model_dir is None:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
