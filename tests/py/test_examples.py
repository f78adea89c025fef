"""The examples run as a user runs them: the quick start of README.md
(examples/quickstart.py), and the Criteo demo with and without its SSD tier."""
import os
import re
import subprocess
import sys

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


def _demo(*args):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "criteo_demo.py"),
                          "--epochs", "1", *args],
                         capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_demo_over_the_ssd_tier_gives_the_same_auc(tmp_path):
    # the demo's --ssd-dir: 100 rows per table in memory, the rest on disk;
    # loss, AUC and logloss must be those of the memory-only run, digit for digit
    plain = _demo()
    tiered = _demo("--ssd-dir", str(tmp_path), "--memory-rows", "100")
    lines = [re.findall(r"^epoch 1: .*$", o, re.M) for o in (plain, tiered)]
    assert lines[0] and lines[0] == lines[1], (lines, tiered)
    m = re.search(r"SSD tier .*: ([0-9,]+) rows in memory, ([0-9,]+) on SSD", tiered)
    assert m, tiered
    in_memory, on_ssd = (int(g.replace(",", "")) for g in m.groups())
    # (a few rows over the budget while two threads move rows at once)
    assert in_memory <= 27 * (100 + 8) and on_ssd > 10 * in_memory


def test_readme_shows_the_c_example_that_make_check_builds():
    # README's C example is examples/c/quickstart.c, which tests/install_test.sh
    # builds against the installed library and runs.
    readme = open(os.path.join(ROOT, "README.md")).read()
    block = readme.split("<!-- c-example: examples/c/quickstart.c -->", 1)[1]
    block = block.split("<!-- /c-example -->", 1)[0].strip()
    assert block.startswith("```c\n") and block.endswith("```")
    with open(os.path.join(ROOT, "examples", "c", "quickstart.c")) as f:
        assert block[len("```c\n"):-len("```")] == f.read()
