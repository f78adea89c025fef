"""The TensorFlow benchmark programs still run and print what BENCHMARKS.md
records (tiny runs; no speed is checked: figures come from `make bench-tf`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _last_json(*args: str) -> dict:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    r = subprocess.run([sys.executable, *args], capture_output=True, text=True,
                       timeout=300, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_tf_train_json():
    j = _last_json("bench/tf_train.py", "--json", "--variants",
                   "dynemb,tf_native,embedding_free,dynemb_hollow", "--repeats", "1",
                   "--steps", "6", "--warmup", "2")
    assert j["dynemb_samples_per_s"] > 0 and j["tf_native_samples_per_s"] > 0
    assert j["vs_tf_native"] > 0 and j["tfra_samples_per_s"] is None
    assert j["embedding_free_samples_per_s"] > 0 and j["bound_vs_tf_native"] > 0
    for v in ("dynemb", "embedding_free"):
        (run,) = j["runs"][v]
        assert run["loss_last"] < run["loss_first"], v  # it trains
    assert j["config"]["source"]["ops_lib_sha256"]
    # `make test` builds the analysis library (make ops-hollow)
    assert j["hollow_note"] is None and j["dynemb_hollow_samples_per_s"] > 0
    assert j["hollow_vs_tf_native"] > 0 and isinstance(j["engine_cpu_ms_per_step"], float)


def test_tf_op_costs_json():
    j = _last_json("bench/tf_op_costs.py", "--json", "--batches", "2", "--runs", "2",
                   "--rounds", "1", "--batch-size", "64")
    for side, keys in (("dynemb", ("pipeline.prepare_hints", "step.lookup_hinted",
                                   "step.apply_hinted")),
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
    assert all(j[k] > 0 for k in ("prepare_hints", "lookup_hinted", "apply_hinted"))


def test_hollow_library_says_what_it_is():
    """The analysis op library of `make ops-hollow` warns when loaded; the real one does not."""
    code = "import dynemb._lib as l; print('HOLLOW', l.HOLLOW)"
    for lib, hollow in (("build/tf-hollow/_dynemb_ops.so", True), ("build/tf/_dynemb_ops.so", False)):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=300, cwd=ROOT,
                           env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
                                    DYNEMB_OPS_LIB=os.path.join(ROOT, lib)))
        assert r.returncode == 0, r.stderr[-2000:]
        assert f"HOLLOW {hollow}" in r.stdout
        assert ("analysis build of `make ops-hollow`" in r.stderr) == hollow, r.stderr[-2000:]
