"""The examples run as a user runs them: the quick start of README.md
(examples/quickstart.py), and the Criteo demo with and without its SSD tier,
and on two ranks (`make demo RANKS=2`)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_quickstart_trains_and_grows_the_table():
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "quickstart.py")],
                         capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    m = re.search(r"loss ([0-9.]+); table rows (\d+)", out.stdout)
    assert m, out.stdout
    assert float(m.group(1)) < 0.6931  # below the untrained log(2)
    assert 0 < int(m.group(2)) < 4096


def _demo(*args, ranks=1):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"),
               OMPI_MCA_btl_vader_single_copy_mechanism="none",
               DYNEMB_EXCHANGE_TIMEOUT="120")
    cmd = [sys.executable, os.path.join(ROOT, "examples", "criteo_demo.py"), "--epochs", "1",
           *args]
    if ranks > 1:
        cmd = ["timeout", "-k", "5", "500", "mpirun", "--oversubscribe", "--allow-run-as-root",
               "-np", str(ranks)] + cmd
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


@pytest.fixture(scope="module")
def plain():
    return _demo()


def test_demo_over_the_ssd_tier_gives_the_same_auc(tmp_path, plain):
    # the demo's --ssd-dir: 100 rows per table in memory, the rest on disk;
    # loss, AUC and logloss must be those of the memory-only run, digit for digit
    tiered = _demo("--ssd-dir", str(tmp_path), "--memory-rows", "100")
    lines = [re.findall(r"^epoch 1: .*$", o, re.M) for o in (plain, tiered)]
    assert lines[0] and lines[0] == lines[1], (lines, tiered)
    m = re.search(r"SSD tier .*: ([0-9,]+) rows in memory, ([0-9,]+) on SSD", tiered)
    assert m, tiered
    in_memory, on_ssd = (int(g.replace(",", "")) for g in m.groups())
    # (a few rows over the budget while two threads move rows at once)
    assert in_memory <= 27 * (100 + 8) and on_ssd > 10 * in_memory


@pytest.mark.skipif(not shutil.which("mpirun") or not os.path.isfile(
    os.path.join(ROOT, "build", "tf", "_dynemb_sharded_ops.so")),
    reason="needs Open MPI's mpirun and build/tf/_dynemb_sharded_ops.so (make ops)")
def test_demo_on_two_ranks_gives_the_same_auc(plain):
    # each rank a slice of every global batch, the tables sharded: the same
    # training as one process (sums in another order), so the same figures
    # to the digits printed
    two = _demo(ranks=2)
    lines = [re.findall(r"^epoch 1: .*$", o, re.M) for o in (plain, two)]
    assert lines[0] and lines[0] == lines[1], (lines, two)
    rows = [re.findall(r"^table rows: .*$", o, re.M) for o in (plain, two)]
    assert rows[0] and rows[0] == rows[1], rows
    assert "on 2 ranks" in two


def test_readme_shows_the_c_example_that_make_check_builds():
    # README's C example is examples/c/quickstart.c, which tests/install_test.sh
    # builds against the installed library and runs.
    readme = open(os.path.join(ROOT, "README.md")).read()
    block = readme.split("<!-- c-example: examples/c/quickstart.c -->", 1)[1]
    block = block.split("<!-- /c-example -->", 1)[0].strip()
    assert block.startswith("```c\n") and block.endswith("```")
    with open(os.path.join(ROOT, "examples", "c", "quickstart.c")) as f:
        assert block[len("```c\n"):-len("```")] == f.read()
