"""Tables sharded across ranks train as one process does: the same model
(tests/py/mpi/train.py) run alone on the whole global batch, the reference,
and under `mpirun -np N` (N = 2, 3) with each rank on its slice. Per sparse
optimizer (SGD, Adagrad, lazy Adam, FTRL), with feature admission and
eviction (EvictHook on every rank) on one table, an SSD tier on another, and a
replicated (is_dp) table whose rows every rank holds: every step's global loss (the sum of the ranks' losses), every table
row (the union of the ranks' rows, each key on exactly one rank, the rank
dynemb_key_shard gives it), the dense variables (on every rank) and an eval
lookup of every id after training equal the reference within 1e-5 relative.
Checkpoints written midway (Saver) by 2, 3 and 1 ranks restore onto 3, 1 and
2 ranks, and training from them ends equal to the uninterrupted reference.
Each launch is bounded by a timeout."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "mpi" / "train.py"
SHARDED_LIB = ROOT / "build" / "tf" / "_dynemb_sharded_ops.so"
STEPS, SAVE_AT = 6, 3
HOSTS = ROOT / "tests" / "hosts" / "hosts.sh"

pytestmark = pytest.mark.skipif(
    not shutil.which("mpirun") or not SHARDED_LIB.is_file(),
    reason="needs Open MPI's mpirun and build/tf/_dynemb_sharded_ops.so "
           "(apt-get install openmpi-bin libopenmpi-dev; make ops)")


def _run(n, results_dir, script=SCRIPT, hosts=None, **env_more):
    """Runs the model on n ranks (n = 1: alone), checkpointing into
    results_dir/ckpt (SAVE_AT) or restoring from env_more's CKPT. `hosts`:
    the name of a set of network hosts (tests/hosts/hosts.sh), one rank on
    each of the first n, over TCP; else every rank on this host."""
    env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
               TF_CPP_MIN_LOG_LEVEL="2", RESULTS=str(results_dir),
               DYNEMB_EXCHANGE_TIMEOUT="60", CKPT=str(results_dir / "ckpt"))
    env.update({k: str(v) for k, v in env_more.items()})
    cmd = [sys.executable, str(script), str(STEPS)]
    if hosts is not None:
        cmd = [str(HOSTS), "mpirun", hosts, str(n)] + cmd
    elif n > 1:
        cmd = ["mpirun", "--oversubscribe", "--allow-run-as-root", "-np", str(n)] + cmd
    p = subprocess.run(["timeout", "-k", "5", "150"] + cmd, cwd=ROOT, env=env,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    if script != SCRIPT:  # (mpi/<name>.py writes <name>-<rank>.json)
        return [json.loads((results_dir / ("%s-%d.json" % (script.stem, r))).read_text())
                for r in range(n)]
    return [json.loads((results_dir / ("%d.json" % r)).read_text()) for r in range(n)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted runs on 1 (the reference), 2 and 3 ranks, each
    checkpointing after SAVE_AT steps: {n: (per-rank results, directory)}."""
    out = {}
    for n in (1, 2, 3):
        d = tmp_path_factory.mktemp("ranks%d" % n)
        out[n] = (_run(n, d, SAVE_AT=SAVE_AT), d)
    return out


@pytest.fixture(scope="module")
def reference(runs):
    return runs[1][0][0]["results"]


def _close(got, want, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7, err_msg=what)


def _check(ranks, reference, first_step=0):
    """The ranks' results equal the reference's (steps from first_step)."""
    from dynemb import _lib
    n = len(ranks)
    for kind, want in reference.items():
        got = [r["results"][kind] for r in ranks]
        _close(np.sum([g["losses"] for g in got], axis=0), want["losses"][first_step:],
               "%s: global loss per step" % kind)
        assert sum(g["evicted"] for g in got) == want["evicted"], kind
        for g in got:
            for var, value in want["dense"].items():
                _close(g["dense"][var], value, "%s: dense %s" % (kind, var))
            for t, rows in enumerate(want["eval"]):
                _close(g["eval"][t], rows, "%s: eval lookup of table %d" % (kind, t))
        for table, rows in want["rows"].items():
            if table == "dp":  # replicated (is_dp): every rank holds every row
                for r, g in enumerate(got):
                    assert sorted(g["rows"][table]) == sorted(rows), (kind, r)
                    for key, row in rows.items():
                        _close(g["rows"][table][key], row, "%s: dp row %s" % (kind, key))
                continue
            merged = {}
            for r, g in enumerate(got):
                for key, row in g["rows"][table].items():
                    assert _lib.clib.dynemb_key_shard(int(key), n) == r, (kind, table, key)
                    merged[key] = row
            assert sorted(merged) == sorted(rows), "%s: keys of %s" % (kind, table)
            for key, row in rows.items():
                _close(merged[key], row, "%s: row %s of %s" % (kind, key, table))


