"""A script under a real MPI launch (`mpirun -np N python script.py`): every
process joins the world, the rank functions answer what the launcher
assigned (the reference: Open MPI's OMPI_COMM_WORLD_RANK, set by mpirun for
each process), a table created alike on every rank is created, and one
whose configuration differs between ranks is an error on every rank that
names another rank and what differs. Each launch is bounded by a timeout."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "mpi" / "ranks.py"
COMM_LIB = ROOT / "build" / "libdynemb_comm.so"

pytestmark = pytest.mark.skipif(
    not shutil.which("mpirun") or not COMM_LIB.is_file(),
    reason="needs Open MPI's mpirun and build/libdynemb_comm.so "
           "(apt-get install openmpi-bin libopenmpi-dev; make comm)")


def _launch(n, results_dir):
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
               TF_CPP_MIN_LOG_LEVEL="2", RESULTS=str(results_dir))
    p = subprocess.run(["timeout", "-k", "5", "150", "mpirun", "--oversubscribe",
                        "--allow-run-as-root", "-np", str(n), sys.executable, str(SCRIPT)],
                       cwd=ROOT, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # {rank mpirun assigned: what dynemb answered in that process}
    return {int(f.stem): json.loads(f.read_text()) for f in results_dir.glob("*.json")}


@pytest.mark.parametrize("n", [2, 3])
def test_ranks_come_from_the_launch_and_tables_must_match(n, tmp_path):
    results = _launch(n, tmp_path)
    assert sorted(results) == list(range(n))
    for launched_rank, r in results.items():
        assert (r["rank"], r["size"], r["local_size"]) == (launched_rank, n, n)
        assert r["create_table"] == "created"
        other = 1 if launched_rank == 0 else 0
        assert ("create_table('u'): rank %d asks for another configuration: its dim is %d, "
                "this rank's (%d) is %d" % (other, 4 + other, launched_rank,
                                            4 + launched_rank)) in r["mismatch"], r["mismatch"]
