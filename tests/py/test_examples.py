"""The examples run as a user runs them: the quick start of README.md
(examples/quickstart.py), and the Criteo demo with and without its SSD tier,
and on two ranks (`make demo RANKS=2`)."""
import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
import criteo_data  # noqa: E402  (the demo's data, TensorFlow only)

DATA = criteo_data.data_path()  # the file the demo reads by default


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
def served(tmp_path_factory):
    d = tmp_path_factory.mktemp("served")
    return d, _demo("--export", str(d / "model"), "--predictions", str(d / "probs.npy"))


@pytest.fixture(scope="module")
def plain(served):
    return served[1]


def _other_tensorflow():
    """The Python of the other TensorFlow of `make test` (2.19.1 when this is
    the pinned 2.15.1, and the other way round), if it is installed."""
    for venv in (".venv-tf219", ".venv"):
        py = os.path.join(ROOT, venv, "bin", "python")
        if os.path.isfile(py) and os.path.realpath(os.path.dirname(os.path.dirname(py))) != \
                os.path.realpath(sys.prefix):
            return py
    return None


def _serve_check(model, probs, other=True):
    """serve_check.py's findings in a fresh process without dynemb, on this
    TensorFlow and (other) on the other one of `make test`."""
    out = []
    for py in filter(None, (sys.executable, other and _other_tensorflow())):
        r = subprocess.run([py, os.path.join(ROOT, "tests", "py", "serve_check.py"), model,
                            "--criteo", DATA, "--predictions", probs],
                           capture_output=True, text=True, timeout=300,
                           env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
        assert r.returncode == 0, r.stderr[-3000:]
        out.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return out


def _check_served(model, probs, other=True, cli=True):
    for found in _serve_check(model, probs, other):
        assert found["unknown"] == [], found  # every op is stock TensorFlow's
        assert not [o for o in found["ops"] if o.startswith("Dynemb") or o == "PyFunc"]
        assert found["rows"] == 2000
        # the eval predictions of the training process, through both loaders
        assert found["max_diff_tf1"] <= 1e-6 and found["max_diff_tf2"] <= 1e-6, found
    if not cli:
        return
    tool = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    r = subprocess.run([tool, "show", "--dir", model, "--all"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0 and "serving_default" in r.stdout and "C26" in r.stdout, r.stderr


def _heldout_ids_by_sightings():
    """Of the held-out (field, id) pairs: how many were never in the training
    rows, and how many were in them once (below the demo's admission
    threshold of 2 after one epoch), counted from the data itself."""
    def batches(split):
        with tf.Graph().as_default(), tf.compat.v1.Session() as sess:
            it = tf.compat.v1.data.make_one_shot_iterator(
                criteo_data.make_dataset(split, 512, DATA))
            x = it.get_next()[0]
            while True:
                try:
                    yield sess.run(x)
                except tf.errors.OutOfRangeError:
                    return
    counts = {}
    for x in batches("train"):
        for name in criteo_data.CAT_NAMES:
            for v in x[name]:
                counts[(name, v)] = counts.get((name, v), 0) + 1
    never = once = 0
    for x in batches("eval"):
        for name in criteo_data.CAT_NAMES:
            for v in x[name]:
                c = counts.get((name, v), 0)
                never += c == 0
                once += c == 1
    return never, once


def test_demo_model_serves_in_stock_tensorflow(served):
    # the demo's --export: its held-out predictions, served without dynemb;
    # among the held-out ids are many never seen and many below the
    # admission threshold (both read the default value)
    d, out = served
    assert "SavedModel for serving written to" in out
    # (the pinned run also loads its export in the other TensorFlow; the
    # data's counts are the same on every TensorFlow)
    pinned = tuple(int(x) for x in tf.__version__.split(".")[:2]) < (2, 16)
    _check_served(str(d / "model"), str(d / "probs.npy"), other=pinned)
    if pinned:
        never, once = _heldout_ids_by_sightings()
        assert never > 1000 and once > 1000, (never, once)


@pytest.mark.estimator
def test_estimator_model_serves_in_stock_tensorflow(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "criteo_estimator.py"),
                        "--epochs", "1", "--no-cold", "--export", str(tmp_path / "export"),
                        "--predictions", str(tmp_path / "probs.npy")],
                       capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    (model,) = os.listdir(tmp_path / "export")  # Estimator's <timestamp> directory
    # (TensorFlow 2.19 loading it and saved_model_cli: the demo's test)
    _check_served(str(tmp_path / "export" / model), str(tmp_path / "probs.npy"), other=False,
                  cli=False)


@pytest.mark.pinned_only(reason="the SSD tier is the engine's, the same on every TensorFlow "
                         "(suite time)")
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
def test_demo_on_two_ranks_gives_the_same_auc(plain, tmp_path):
    # each rank a slice of every global batch, the tables sharded: the same
    # training as one process (sums in another order), so the same figures
    # to the digits printed; its export (rank 0 writes it with both ranks'
    # rows) serves its held-out predictions
    two = _demo("--export", str(tmp_path / "model"), "--predictions",
                str(tmp_path / "probs.npy"), ranks=2)
    _check_served(str(tmp_path / "model"), str(tmp_path / "probs.npy"), other=False,
                  cli=False)
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