@pytest.mark.parametrize("n", [2, pytest.param(3, marks=pytest.mark.pinned_only)])
def test_n_ranks_train_as_one_process(n, runs, reference):
    assert all(r["evicted"] > 0 for r in reference.values())  # (eviction happened)
    for kind in reference:  # (and each rank's "user" rows were on its SSD tier)
        assert all(r["results"][kind]["ssd_rows"] > 0 for r in runs[n][0]), kind
    _check(runs[n][0], reference)


@pytest.mark.pinned_only
@pytest.mark.parametrize("saved,restored", [(2, 3), (3, 1), (1, 2)])
def test_checkpoints_restore_onto_any_rank_count(saved, restored, runs, reference, tmp_path):
    written = runs[saved][1] / "ckpt"
    parts = sorted(p.name for p in (written / "sgd").glob("sparse-model-%d/*" % SAVE_AT))
    ranked = [p for p in parts if p.startswith("rank-")]
    assert ranked == ["rank-%d-of-%d" % (r, saved) for r in range(saved) if saved > 1], parts
    ranks = _run(restored, tmp_path, RESTORE_AT=SAVE_AT, CKPT=written)
    _check(ranks, reference, first_step=SAVE_AT)


@pytest.mark.pinned_only
@pytest.mark.parametrize("n", [2, 3])
def test_command_line_tool_reads_the_checkpoints_ranks_wrote(n, runs, tmp_path):
    """`dynemb ckpt` on the Saver checkpoints n ranks wrote midway (a table
    on the SSD tier, a replicated one, every optimizer): inspect counts the
    ranks, verify checks every part, and export writes every table as the
    one process's own checkpoint of that step holds it (the same keys; rows
    within the parity tolerance), each key of the replicated table once."""
    tool = str(ROOT / "build" / "dynemb")
    if not os.access(tool, os.X_OK):
        pytest.skip("build/dynemb not built (make all)")

    def run(*args):
        p = subprocess.run([tool, *map(str, args)], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout

    for kind in runs[1][0][0]["results"]:
        ours = runs[n][1] / "ckpt" / kind / ("sparse-model-%d" % SAVE_AT)
        alone = runs[1][1] / "ckpt" / kind / ("sparse-model-%d" % SAVE_AT)
        info = json.loads(run("ckpt", "inspect", "--json", ours))
        assert info["ranks"] == n and len(info["tables"]) == 4, info
        dp = next(t for t in info["tables"] if t["name"] == "dp_" + kind)
        part0 = {t["name"]: t for t in info["parts"][0]["tables"]}
        assert dp["rows"] == n * part0[dp["name"]]["rows"] > 0  # (whole in every part)
        assert "(%d parts, 4 tables," % n in run("ckpt", "verify", ours)
        for d in (str(n), "1"):
            (tmp_path / d).mkdir(exist_ok=True)
        run("ckpt", "export", ours, tmp_path / str(n) / kind)
        run("ckpt", "export", alone, tmp_path / "1" / kind)
        for table in sorted(os.listdir(tmp_path / "1" / kind)):
            got, want = (tmp_path / str(n) / kind / table, tmp_path / "1" / kind / table)
            np.testing.assert_array_equal(np.load(got / "keys.npy"), np.load(want / "keys.npy"),
                                          err_msg="%s %s" % (kind, table))
            _close(np.load(got / "embeddings.npy"), np.load(want / "embeddings.npy"),
                   "%s: exported %s" % (kind, table))


@pytest.mark.pinned_only
def test_warm_start_across_rank_counts(runs, tmp_path):
    """A warm start (rows and dense variables, fresh optimizer state) on 2
    ranks from the checkpoint 3 ranks wrote trains as one process warm-started
    from its own checkpoint."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = _run(1, tmp_path / "one", RESTORE_AT=SAVE_AT, WARM=1, CKPT=runs[1][1] / "ckpt")
    two = _run(2, tmp_path / "two", RESTORE_AT=SAVE_AT, WARM=1, CKPT=runs[3][1] / "ckpt")
    for kind, want in one[0]["results"].items():  # the rows came from the checkpoint
        assert want["initial_rows"] > 0
        assert sum(r["results"][kind]["initial_rows"] for r in two) == want["initial_rows"]
        assert all(r["results"][kind]["initial_dp_rows"] == want["initial_dp_rows"] > 0
                   for r in two)  # (a replicated table: whole on every rank)
    _check(two, one[0]["results"])


@pytest.mark.pinned_only
@pytest.mark.parametrize("n", [2, 3])
def test_dense_side_broadcast_and_distributed_optimizer(n, tmp_path):
    """tests/py/mpi/dense.py: ranks that initialise their dense variables
    differently start from rank 0's (BroadcastGlobalVariablesHook); with
    DistributedOptimizer (averaged dense gradients) and
    sum_gradients_and_div_by_ranksize, each rank's mean loss trains as one
    process's mean over the global batch."""
    script = SCRIPT.parent / "dense.py"
    (tmp_path / "one").mkdir()
    (tmp_path / "n").mkdir()
    one = _run(1, tmp_path / "one", script)[0]
    ranks = _run(n, tmp_path / "n", script)
    for got in ranks:
        for what in ("initial", "final", "rows"):
            _close(got[what], one[what], what)
    # (each rank's mean over an equal slice: their mean is the global mean)
    _close(np.mean([r["losses"] for r in ranks], axis=0), one["losses"], "losses")


def _one_and_n(name, n, tmp_path, hosts=None, **env):
    """Runs tests/py/mpi/<name>.py alone and on n ranks (on the network
    hosts `hosts`, if given); checks that the global losses (the ranks'
    summed) and every rank's rows equal the run alone's; returns both
    results."""
    script = SCRIPT.parent / (name + ".py")
    (tmp_path / "one").mkdir()
    (tmp_path / "n").mkdir()
    one = _run(1, tmp_path / "one", script, **env)[0]
    ranks = _run(n, tmp_path / "n", script, hosts=hosts, **env)
    _close(np.sum([r["losses"] for r in ranks], axis=0), one["losses"], "losses")
    for r in ranks:
        _close(r["rows"], one["rows"], "rows")
    return one, ranks


@pytest.mark.pinned_only
@pytest.mark.parametrize("n", [2])
def test_modify_graph_script_on_n_ranks_trains_as_one_process(n, tmp_path):
    """tests/py/mpi/modify.py: an mxRec-style script with modify_graph=True
    lookups, modify_graph_and_start_emb_cache() and get_initializer (lazy
    Adam, admission). Alone its pipeline prepares batches ahead; on n ranks
    the lookups exchange in the step: the same losses, rows and eval logits
    (each rank's slice of every eval batch), and every row's last access is
    the global step that trained its batch in both (not the step at which
    one process's pipeline prepared it)."""
    one, ranks = _one_and_n("modify", n, tmp_path)
    union = {}
    for r in ranks:
        union.update(r["stamps"])
    assert union == one["stamps"] and len(set(union.values())) > 2
    for b, want in enumerate(one["logits"]):
        _close(np.concatenate([r["logits"][b] for r in ranks]), want, "eval batch %d" % b)


@pytest.mark.pinned_only
@pytest.mark.parametrize("inter_op", [1])
def test_no_deadlock_under_any_schedule(inter_op, tmp_path):
    """tests/py/mpi/stress.py on 3 ranks: 24 train lookups of 12 tables, their
    applies, a dense all-reduce and eval steps, on 1 inter-op thread (the
    hardest: one blocked exchange holds it; 3 threads passed as well),
    each rank reaching the ops in its own random order. It finishes (each
    launch is bounded) and trains as one process does."""
    _one_and_n("stress", 3, tmp_path, INTER_OP=inter_op, DYNEMB_EXCHANGE_TIMEOUT=30)


@pytest.mark.pinned_only
@pytest.mark.parametrize("n", [2])
def test_feature_spec_script_on_n_ranks_trains_as_one_process(n, tmp_path):
    """tests/py/mpi/featurespec.py: FeatureSpec mode with admission
    (get_asc_insert_func, start_asc_pipeline). Alone its insert function
    prepares batches ahead; on n ranks the lookups exchange in the step: the
    same losses and rows."""
    _one_and_n("featurespec", n, tmp_path)


@pytest.mark.pinned_only
@pytest.mark.parametrize("n", [2])
def test_computed_serving_default_values_on_n_ranks(n, tmp_path):
    """tests/py/mpi/defaults.py: a train lookup whose ids without a row read
    a value computed from the ids, and an eval lookup (of ids other ranks
    own, some unknown) with another, equal one process's; so does the
    SavedModel exported on n ranks, with no dynemb op in it."""
    import tensorflow as tf
    script = SCRIPT.parent / "defaults.py"
    (tmp_path / "one").mkdir()
    (tmp_path / "n").mkdir()
    one = _run(1, tmp_path / "one", script)[0]
    ranks = _run(n, tmp_path / "n", script, EXPORT=tmp_path / "export")
    _close(np.sum([r["losses"] for r in ranks], axis=0), one["losses"], "losses")
    for r in ranks:
        _close(r["rows"], one["rows"], "eval rows")
    for s, want in enumerate(one["emb"]):
        _close(np.concatenate([r["emb"][s] for r in ranks]), want, "train rows, step %d" % s)
    rows = np.asarray(one["rows"])
    probe = np.arange(16)
    np.testing.assert_array_equal(rows[12:], np.stack([-probe[12:], probe[12:] ** 2], 1))
    read_default = np.all(rows == np.stack([-probe, probe ** 2], 1), axis=1)
    assert not read_default[:12].all()  # (admitted ids read their rows)
    with tf.Graph().as_default() as g, tf.compat.v1.Session() as s:
        mg = tf.compat.v1.saved_model.loader.load(s, ["serve"], str(tmp_path / "export"))
        assert not [nd.op for nd in g.as_graph_def().node if nd.op.startswith("Dynemb")]
        sig = mg.signature_def["serving_default"]
        served = s.run(sig.outputs["rows"].name, {sig.inputs["query"].name: probe})
    _close(served, rows, "served rows")


# --------------------------------------------------------------------------
# Several hosts: the same training with each rank on a network host of its
# own (a network namespace, tests/hosts/hosts.sh), every byte over TCP
# --------------------------------------------------------------------------

def _network_hosts(prefix):
    """Three network hosts named after `prefix` (tests/hosts/hosts.sh),
    removed afterwards (also when a test fails). Where namespaces cannot be
    made (not root, no iproute2) the test is skipped, saying why, unless
    DYNEMB_REQUIRE_HOSTS is set (CI sets it: there they must run)."""
    name = "%s%d" % (prefix, os.getpid() % 100000)
    p = subprocess.run(["timeout", "-k", "5", "60", str(HOSTS), "up", name, "3"],
                       capture_output=True, text=True)
    if p.returncode != 0:
        subprocess.run([str(HOSTS), "down", name], capture_output=True)
        why = "cannot make network hosts here: " + (p.stderr.strip() or "rc %d" % p.returncode)
        if os.environ.get("DYNEMB_REQUIRE_HOSTS"):
            pytest.fail(why)
        pytest.skip(why)
    try:
        yield name
    finally:
        subprocess.run(["timeout", "-k", "5", "60", str(HOSTS), "down", name],
                       capture_output=True)


@pytest.fixture(scope="module")
def hosts():
    """Three network hosts shared by this module's tests."""
    yield from _network_hosts("dyn")


@pytest.fixture(scope="module")
def hosts_run(hosts, tmp_path_factory):
    """The model on 3 hosts, checkpointing after SAVE_AT steps."""
    d = tmp_path_factory.mktemp("hosts3")
    return _run(3, d, hosts=hosts, SAVE_AT=SAVE_AT), d


@pytest.mark.pinned_only
def test_three_hosts_train_as_one_process(hosts_run, reference):
    """Each rank on a host of its own, every exchange over TCP: the same
    losses, rows (each key on the rank dynemb_key_shard gives it), dense
    variables and eval lookups as one process with the global batch."""
    ranks, _ = hosts_run
    assert all(r["local_size"] == 1 for r in ranks)  # (no two ranks share a host)
    _check(ranks, reference)


@pytest.mark.pinned_only
def test_checkpoint_of_three_hosts_restores_on_two_hosts(hosts, hosts_run, reference, tmp_path):
    """The Saver checkpoint the 3 hosts wrote midway, restored on 2 hosts,
    trains on as the uninterrupted one process."""
    ranks = _run(2, tmp_path, hosts=hosts, RESTORE_AT=SAVE_AT, CKPT=hosts_run[1] / "ckpt")
    assert all(r["local_size"] == 1 for r in ranks)
    _check(ranks, reference, first_step=SAVE_AT)


@pytest.mark.pinned_only
@pytest.mark.parametrize("name", ["modify", "featurespec"])
def test_pipeline_modes_on_two_hosts_train_as_one_process(name, hosts, tmp_path):
    """mxRec-style scripts in automatic graph modification mode (lazy Adam,
    admission, step-clock eviction) and FeatureSpec mode (Adagrad, admission)
    on 2 network hosts: the same losses and rows as one process with its
    prepared pipeline; in graph modification mode also the same eval logits
    and every row's last access."""
    one, ranks = _one_and_n(name, 2, tmp_path, hosts=hosts)
    if name == "modify":
        for b, want in enumerate(one["logits"]):
            _close(np.concatenate([r["logits"][b] for r in ranks]), want, "eval batch %d" % b)
        union = {}
        for r in ranks:
            union.update(r["stamps"])
        assert union == one["stamps"]


@pytest.fixture
def fresh_hosts():
    """Three network hosts of this test's own (it harms one of them)."""
    yield from _network_hosts("dyf")


@pytest.mark.pinned_only
def test_a_host_that_vanishes_ends_the_job_naming_it(fresh_hosts, tmp_path):
    """Mid-training (3 hosts, large batches), host 2's link goes down, as a
    host that loses its network: ranks 0 and 1 fail within the exchange
    timeout and a little, naming rank 2 as the silent one (and rank 1 as
    alive, on rank 0); rank 2 names both; and mpirun, whose daemon on host 2
    cannot be reached, still ends the whole launch promptly."""
    timeout_s = 4
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", RESULTS=str(tmp_path), FAULT="train",
               DYNEMB_EXCHANGE_TIMEOUT=str(timeout_s))
    p = subprocess.Popen(["timeout", "-k", "5", "240", str(HOSTS), "mpirun", fresh_hosts, "3",
                          sys.executable, str(SCRIPT.parent / "fault.py")],
                         env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    try:
        deadline = time.time() + 150  # (three TensorFlows start on 2 cores)
        while len(list(tmp_path.glob("*.json"))) < 3 and time.time() < deadline:
            time.sleep(0.2)  # (every rank has built its graph and trains)
        assert len(list(tmp_path.glob("*.json"))) == 3, "the ranks did not start"
        time.sleep(1.0)
        cut = time.time()
        subprocess.run([str(HOSTS), "cut", fresh_hosts, "2"], check=True)
        out, _ = p.communicate(timeout=200)
        ended = time.time()
    finally:
        if p.poll() is None:
            p.kill()
    results = {int(f.stem): json.loads(f.read_text()) for f in tmp_path.glob("*.json")}
    for r in (0, 1):
        got = results[r]
        assert got["did"] == "failed", (r, got)
        assert got["at"] - cut < timeout_s + 5, (r, got["at"] - cut)
        assert "rank 2 sent nothing" in got["error"], got["error"][-2000:]
    assert "rank 1: alive" in results[0]["error"]
    # (rank 2, cut off, hears from nobody: which ranks its failing op waited
    # for depends on the op, the dense all-reduce or a table's exchange)
    assert results[2]["did"] == "failed" and "sent nothing" in results[2]["error"]
    assert p.returncode not in (0, 124, 137), out[-3000:]
    assert ended - cut < timeout_s + 20, ("mpirun ended %.1f s after the cut" % (ended - cut),
                                          out[-3000:])

