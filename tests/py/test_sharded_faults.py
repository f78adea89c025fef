"""A rank that stops, dies, raises or runs other exchanges never hangs the
others (tests/py/mpi/fault.py, under mpirun on 2 or 3 ranks, with a short
exchange timeout): the job ends within a bound, with an error (on the
others, when the faulty rank lives on) that names the faulty rank, and a
rank that stops on an uncaught error ends the job (dynemb._comm:
MPI_Abort). Every run is bounded (timeout around mpirun) and leaves no
process behind (every rank's pid is in its results, killed at the end)."""
import json
import os
import shutil
import signal
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


def _launch(fault, results_dir, timeout=TIMEOUT_S, ranks=2, mpirun_args=(), **env_extra):
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
               TF_CPP_MIN_LOG_LEVEL="2", RESULTS=str(results_dir), FAULT=fault,
               DYNEMB_EXCHANGE_TIMEOUT=str(timeout), **env_extra)
    start = time.time()
    try:
        p = subprocess.run(["timeout", "-k", "5", "120", "mpirun", "--oversubscribe",
                            "--allow-run-as-root", *mpirun_args, "-np", str(ranks),
                            sys.executable, str(SCRIPT)],
                           cwd=ROOT, env=env, capture_output=True, text=True)
        took = time.time() - start
        results = {int(f.stem): json.loads(f.read_text())
                   for f in results_dir.glob("*.json")}
    finally:
        for f in results_dir.glob("*.json"):  # nothing left behind, even on failure
            try:
                os.kill(json.loads(f.read_text())["pid"], signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
    return p, took, results


def test_a_stalled_rank_makes_the_other_fail_naming_it(tmp_path):
    """Rank 1 stays alive but stops taking part: rank 0 waits for it 5 x the
    exchange timeout (an alive rank may be busy), then fails naming it."""
    p, took, results = _launch("stall", tmp_path, timeout=2)
    assert p.returncode != 0 and p.returncode != 124, p.stderr[-2000:]
    assert results[1]["did"] == "stalled"
    assert results[0]["did"] == "failed", results[0]
    assert "for rank 1, alive but not joining" in results[0]["error"], results[0]
    assert "rank 1: alive, in no exchange" in results[0]["error"], results[0]
    # not before 5 x 2 s; and its uncaught error ends the job: the stalled
    # rank does not sleep on
    assert 10 <= results[0]["after_step_2"] < 16, results[0]
    assert took < 45, took


def test_ranks_in_different_exchanges_fail_at_once_naming_both(tmp_path):
    """Rank 1's input ends first and it goes on to an eval lookup while rank 0
    trains on: both fail within a few seconds (the timeout is 60 s), each
    naming the train lookup and the eval lookup."""
    p, took, results = _launch("eval", tmp_path, timeout=60)
    assert p.returncode != 0 and p.returncode != 124, p.stderr[-2000:]
    failed = [r for r in results.values() if r["did"] == "failed"]
    assert failed, results  # (the first rank to fail ends the job)
    for r in failed:
        assert "the ranks wait in different exchanges" in r["error"], r
        assert "lookup of table 't' (train), run 2" in r["error"], r
        assert "lookup of table 't' (eval), run 0" in r["error"], r
        assert r["after_step_2"] < 10, r
    assert took < 45, took


# Two moments (each trial costs three TensorFlow start-ups); before every
# wait had a deadline, the survivors of both hung in most runs.
@pytest.mark.parametrize("ranks,kill_after", [(3, 0.5), (3, 1.7)])
def test_a_rank_killed_mid_training_fails_every_survivor_in_time(ranks, kill_after,
                                                                  tmp_path):
    """Under a launcher that keeps the job alive when a rank dies (mpirun
    --enable-recovery), rank 1 kills itself (SIGKILL) at a moment of its
    training of large batches, most likely in the middle of a transfer:
    every survivor fails within the timeout and a little, naming rank 1."""
    timeout = 3
    p, took, results = _launch("kill", tmp_path, timeout=timeout, ranks=ranks,
                               mpirun_args=("--enable-recovery",),
                               KILL_AFTER=str(kill_after))
    assert p.returncode != 124, p.stderr[-2000:]
    assert results[1]["did"] == "killed", results
    for r in range(ranks):
        if r == 1:
            continue
        assert results[r]["did"] == "failed", (r, results)
        assert "rank 1 sent nothing for" in results[r]["error"], results[r]
        assert results[r]["at"] - results[1]["at"] < timeout + 4, (r, results)
    assert took < 60, took


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
