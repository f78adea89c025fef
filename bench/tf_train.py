"""Training throughput of the Criteo Wide&Deep model: dynemb vs TF native vs TFRA (and the bound).

    make bench-tf                      # sets up .venv-tfra if it can, then runs this
    .venv/bin/python bench/tf_train.py --json [--batch-size 1024 --steps 200 ...]

Four variants of the same model (examples/criteo_demo.py: 26 deep tables of width
--dim, one wide table of width 1 over field-aware ids, MLP 128-64-1, a linear part
on the 13 dense features), trained on the same batches with the same optimizers
(Adagrad lr 0.05, initial accumulator 0.1 on the embeddings; Adam 1e-3 on the
dense weights):

  dynemb     dynemb tables, sparse_lookup(modify_graph=True) + automatic graph
             modification (ids reach the engine in the input pipeline, ahead of
             the step), admission after --access-threshold sightings, as the demo;
             the dynemb sparse Adagrad optimizer.
  tf_native  one fixed-size tf.Variable per field ([--native-buckets, dim]; the wide
             table has --native-wide-buckets rows), ids hashed into it with a
             modulo, tf.nn.embedding_lookup, tf.compat.v1.train.AdagradOptimizer
             (TF applies IndexedSlices gradients sparsely: only looked-up rows).
  tfra       TensorFlow Recommenders-Addons dynamic_embedding (de.get_variable,
             de.embedding_lookup, de.DynamicEmbeddingOptimizer(Adagrad)), run with
             the interpreter of its own virtualenv (--tfra-python, default
             .venv-tfra/bin/python), since TFRA needs another TensorFlow.
  embedding_free
             the bound for any embedding implementation: the same model, input
             and optimizers with each table's looked-up rows replaced by a dense
             trainable [batch, dim] variable (no ids hashed or looked up, no
             sparse update; the dense Adagrad update of those few rows remains).
             Its samples/s over TF native's (`bound_vs_tf_native`) is the most
             any embedding store could reach against native on this model and
             machine: what is left of the step is the MLP, the dense optimizer,
             the executor and the input.
  dynemb_engine_left_out
             the dynemb graph on an analysis build of the op library with the
             engine's per-batch work left out (`make bench-tf` builds it: the
             unchanged kernels linked against the stand-ins of
             bench/engine_left_out.c, which write the outputs -- zero rows,
             "not admitted" tickets, 0 applied -- without calling the engine; it does
             not train). Its CPU ms per step against dynemb's is what the
             engine's own work costs the step (`engine_cpu_ms_per_step`); its
             samples/s against TF native's, `engine_left_out_vs_tf_native`,
             what dynemb's graph (prepared lookups in the input pipeline,
             tickets, applies) would reach with an engine that cost nothing.
             Skipped, with the reason in `engine_left_out_note`, when
             build/bench/engine-left-out/_dynemb_ops.so is missing.

Each variant's graph is built by one function (build_<variant>); every
measurement runs in a fresh subprocess, the variants interleaved, --repeats times;
the median is reported. Gradients are taken once for dense and sparse variables
together (one backward pass) in all of them.

Data: the training split of ../shared/data/criteo-10k.tsv (8,000 rows), parsed once
by examples/criteo_data.py (the demo's parser), then reshuffled every epoch and cut
into full batches; the steps go over the rows many times (--steps x --batch-size
samples). The batches are held in memory (a tf.data pipeline of whole batches), so
the input pipeline costs the same small amount for every variant and the
figures measure the embedding and training work. --warmup steps are not timed.

The last line of stdout is one JSON object (--json); progress goes to stderr.
Options --profile DIR write a per-op time table of one traced step per variant
(TF step stats) next to the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
VARIANTS = ("dynemb", "tf_native", "tfra", "embedding_free", "dynemb_engine_left_out")
ENGINE_LEFT_OUT_OPS_LIB = os.path.join(REPO, "build", "bench", "engine-left-out",
                                       "_dynemb_ops.so")
NUM_CAT = 26
NUM_INT = 13
CAT_NAMES = tuple(f"C{i + 1}" for i in range(NUM_CAT))
TFRA_VENV_PY = os.path.join(REPO, ".venv-tfra", "bin", "python")


def log(msg: str) -> None:
    print(f"[tf_train] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Data (parent process): parse once with the demo's parser, save batches
# ---------------------------------------------------------------------------

def prepare_data(path: Optional[str], batch: int, n_batches: int, seed: int, out: str) -> Dict:
    """Parses the train split with criteo_data and writes `n_batches` full batches
    (rows reshuffled every epoch) to `out` (.npz). Returns a description."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import numpy as np
    import tensorflow as tf
    sys.path.insert(0, EXAMPLES)
    import criteo_data

    path = criteo_data.data_path(path)
    n_train, _ = criteo_data.split_sizes(path)
    ds = criteo_data.make_dataset("train", n_train, path)  # one batch: every train row
    feats, label = next(iter(ds))
    cols = {name: feats[name].numpy() for name in CAT_NAMES}
    dense, label = feats["dense"].numpy(), label.numpy()
    rng = np.random.default_rng(seed)
    need = n_batches * batch
    order = np.concatenate([rng.permutation(n_train) for _ in range(-(-need // n_train))])[:need]
    arrays = {name: cols[name][order].reshape(n_batches, batch) for name in CAT_NAMES}
    arrays["dense"] = dense[order].reshape(n_batches, batch, NUM_INT).astype(np.float32)
    arrays["label"] = label[order].reshape(n_batches, batch).astype(np.float32)
    np.savez(out, **arrays)
    distinct = int(sum(len(np.unique(cols[n])) for n in CAT_NAMES))
    return {"data": path, "train_rows": int(n_train), "distinct_ids": distinct}


# ---------------------------------------------------------------------------
# The model (any TensorFlow >= 2.11, graph mode; no Keras)
# ---------------------------------------------------------------------------

def make_iterator(tf, data_file: str):
    """An initializable iterator over the saved batches, repeated forever."""
    import numpy as np
    z = np.load(data_file)
    arrays = {k: z[k] for k in z.files}
    label = arrays.pop("label")
    ds = tf.data.Dataset.from_tensor_slices((arrays, label)).repeat().prefetch(2)
    it = tf.compat.v1.data.make_initializable_iterator(ds)
    features, label = it.get_next()
    return it, features, label


def field_aware_ids(tf, features):
    """[batch, 26] ids of the wide table: field index above the raw 33-bit id."""
    return tf.stack([features[name] + (i << 33) for i, name in enumerate(CAT_NAMES)], axis=1)


def wide_deep_loss(tf, deep: List, wide_w, dense, label, seed: int):
    """The demo's Wide&Deep logits and loss; returns (loss, dense variables)."""
    with tf.compat.v1.variable_scope("dense"):
        x = tf.concat(deep + [dense], axis=1)

        def layer(inp, units, i, name):
            w = tf.compat.v1.get_variable(
                f"{name}/kernel", [inp.shape[1], units],
                initializer=tf.compat.v1.glorot_uniform_initializer(seed=seed + i))
            b = tf.compat.v1.get_variable(f"{name}/bias", [units],
                                          initializer=tf.compat.v1.zeros_initializer())
            return tf.matmul(inp, w) + b

        for i, units in enumerate((128, 64)):
            x = tf.nn.relu(layer(x, units, i, f"mlp{i}"))
        deep_logit = layer(x, 1, 2, "out")[:, 0]
        dense_w = layer(dense, 1, 3, "wide_dense")[:, 0]
    dense_vars = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES,
                                             scope="dense/")
    logits = deep_logit + dense_w + tf.reduce_sum(tf.reshape(wide_w, [-1, NUM_CAT]), axis=1)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))
    return loss, dense_vars


def dense_optimizer(tf):
    return tf.compat.v1.train.AdamOptimizer(1e-3)


def sparse_adagrad_tf(tf):
    return tf.compat.v1.train.AdagradOptimizer(0.05, initial_accumulator_value=0.1)


def emb_init(tf, seed: int, i: int):
    return tf.compat.v1.truncated_normal_initializer(stddev=0.05, seed=seed * 100 + i)


# ---------------------------------------------------------------------------
# Variants: each builds its graph and returns (train_op, loss, init ops)
# ---------------------------------------------------------------------------

def build_dynemb(tf, cfg: Dict) -> Dict:
    import dynemb
    from dynemb.graph.modifier import get_initializer, modify_graph_and_start_emb_cache
    from dynemb.optimizers import adagrad

    dynemb.init(use_dynamic_expansion=True)
    it, features, label = make_iterator(tf, cfg["data_file"])
    sparse_opt = adagrad.create_hash_optimizer(learning_rate=0.05, initial_accumulator_value=0.1)
    access = {"access_threshold": cfg["access_threshold"]}
    modify = cfg.get("dynemb_mode", "modify_graph") == "modify_graph"
    # --ssd-memory-rows N: every table keeps N rows in memory, the rest in an
    # SSD tier file (docs/ssd-tier.md) in a temporary directory
    tiers = ({} if not cfg.get("ssd_memory_rows") else
             {"device_vocabulary_size": 0, "host_vocabulary_size": cfg["ssd_memory_rows"],
              "ssd_vocabulary_size": 1 << 24, "ssd_data_path": cfg["ssd_dir"]})
    deep = []
    for i, name in enumerate(CAT_NAMES):
        table = dynemb.create_table(tf.int64, cfg["dim"], name, emb_init(tf, cfg["seed"], i),
                                    optimizer_list=[sparse_opt], **tiers)
        deep.append(dynemb.sparse_lookup(table, features[name], is_train=True, modify_graph=modify,
                                         access_and_evict_config=access, name=f"{name}_lookup"))
    wide = dynemb.create_table(tf.int64, 1, "wide", tf.compat.v1.zeros_initializer(),
                               optimizer_list=[sparse_opt], **tiers)
    wide_w = dynemb.sparse_lookup(wide, field_aware_ids(tf, features), is_train=True,
                                  modify_graph=modify, access_and_evict_config=access,
                                  name="wide_lookup")
    loss, dense_vars = wide_deep_loss(tf, deep, wide_w, features["dense"], label, cfg["seed"])
    sparse_vars = dynemb.get_dense_and_sparse_variable()[1]
    grads = tf.gradients(loss, dense_vars + sparse_vars)
    nd = len(dense_vars)
    train_op = tf.group(
        dense_optimizer(tf).apply_gradients(zip(grads[:nd], dense_vars)),
        sparse_opt.apply_gradients(zip(grads[nd:], sparse_vars)))
    if not modify:  # analysis aid: plain lookups (all table work in the step)
        return {"train_op": train_op, "loss": loss,
                "init": [tf.compat.v1.global_variables_initializer(), it.initializer],
                "pipeline": features}
    modify_graph_and_start_emb_cache()
    # The rebuilt pipeline's get_next (the old one is no longer initialized).
    rebuilt = [op for op in tf.compat.v1.get_default_graph().get_operations()
               if op.type == "IteratorGetNext" and op.name.startswith("dynemb_pipeline")]
    return {"train_op": train_op, "loss": loss,
            "init": [tf.compat.v1.global_variables_initializer(), get_initializer(True)],
            "pipeline": rebuilt[0].outputs}


def train_tf_tables(tf, cfg: Dict, it, features, label, deep: List, wide_w,
                    tables: List) -> Dict:
    """The loss and train op over TF variables as tables (native, embedding_free):
    Adam on the dense weights, TF's Adagrad on the tables, one backward pass."""
    loss, dense_vars = wide_deep_loss(tf, deep, wide_w, features["dense"], label, cfg["seed"])
    grads = tf.gradients(loss, dense_vars + tables)
    nd = len(dense_vars)
    train_op = tf.group(dense_optimizer(tf).apply_gradients(zip(grads[:nd], dense_vars)),
                        sparse_adagrad_tf(tf).apply_gradients(zip(grads[nd:], tables)))
    return {"train_op": train_op, "loss": loss,
            "init": [tf.compat.v1.global_variables_initializer(), it.initializer],
            "pipeline": features}


def build_tf_native(tf, cfg: Dict) -> Dict:
    it, features, label = make_iterator(tf, cfg["data_file"])
    buckets, wide_buckets = cfg["native_buckets"], cfg["native_wide_buckets"]
    deep, tables = [], []
    for i, name in enumerate(CAT_NAMES):
        var = tf.compat.v1.get_variable(f"emb_{name}", [buckets, cfg["dim"]],
                                        initializer=emb_init(tf, cfg["seed"], i))
        tables.append(var)
        deep.append(tf.nn.embedding_lookup(var, tf.math.floormod(features[name], buckets)))
    wide = tf.compat.v1.get_variable("emb_wide", [wide_buckets, 1],
                                     initializer=tf.compat.v1.zeros_initializer())
    tables.append(wide)
    wide_w = tf.nn.embedding_lookup(wide, tf.math.floormod(field_aware_ids(tf, features),
                                                           wide_buckets))
    return train_tf_tables(tf, cfg, it, features, label, deep, wide_w, tables)


def build_tfra(tf, cfg: Dict) -> Dict:
    import tensorflow_recommenders_addons.dynamic_embedding as de

    it, features, label = make_iterator(tf, cfg["data_file"])
    deep, wrappers = [], []
    for i, name in enumerate(CAT_NAMES):
        var = de.get_variable(f"emb_{name}", key_dtype=tf.int64, value_dtype=tf.float32,
                              dim=cfg["dim"], initializer=emb_init(tf, cfg["seed"], i))
        emb, tw = de.embedding_lookup(var, features[name], name=f"{name}_lookup",
                                      return_trainable=True)
        deep.append(emb)
        wrappers.append(tw)
    wide = de.get_variable("emb_wide", key_dtype=tf.int64, value_dtype=tf.float32, dim=1,
                           initializer=tf.compat.v1.zeros_initializer())
    wide_w, tw = de.embedding_lookup(wide, field_aware_ids(tf, features), name="wide_lookup",
                                     return_trainable=True)
    wrappers.append(tw)
    loss, dense_vars = wide_deep_loss(tf, deep, wide_w, features["dense"], label, cfg["seed"])
    grads = tf.gradients(loss, dense_vars + wrappers)
    nd = len(dense_vars)
    sparse_opt = de.DynamicEmbeddingOptimizer(sparse_adagrad_tf(tf))
    train_op = tf.group(dense_optimizer(tf).apply_gradients(zip(grads[:nd], dense_vars)),
                        sparse_opt.apply_gradients(zip(grads[nd:], wrappers)))
    return {"train_op": train_op, "loss": loss,
            "init": [tf.compat.v1.global_variables_initializer(), it.initializer],
            "pipeline": features}


def build_embedding_free(tf, cfg: Dict) -> Dict:
    it, features, label = make_iterator(tf, cfg["data_file"])
    rows = cfg["batch_size"]  # every saved batch is full
    deep, tables = [], []
    for i, name in enumerate(CAT_NAMES):
        var = tf.compat.v1.get_variable(f"free_{name}", [rows, cfg["dim"]],
                                        initializer=emb_init(tf, cfg["seed"], i))
        tables.append(var)
        deep.append(tf.identity(var))
    wide = tf.compat.v1.get_variable("free_wide", [rows * NUM_CAT, 1],
                                     initializer=tf.compat.v1.zeros_initializer())
    tables.append(wide)
    return train_tf_tables(tf, cfg, it, features, label, deep, tf.identity(wide), tables)


BUILDERS = {"dynemb": build_dynemb, "tf_native": build_tf_native, "tfra": build_tfra,
            "embedding_free": build_embedding_free,
            "dynemb_engine_left_out": build_dynemb}  # (its own op library: run_variant)


# ---------------------------------------------------------------------------
# Worker (one variant, one measurement, in its own process)
# ---------------------------------------------------------------------------

def step_stats_table(run_metadata, top: int = 40) -> List[Dict]:
    """Per-op wall time of one traced step, summed by op type and by node name."""
    by_type: Dict[str, List[float]] = {}
    for dev in run_metadata.step_stats.dev_stats:
        for ns in dev.node_stats:
            name = ns.node_name.split(":")[0]
            kind = ns.timeline_label.split("(")[0].split(" = ")[-1].strip() or name
            us = (ns.all_end_rel_micros or ns.op_end_rel_micros)
            rec = by_type.setdefault(kind, [0.0, 0])
            rec[0] += us
            rec[1] += 1
    rows = [{"op": k, "total_us": v[0], "count": v[1]} for k, v in by_type.items()]
    rows.sort(key=lambda r: -r["total_us"])
    return rows[:top]


def worker(cfg: Dict) -> Dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    tf.get_logger().setLevel("ERROR")
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.set_random_seed(cfg["seed"])
    variant = cfg["variant"]
    t0 = time.time()
    g = BUILDERS[variant](tf, cfg)
    conf = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=cfg["intra_threads"],
                                    inter_op_parallelism_threads=cfg["inter_threads"])
    out: Dict[str, Any] = {"variant": variant, "tf_version": tf.__version__}
    with tf.compat.v1.Session(config=conf) as sess:
        for op in g["init"]:
            sess.run(op)
        out["build_s"] = round(time.time() - t0, 2)
        # Warm-up ends with steps fetching exactly what the timed steps fetch: the
        # first run of a new fetch set builds an executor (100-300 ms).
        losses = [sess.run([g["loss"], g["train_op"]])[0]]
        for _ in range(max(cfg["warmup"] - 1, 1)):
            sess.run(g["train_op"])
        step_ms = []
        t1, c1 = time.perf_counter(), time.process_time()
        for _ in range(cfg["steps"]):
            t = time.perf_counter()
            sess.run(g["train_op"])
            step_ms.append(1000.0 * (time.perf_counter() - t))
        elapsed = time.perf_counter() - t1
        step_ms.sort()
        out["step_ms_p50_p90_max"] = [round(step_ms[len(step_ms) // 2], 2),
                                      round(step_ms[int(len(step_ms) * 0.9)], 2),
                                      round(step_ms[-1], 2)]
        cpu = time.process_time() - c1  # every thread of this process
        out["elapsed_s"] = elapsed
        out["cpu_ms_per_step"] = 1000.0 * cpu / cfg["steps"]
        out["samples_per_cpu_s"] = cfg["steps"] * cfg["batch_size"] / cpu
        out["samples_per_s"] = cfg["steps"] * cfg["batch_size"] / elapsed
        out["ms_per_step"] = 1000.0 * elapsed / cfg["steps"]
        out["loss_first"] = float(losses[0]) if losses else None
        out["loss_last"] = float(sess.run([g["loss"], g["train_op"]])[0])
        if cfg.get("profile"):
            opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            tables = []
            for _ in range(cfg["profile_steps"]):
                md = tf.compat.v1.RunMetadata()
                t2 = time.perf_counter()
                sess.run(g["train_op"], options=opts, run_metadata=md)
                tables.append((time.perf_counter() - t2, md))
            # The median step by wall time (less noise than one step), and the slowest.
            tables.sort(key=lambda x: x[0])
            wall, md = tables[len(tables) // 2]
            out["profile"] = {"traced_step_ms": 1000 * wall, "ops": step_stats_table(md),
                              "slowest_traced_step_ms": 1000 * tables[-1][0],
                              "slowest_ops": step_stats_table(tables[-1][1], 15)}
            from tensorflow.python.client import timeline
            with open(os.path.join(cfg["profile"], f"timeline_{variant}.json"), "w") as f:
                f.write(timeline.Timeline(md.step_stats).generate_chrome_trace_format())
            # Input pipeline alone (dynemb: the prepare work runs here).
            n = min(cfg["steps"], 100)
            t3 = time.perf_counter()
            for _ in range(n):
                sess.run(g["pipeline"])
            out["profile"]["pipeline_only_ms_per_batch"] = 1000 * (time.perf_counter() - t3) / n
    return out


# ---------------------------------------------------------------------------
# Parent: data, interleaved subprocess runs, medians, JSON
# ---------------------------------------------------------------------------

def run_variant(py: str, cfg: Dict, timeout: float) -> Dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONWARNINGS="ignore")
    if cfg["variant"] == "tfra":
        env.setdefault("TF_USE_LEGACY_KERAS", "1")
    if cfg["variant"] == "dynemb_engine_left_out":
        env["DYNEMB_OPS_LIB"] = ENGINE_LEFT_OUT_OPS_LIB
    proc = subprocess.run([py, os.path.abspath(__file__), "--worker", json.dumps(cfg)],
                          capture_output=True, text=True, env=env, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{cfg['variant']} worker failed (exit {proc.returncode}):\n{tail}")
    return json.loads(lines[-1])


def tfra_available(py: str) -> Optional[str]:
    """None if `py` imports TFRA's dynamic_embedding, else the reason."""
    if not os.path.exists(py):
        return (f"no TFRA virtualenv at {py} (`make bench-tf` creates .venv-tfra with "
                f"tensorflow==2.16.2 and tensorflow-recommenders-addons==0.8.1)")
    probe = ("import os; os.environ['TF_CPP_MIN_LOG_LEVEL']='2'; import tensorflow as tf; "
             "import tensorflow_recommenders_addons as t; "
             "import tensorflow_recommenders_addons.dynamic_embedding as de; "
             "print(t.__version__, tf.__version__)")
    p = subprocess.run([py, "-c", probe], capture_output=True, text=True,
                       env=dict(os.environ, TF_USE_LEGACY_KERAS="1"))
    if p.returncode != 0:
        return "importing tensorflow_recommenders_addons failed: " + \
            (p.stderr.strip().splitlines() or ["?"])[-1]
    return None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print the result as one JSON line")
    p.add_argument("--data", default=None, help="Criteo TSV (default: the demo's)")
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--steps", type=int, default=200, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=30, help="untimed steps first")
    p.add_argument("--repeats", type=int, default=5, help="measurements per variant (median)")
    p.add_argument("--access-threshold", type=int, default=2,
                   help="dynemb admission threshold (the demo's default: 2)")
    p.add_argument("--dynemb-mode", choices=("modify_graph", "plain"), default="modify_graph",
                   help="modify_graph: the demo's mode (default); plain: lookups do the "
                   "table work in the step (an analysis aid)")
    p.add_argument("--native-buckets", type=int, default=2**18,
                   help="rows of each native deep table (ids modulo this)")
    p.add_argument("--native-wide-buckets", type=int, default=2**22,
                   help="rows of the native wide table")
    p.add_argument("--intra-threads", type=int, default=0, help="TF intra-op threads (0: auto)")
    p.add_argument("--inter-threads", type=int, default=0, help="TF inter-op threads (0: auto)")
    p.add_argument("--ssd-memory-rows", type=int, default=0, metavar="N",
                   help="dynemb variant: each table keeps N rows in memory and the rest in "
                        "an SSD tier file in a temporary directory (0: no tier)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--tfra-python", default=TFRA_VENV_PY)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="also trace steps (TF step stats) and write per-op tables + timelines")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def source_version() -> Dict:
    """The commit of this tree (with "-dirty" when it has changes) and a hash
    of the op library the dynemb workers load, so that a recorded figure
    names the code that produced it."""
    out: Dict = {"commit": None, "ops_lib": None, "ops_lib_sha256": None}
    try:
        rev = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=10)
        if rev.returncode == 0:
            dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain",
                                    "--untracked-files=no"],
                                   capture_output=True, text=True, timeout=10).stdout.strip()
            out["commit"] = rev.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    lib = os.environ.get("DYNEMB_OPS_LIB") or os.path.join(REPO, "build", "tf",
                                                          "_dynemb_ops.so")
    if os.path.isfile(lib):
        import hashlib
        with open(lib, "rb") as f:
            out["ops_lib"] = lib
            out["ops_lib_sha256"] = hashlib.sha256(f.read()).hexdigest()[:16]
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return 0
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        log(f"unknown variants {bad}; known: {list(VARIANTS)}")
        return 2
    tfra_note = None
    left_out_note = None
    if "dynemb_engine_left_out" in variants and not os.path.isfile(ENGINE_LEFT_OUT_OPS_LIB):
        left_out_note = (f"no analysis op library at {ENGINE_LEFT_OUT_OPS_LIB} "
                         f"(`make bench-tf` builds it)")
        log(f"dynemb_engine_left_out skipped: {left_out_note}")
        variants.remove("dynemb_engine_left_out")
    if "tfra" in variants:
        tfra_note = tfra_available(args.tfra_python)
        if tfra_note:
            log(f"tfra skipped: {tfra_note}")
            variants.remove("tfra")
    load_before = os.getloadavg()[0]
    tmp = tempfile.mkdtemp(prefix="dynemb_tf_train_")
    data_file = os.path.join(tmp, "batches.npz")
    n_batches = min(args.warmup + args.steps + 1, 64)
    info = prepare_data(args.data, args.batch_size, n_batches, args.seed, data_file)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    base = {"data_file": data_file, "batch_size": args.batch_size, "dim": args.dim,
            "steps": args.steps, "warmup": args.warmup, "seed": args.seed,
            "access_threshold": args.access_threshold, "dynemb_mode": args.dynemb_mode,
            "native_buckets": args.native_buckets,
            "native_wide_buckets": args.native_wide_buckets,
            "intra_threads": args.intra_threads, "inter_threads": args.inter_threads,
            "profile": None, "profile_steps": args.profile_steps,
            "ssd_memory_rows": args.ssd_memory_rows, "ssd_dir": os.path.join(tmp, "ssd")}
    try:
        runs, tfra_note = measure(args, base, variants, tfra_note)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if runs is None:
        return 1
    report(args, runs, tfra_note, info, load_before, left_out_note)
    return 0


