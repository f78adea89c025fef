"""A rank that stops, dies or raises never hangs the others
(tests/py/mpi/fault.py, under mpirun on 2 ranks, exchange timeout 4 s):
the job ends within a bound, with an error (on the others, when the faulty
rank lives on) that names the faulty rank, and a rank that stops on an
uncaught error ends the job (dynemb._comm: MPI_Abort)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "mpi" / "fault.py"
SHARDED_LIB = ROOT / "build" / "tf" / "_dynemb_sharded_ops.so"
TIMEOUT_S = 4

pytestmark = [pytest.mark.skipif(
    not shutil.which("mpirun") or not SHARDED_LIB.is_file(),
    reason="needs Open MPI's mpirun and build/tf/_dynemb_sharded_ops.so "
           "(apt-get install openmpi-bin libopenmpi-dev; make ops)"),
    pytest.mark.pinned_only]


def _launch(fault, results_dir):
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
               TF_CPP_MIN_LOG_LEVEL="2", RESULTS=str(results_dir), FAULT=fault,
               DYNEMB_EXCHANGE_TIMEOUT=str(TIMEOUT_S))
    start = time.time()
    p = subprocess.run(["timeout", "-k", "5", "120", "mpirun", "--oversubscribe",
                        "--allow-run-as-root", "-np", "2", sys.executable, str(SCRIPT)],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    took = time.time() - start
    results = {int(f.stem): json.loads(f.read_text()) for f in results_dir.glob("*.json")}
    return p, took, results


def test_a_stalled_rank_makes_the_other_fail_naming_it(tmp_path):
    p, took, results = _launch("stall", tmp_path)
    assert p.returncode != 0 and p.returncode != 124, p.stderr[-2000:]
    assert results[1]["did"] == "stalled"
    assert results[0]["did"] == "failed", results[0]
    assert "rank(s) 1 did not send their part within %d s" % TIMEOUT_S in results[0]["error"]
    # and its uncaught error ends the job: the stalled rank does not sleep on
    assert results[0]["seconds"] < 30 and took < 40, (results[0], took)


@pytest.mark.parametrize("fault", ["exit", "raise"])
def test_a_rank_that_dies_or_raises_ends_the_job(fault, tmp_path):
    p, took, results = _launch(fault, tmp_path)
    assert p.returncode != 0 and p.returncode != 124, p.stderr[-2000:]
    assert results[1]["did"] == ("exited" if fault == "exit" else "failed"), results
    # rank 0 was ended by mpirun, or failed naming rank 1: never finished
    assert results.get(0, {}).get("did") != "finished", results
    assert took < 40, took


def test_send_count_overflow_is_an_error_naming_it(tmp_path):
    """Static-shape mode: a batch that sends an owner more unique ids than
    send_count stops with an error naming send_count and the size needed."""
    p, took, results = _launch("send_count", tmp_path)
    assert p.returncode != 0 and p.returncode != 124, p.stderr[-2000:]
    failed = [r for r in results.values() if r["did"] == "failed"]
    assert failed, results  # (the first rank to fail ends the job)
    for r in failed:
        assert "above send_count = 2; raise send_count to at least" in r["error"], r
    assert took < 40, took


def test_a_rank_that_runs_out_of_data_first_is_named_at_once(tmp_path):
    """Rank 1 ends its run normally after 2 steps; rank 0, waiting for its
    part of the next exchange, fails at once (not at the 4 s deadline)
    naming rank 1."""
    p, took, results = _launch("short", tmp_path)
    assert p.returncode != 0 and p.returncode != 124, p.stderr[-2000:]
    assert results[1]["did"] == "ran out of data"
    assert results[0]["did"] == "failed", results[0]
    assert "rank 1 ended its run without this exchange" in results[0]["error"]
    assert results[0]["seconds"] < TIMEOUT_S + 10, results[0]
