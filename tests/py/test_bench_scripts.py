"""The TensorFlow benchmark programs still run and print what BENCHMARKS.md
records (tiny runs; no speed is checked: figures come from `make bench-tf`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# What the bench programs print does not depend on the TensorFlow version.
pytestmark = pytest.mark.pinned_only(reason="bench programs: run on the pinned TensorFlow "
                                     "only (suite time)")


def _last_json(*args: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_tf_train_json():
    j = _last_json("bench/tf_train.py", "--json", "--variants",
                   "dynemb,tf_native,embedding_free,dynemb_engine_left_out", "--repeats", "1",
                   "--steps", "6", "--warmup", "2")
    assert j["dynemb_samples_per_s"] > 0 and j["tf_native_samples_per_s"] > 0
    assert j["vs_tf_native"] > 0 and j["tfra_samples_per_s"] is None
    assert j["embedding_free_samples_per_s"] > 0 and j["bound_vs_tf_native"] > 0
    for v in ("dynemb", "embedding_free"):
        (run,) = j["runs"][v]
        assert run["loss_last"] < run["loss_first"], v  # it trains
    assert j["config"]["source"]["ops_lib_sha256"]
    # `make test` builds the analysis library (as `make bench-tf` does)
    assert j["engine_left_out_note"] is None and j["dynemb_engine_left_out_samples_per_s"] > 0
    assert j["engine_left_out_vs_tf_native"] > 0
    assert isinstance(j["engine_cpu_ms_per_step"], float)
    assert not [k for k in j if "hollow" in k]


def test_tf_op_costs_json():
    j = _last_json("bench/tf_op_costs.py", "--json", "--batches", "2", "--runs", "2",
                   "--rounds", "1", "--batch-size", "64")
    for side, keys in (("dynemb", ("pipeline.prepare", "step.lookup_prepared",
                                   "step.apply_prepared")),
                       ("dynemb_by_key", ("step.lookup", "step.apply")),
                       ("native", ("step.hash", "step.gather", "step.sparse_adagrad"))):
        assert set(keys) <= set(j[side]), side
        assert j[side]["total"] == round(sum(j[side][k] for k in keys), 3)


def test_step_costs_reads_dumped_ids(tmp_path):
    """bench/tf_op_costs.py --dump-ids feeds build/step_costs (make bench-step)."""
    ids = str(tmp_path / "ids.bin")
    r = subprocess.run([sys.executable, "bench/tf_op_costs.py", "--dump-ids", ids,
                        "--batches", "2", "--batch-size", "64"], capture_output=True,
                       text=True, timeout=300, cwd=ROOT,
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert os.path.getsize(ids) == 8 + 27 * 8 + 2 * (26 + 26) * 64 * 8  # wide: 26 ids a row
    exe = os.path.join(ROOT, "build", "step_costs")
    r = subprocess.run([exe, ids, "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert j["ids_per_batch"] == 52 * 64 and j["tables"] == 27 and j["batches"] == 2
    assert all(j[k] > 0 for k in ("prepare", "lookup_prepared", "apply_prepared",
                                  "route_2_owners"))


# Three steps of one table's sparse training, on the op library that
# DYNEMB_OPS_LIB names, through the training path of bench/tf_train.py
# (ids prepared in the input pipeline, prepared lookup, prepared apply): prints
# the sum of the looked-up rows at each step and the table's rows at the end.
_TRAIN_ONE_TABLE = """
import json
import numpy as np
import tensorflow as tf
import dynemb
from dynemb.graph.modifier import get_initializer, modify_graph_and_start_emb_cache
from dynemb.optimizers import adagrad

tf.compat.v1.disable_eager_execution()
dynemb.init(use_dynamic_expansion=True)
ids = tf.data.Dataset.from_tensors(np.arange(64, dtype=np.int64) * 7919).repeat()
batch = tf.compat.v1.data.make_initializable_iterator(ids).get_next()
opt = adagrad.create_hash_optimizer(learning_rate=0.1, initial_accumulator_value=0.1)
table = dynemb.create_table(tf.int64, 4, "t", tf.compat.v1.constant_initializer(0.5),
                            optimizer_list=[opt])
emb = dynemb.sparse_lookup(table, batch, is_train=True, modify_graph=True,
                           access_and_evict_config={"access_threshold": 1})
loss = tf.reduce_sum(emb)
sparse_vars = dynemb.get_dense_and_sparse_variable()[1]
train = opt.apply_gradients(zip(tf.gradients(loss, sparse_vars), sparse_vars))
modify_graph_and_start_emb_cache()
with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    sess.run(get_initializer(True))
    sums = [float(sess.run([loss, train])[0]) for _ in range(3)]
print(json.dumps({"sums": sums, "rows": int(table.size())}))
"""


def test_engine_left_out_library_trains_nothing():
    """The op library of bench/tf_train.py's dynemb_engine_left_out variant
    (built by `make bench-tf` and `make test`) reads zero rows, inserts none
    and updates none; the product's op library, on the same script, trains."""
    trained = {}
    for variant, lib in (("product", "build/tf/_dynemb_ops.so"),
                         ("engine_left_out", "build/bench/engine-left-out/_dynemb_ops.so")):
        r = subprocess.run([sys.executable, "-c", _TRAIN_ONE_TABLE], capture_output=True,
                           text=True, timeout=300, cwd=ROOT,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                                    DYNEMB_OPS_LIB=os.path.join(ROOT, lib)))
        assert r.returncode == 0, r.stderr[-3000:]
        trained[variant] = json.loads(r.stdout.strip().splitlines()[-1])
    product, left_out = trained["product"], trained["engine_left_out"]
    assert product["rows"] == 64 and product["sums"][0] == 64 * 4 * 0.5, product
    assert product["sums"][2] < product["sums"][1] < product["sums"][0], product
    assert left_out == {"sums": [0.0, 0.0, 0.0], "rows": 0}, left_out


@pytest.mark.skipif(not shutil.which("mpirun") or not os.path.isfile(
    os.path.join(ROOT, "build", "bench", "exchange_bench")),
    reason="needs Open MPI's mpirun and build/bench/exchange_bench (make test builds it)")
@pytest.mark.pinned_only
def test_ranks_json():
    j = _last_json("bench/ranks.py", "--ranks", "2", "--tables", "2", "--batch", "64",
                   "--steps", "3", "--warmup", "1", "--json")
    assert j["step_ms_1"] > 0 and j["step_ms_N"] > 0 and j["speedup"] > 0
    # the exchange's own counter against the formula the projection uses
    assert abs(j["bytes_per_rank_step"] / j["bytes_model"] - 1) < 0.05, j
    assert j["exchanges_per_step"] == 3 * 2 + 2
    assert j["link_bytes_per_s"] > 0 and j["empty_exchange_us"] > 0
    assert [p["ranks"] for p in j["projection"]] == [8, 16, 32, 64]
    # unique keys once each way: the lookups' bytes near the least possible
    assert 1.0 <= j["forward_over_minimum"] < 1.3, j
    assert j["mpi_ms_per_step"] > 0
