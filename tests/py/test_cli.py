"""The `dynemb` command-line tool: `bench` (a tiny run: its JSON is complete
and self-consistent, bad arguments are refused by name) and `ckpt inspect` /
`ckpt verify` on a checkpoint written by the engine, and on parts of one that
do not agree. (Checkpoints that ranks wrote under mpirun:
test_incremental_checkpoints.py and test_sharded_training.py.) No speed is
checked here: speed is what `make bench` measures (BENCHMARKS.md)."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess

import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb import _lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = os.path.join(ROOT, "build", "dynemb")

pytestmark = pytest.mark.skipif(not os.access(CLI, os.X_OK),
                                reason="build/dynemb not built (make all)")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=120)


def test_bench_json_is_complete_and_consistent():
    r = _run("bench", "--rows", "20000", "--dim", "8", "--batch", "512", "--dist",
             "zipf:1.05", "--threads", "2", "--json", "--min-time", "0.02",
             "--stall-batch", "256", "--optimizer", "adam")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    rates = ["lookup_keys_per_s", "lookup_eval_keys_per_s", "lookup_prepared_keys_per_s",
             "insert_keys_per_s", "apply_adam_keys_per_s", "apply_prepared_keys_per_s",
             "gather_limit_rows_per_s", "adam_limit_rows_per_s"]
    for k in rates:
        assert j[k] > 0, k
    assert j["lookup_vs_gather"] == pytest.approx(
        j["lookup_keys_per_s"] / j["gather_limit_rows_per_s"], abs=2e-3)
    assert j["apply_vs_adam_limit"] == pytest.approx(
        j["apply_adam_keys_per_s"] / j["adam_limit_rows_per_s"], abs=2e-3)
    assert j["apply_prepared_vs_adam_limit"] == pytest.approx(
        j["apply_prepared_keys_per_s"] / j["adam_limit_rows_per_s"], abs=2e-3)
    # The stall pass ran: its longest call is at least its own CPU time.
    assert j["max_stall_ms"] >= j["max_stall_call_cpu_ms"] * 0.99 > 0
    assert 0 < j["bytes_per_row_overhead"] < 200
    assert j["stall_batch"] == 256
    # ...and so did its limit: writing 20000 rows' bytes (dim 8 + Adam's m, v)
    # of fresh memory, 256 rows' worth per call.
    assert j["touch_limit_max_call_ms"] > 0 and j["touch_limit_bytes_per_s"] > 0
    stall, touch = j["max_stall_ms"], j["touch_limit_max_call_ms"]
    # (both printed to 0.001 ms: the ratio of the rounded figures may differ)
    assert j["max_stall_vs_touch_limit"] == pytest.approx(
        stall / touch, rel=1e-3 + 1e-3 / touch + 1e-3 / stall, abs=1e-3)


def test_bench_with_an_ssd_tier(tmp_path):
    r = _run("bench", "--rows", "20000", "--dim", "8", "--batch", "512", "--dist",
             "uniform", "--threads", "2", "--json", "--min-time", "0.02", "--skip-stall",
             "--host-rows", "5000", "--ssd-dir", str(tmp_path), "--ssd-cold")
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    c = j["ssd_cold"]  # the same reads right after the files' pages were dropped
    assert c["batches_per_thread"] == 4 and c["read_limit_rows_per_s"] > 0
    assert c["lookup_eval_keys_per_s"] > 0 and c["lookup_keys_per_s"] > 0
    assert c["lookup_eval_vs_read_limit"] == pytest.approx(
        c["lookup_eval_keys_per_s"] / c["read_limit_rows_per_s"], abs=2e-3)
    t = j["ssd_tier"]
    assert t["host_rows"] == 5000 and t["record_bytes"] == 8 * 3 * 4
    assert t["rows_in_memory_end"] + t["rows_on_ssd_end"] == j["stats"]["size"] == 20000
    assert t["rows_on_ssd_end"] >= 15000 - 2  # (two threads may overshoot briefly)
    assert t["ssd_reads"] > 0 and t["ssd_writes"] >= 15000
    assert t["ssd_read_limit_rows_per_s"] > 0
    assert t["lookup_vs_ssd_read_limit"] == pytest.approx(
        j["lookup_keys_per_s"] / t["ssd_read_limit_rows_per_s"], abs=2e-3)
    assert os.listdir(tmp_path) == []  # both files are anonymous
    plain = _run("bench", "--rows", "2000", "--dim", "4", "--batch", "64", "--dist",
                 "uniform", "--threads", "1", "--json", "--min-time", "0.01",
                 "--skip-stall")
    assert json.loads(plain.stdout)["ssd_tier"] is None
    assert json.loads(plain.stdout)["ssd_cold"] is None
    bad = _run("bench", "--rows", "2000", "--dim", "4", "--batch", "64", "--dist",
               "uniform", "--threads", "1", "--ssd-cold")
    assert bad.returncode == 2 and "--ssd-cold" in bad.stderr


@pytest.mark.parametrize("args, names", [
    (["--dist", "pareto"], "--dist"),
    (["--rows", "0"], "--rows"),
    (["--threads", "0"], "--threads"),
    (["--init", "gaussian"], "--init"),
    (["--host-rows", "10"], "--ssd-dir"),
    (["--host-rows", "5000", "--ssd-dir", "/tmp"], "--host-rows"),
])
def test_bench_refuses_bad_arguments_by_name(args, names):
    base = {"--rows": "1000", "--dim": "4", "--batch": "64", "--dist": "uniform",
            "--threads": "1"}
    base.update(dict(zip(args[::2], args[1::2])))
    r = _run("bench", *[x for kv in base.items() for x in kv], "--json")
    assert r.returncode != 0
    assert names in r.stderr, r.stderr


def test_ckpt_inspect_and_verify(tmp_path):
    dynemb.init(use_dynamic_expansion=True)
    table = dynemb.create_table(tf.int64, 4, "cli_t", tf.compat.v1.constant_initializer(0.25))
    emb = dynemb.sparse_lookup(table, tf.constant(np.arange(30, dtype=np.int64)))
    with tf.compat.v1.Session() as s:
        s.run(emb)
    h = _lib.find_table("cli_t")
    try:
        tables = (ctypes.c_void_p * 1)(h)
        _lib.check(_lib.clib.dynemb_checkpoint_save(str(tmp_path).encode(), tables, 1))
    finally:
        _lib.clib.dynemb_table_release(h)
    r = _run("ckpt", "inspect", "--json", str(tmp_path))
    assert r.returncode == 0, r.stderr
    (entry,) = json.loads(r.stdout)["tables"]
    assert (entry["name"], entry["rows"], entry["dim"], entry["optimizer"]) == \
        ("cli_t", 30, 4, "sgd")
    assert entry["format_version"] >= 1
    r = _run("ckpt", "verify", str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    # A flipped byte in a data file: verify fails and names the file.
    files = sorted(p for p in tmp_path.rglob("*") if p.is_file() and "MANIFEST" not in p.name)
    victim = max(files, key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    r = _run("ckpt", "verify", str(tmp_path))
    assert r.returncode != 0
    assert victim.name in r.stdout + r.stderr


def _save(path, *tables):
    """An engine checkpoint of empty (name, dim) tables, into path."""
    handles = []
    try:
        for name, dim in tables:
            h = ctypes.c_void_p()
            c = _lib.TableConfig()
            _lib.clib.dynemb_table_config_init(ctypes.byref(c))
            c.name, c.dim = name.encode(), dim
            _lib.check(_lib.clib.dynemb_table_create(ctypes.byref(c), ctypes.byref(h)))
            handles.append(h)
        arr = (ctypes.c_void_p * len(handles))(*[h.value for h in handles])
        _lib.check(_lib.clib.dynemb_checkpoint_save(str(path).encode(), arr, len(handles)))
    finally:
        for (name, _), h in zip(tables, handles):
            _lib.clib.dynemb_table_release(h)
            _lib.clib.dynemb_table_drop(name.encode())


def test_ckpt_tools_check_that_the_parts_agree(tmp_path):
    """Parts of one checkpoint must hold the same tables alike: a part that
    lacks a table, or holds it with another dim, fails verify naming the part
    and the table; inspect shows it and says so."""
    _save(tmp_path / "c" / "rank-0-of-2", ("a", 4), ("b", 4))
    _save(tmp_path / "c" / "rank-1-of-2", ("a", 4))
    r = _run("ckpt", "verify", str(tmp_path / "c"))
    assert r.returncode == 1 and "part rank-1-of-2" in r.stderr and "'b'" in r.stderr, r.stderr
    r = _run("ckpt", "inspect", "--json", str(tmp_path / "c"))
    assert r.returncode == 0 and "lacks table 'b'" in r.stderr
    assert {t["name"]: t["parts"] for t in json.loads(r.stdout)["tables"]} == {"a": 2, "b": 1}
    _save(tmp_path / "d" / "rank-0-of-2", ("a", 4))
    _save(tmp_path / "d" / "rank-1-of-2", ("a", 8))
    r = _run("ckpt", "verify", str(tmp_path / "d"))
    assert r.returncode == 1 and "dim 8" in r.stderr and "rank-1-of-2" in r.stderr, r.stderr
    r = _run("ckpt", "export", str(tmp_path / "d"), str(tmp_path / "out"))
    assert r.returncode == 1 and "dim 8 in part rank-1-of-2" in r.stderr, r.stderr