def measure(args, base: Dict, variants: List[str], tfra_note: Optional[str]):
    """Runs every variant --repeats times, interleaved; (runs by variant, tfra_note)."""
    runs: Dict[str, List[Dict]] = {v: [] for v in variants}
    for rep in range(args.repeats):
        for v in variants:
            cfg = dict(base, variant=v)
            if args.profile and rep == args.repeats - 1:
                cfg["profile"] = os.path.abspath(args.profile)
            py = args.tfra_python if v == "tfra" else sys.executable
            try:
                r = run_variant(py, cfg, timeout=1800)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                log(str(e))
                if v == "tfra":
                    tfra_note = f"TFRA installed but its run failed: {str(e).splitlines()[-1]}"
                    runs.pop("tfra", None)
                    variants = [x for x in variants if x != "tfra"]
                    continue
                return None, tfra_note
            runs[v].append(r)
            log(f"rep {rep + 1}/{args.repeats} {v:14s} {r['samples_per_s']:10,.0f} samples/s "
                f"({r['ms_per_step']:.1f} ms/step, {r['cpu_ms_per_step']:.1f} CPU ms/step, "
                f"p50/p90/max {r['step_ms_p50_p90_max']} ms, loss {r['loss_first']:.4f} -> "
                f"{r['loss_last']:.4f}, TF {r['tf_version']})")
    return runs, tfra_note


def report(args, runs: Dict[str, List[Dict]], tfra_note: Optional[str], info: Dict,
           load_before: float, left_out_note: Optional[str] = None) -> None:
    median = {v: statistics.median(r["samples_per_s"] for r in rs) for v, rs in runs.items() if rs}
    per_cpu = {v: statistics.median(r["samples_per_cpu_s"] for r in rs)
               for v, rs in runs.items() if rs}
    if args.profile:
        for v, rs in runs.items():
            prof = rs[-1].get("profile") if rs else None
            if prof:
                with open(os.path.join(args.profile, f"ops_{v}.json"), "w") as f:
                    json.dump(prof, f, indent=1)
                log(f"{v}: median traced step {prof['traced_step_ms']:.1f} ms, input pipeline "
                    f"alone {prof['pipeline_only_ms_per_batch']:.1f} ms/batch; top ops (us):")
                for row in prof["ops"][:15]:
                    log(f"    {row['op']:45s} {row['total_us']:9.0f}  x{row['count']}")
                log(f"{v}: slowest traced step {prof['slowest_traced_step_ms']:.1f} ms; top ops:")
                for row in prof["slowest_ops"][:8]:
                    log(f"    {row['op']:45s} {row['total_us']:9.0f}  x{row['count']}")

    if runs.get("tfra") and not tfra_note:
        tfra_note = (f"tensorflow-recommenders-addons {_tfra_version(args.tfra_python)} on "
                     f"TensorFlow {runs['tfra'][0]['tf_version']} ({args.tfra_python})")

    def ratio(a: str, b: str) -> Optional[float]:
        return round(median[a] / median[b], 3) if a in median and b in median else None

    def paired(a: str, b: str) -> Optional[float]:
        """Median over repeats of a/b within the same repeat (interleaved runs share
        the machine's load of the moment)."""
        if not (runs.get(a) and runs.get(b)):
            return None
        return round(statistics.median(x["samples_per_s"] / y["samples_per_s"]
                                       for x, y in zip(runs[a], runs[b])), 3)

    cpu_ms = {v: statistics.median(r["cpu_ms_per_step"] for r in rs)
              for v, rs in runs.items() if rs}
    engine_ms = (round(cpu_ms["dynemb"] - cpu_ms["dynemb_engine_left_out"], 2)
                 if "dynemb" in cpu_ms and "dynemb_engine_left_out" in cpu_ms else None)
    result = {
        "benchmark": "tf_train",
        "dynemb_samples_per_s": round(median["dynemb"]) if "dynemb" in median else None,
        "tf_native_samples_per_s": round(median["tf_native"]) if "tf_native" in median else None,
        "tfra_samples_per_s": round(median["tfra"]) if "tfra" in median else None,
        "vs_tf_native": ratio("dynemb", "tf_native"),
        "vs_tfra": ratio("dynemb", "tfra"),
        "tfra_note": tfra_note,
        "vs_tf_native_paired": paired("dynemb", "tf_native"),
        "vs_tfra_paired": paired("dynemb", "tfra"),
        # The same model with free embeddings (see the module doc): the most that
        # any embedding store could reach against TF native here.
        "embedding_free_samples_per_s": (round(median["embedding_free"])
                                         if "embedding_free" in median else None),
        "bound_vs_tf_native": ratio("embedding_free", "tf_native"),
        "bound_vs_tf_native_paired": paired("embedding_free", "tf_native"),
        # The dynemb graph with an engine that costs nothing (module doc).
        "dynemb_engine_left_out_samples_per_s": (
            round(median["dynemb_engine_left_out"])
            if "dynemb_engine_left_out" in median else None),
        "engine_left_out_vs_tf_native": ratio("dynemb_engine_left_out", "tf_native"),
        "engine_left_out_vs_tf_native_paired": paired("dynemb_engine_left_out", "tf_native"),
        "engine_cpu_ms_per_step": engine_ms,
        "engine_left_out_note": left_out_note,
        # Samples per CPU-second (all threads of the process): steadier than wall
        # time when other work shares the machine.
        "samples_per_cpu_s": {v: round(x) for v, x in per_cpu.items()},
        "cpu_vs_tf_native": (round(per_cpu["dynemb"] / per_cpu["tf_native"], 3)
                             if "dynemb" in per_cpu and "tf_native" in per_cpu else None),
        "cpu_vs_tfra": (round(per_cpu["dynemb"] / per_cpu["tfra"], 3)
                        if "dynemb" in per_cpu and "tfra" in per_cpu else None),
        "config": {
            "model": "Wide&Deep (26 deep tables + wide table, MLP 128-64-1)",
            "batch_size": args.batch_size, "dim": args.dim, "steps": args.steps,
            "warmup_steps": args.warmup, "repeats": args.repeats, "statistic": "median",
            "dynemb_access_threshold": args.access_threshold, "dynemb_mode": args.dynemb_mode,
            "dynemb_ssd_memory_rows": args.ssd_memory_rows or None,
            "native_buckets": args.native_buckets,
            "native_wide_buckets": args.native_wide_buckets,
            "sparse_optimizer": "Adagrad(lr=0.05, initial_accumulator_value=0.1)",
            "dense_optimizer": "Adam(1e-3)",
            "intra_threads": args.intra_threads, "inter_threads": args.inter_threads,
            "cpus": os.cpu_count(), "machine": platform.machine(),
            "python": platform.python_version(),
            "loadavg_1min_before_after": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "source": source_version(),
            **info,
        },
        "runs": {v: [{k: r[k] for k in ("samples_per_s", "ms_per_step", "samples_per_cpu_s",
                                       "cpu_ms_per_step", "step_ms_p50_p90_max", "loss_first",
                                       "loss_last", "build_s", "tf_version")} for r in rs]
                 for v, rs in runs.items()},
    }
    if args.json:
        print(json.dumps(result), flush=True)
    else:
        print(json.dumps(result, indent=1), flush=True)


def _tfra_version(py: str) -> str:
    p = subprocess.run([py, "-c", "import importlib.metadata as m; "
                        "print(m.version('tensorflow-recommenders-addons'))"],
                       capture_output=True, text=True)
    return p.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
