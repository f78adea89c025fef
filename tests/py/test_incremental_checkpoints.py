"""Incremental checkpoints from Python: save_tables(..., incremental=True)
and mxRec's Saver.save(..., save_delta=True). The reference is the whole
table as the engine exports it (DynembExport: keys, rows with optimizer
state, last access, admission candidates and their counts, the step count)
at the moment of each save; each link of a chain, restored, must equal it,
with admission and eviction between saves. Pruning by max_to_keep keeps
the directories a kept delta builds on."""
import os

import numpy as np
import pytest
import tensorflow as tf

import dynemb
from dynemb.optimizers import adagrad

FIELDS = ("keys", "values", "last_access", "cand_keys", "cand_counts", "cand_last_access",
          "apply_steps")


def _state_of(name):
    """Everything the table holds, sorted by key."""
    from dynemb import _lib
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        out = dict(zip(("meta",) + FIELDS, s.run(list(_lib.ops.dynemb_export(
            table_name=name)))))
    r, c = np.argsort(out["keys"]), np.argsort(out["cand_keys"])
    return {k: (v[r] if k in ("keys", "values", "last_access") else
                v[c] if k.startswith("cand") else v) for k, v in out.items() if k != "meta"}


def _same(a, b):
    for k in FIELDS:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _model():
    opt = adagrad.create_hash_optimizer(0.2)
    t = dynemb.create_table(tf.int64, 3, "inc", tf.compat.v1.random_uniform_initializer(
        -1, 1, seed=4), optimizer_list=[opt])
    ids = tf.compat.v1.placeholder(tf.int64, [None])
    gs = tf.compat.v1.train.get_or_create_global_step()  # the eviction clock
    rows = dynemb.sparse_lookup(t, ids, access_and_evict_config={
        "access_threshold": 2, "eviction_threshold": 3})
    train = opt.minimize(tf.reduce_sum(rows ** 2), global_step=gs)
    evict = dynemb.EvictHook(evict_enable=True, evict_time_interval=None,
                             evict_step_interval=10**9)
    evict.begin()  # (its ops; evict.evict(sess) evicts now)
    return t, ids, train, evict


def _steps(sess, ids, train, rng, n, space=300):
    for _ in range(n):
        sess.run(train, {ids: rng.integers(0, space, 40)})


def test_save_tables_chain_restores_every_link(tmp_path):
    t, ids, train, evict = _model()
    rng = np.random.default_rng(3)
    states, dirs = [], []
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        for i in range(5):
            _steps(s, ids, train, rng, 4)
            if i == 2:  # eviction between two saves
                assert evict.evict(s) > 0
            d = str(tmp_path / ("ckpt-%d" % i))
            dynemb.save_tables(d, [t], incremental=True)
            dirs.append(d)
            states.append(_state_of("inc"))
    # a full save, then deltas, each building on the one before (what a
    # delta holds against a full save's size: tests/c/test_ckpt_delta.c)
    from dynemb.core.checkpoint import checkpoint_base
    assert [checkpoint_base(d) for d in dirs] == [None] + dirs[:-1]
    for d, want in reversed(list(zip(dirs, states))):
        dynemb.restore_tables(d, [t])
        _same(_state_of("inc"), want)
    # a full save of a table saved incrementally starts a new chain
    dynemb.save_tables(str(tmp_path / "full"), [t])
    dynemb.save_tables(str(tmp_path / "after-full"), [t], incremental=True)
    import shutil
    shutil.rmtree(dirs[0])  # the first chain's base: its deltas no longer load ...
    with pytest.raises(dynemb.DynembError, match="builds on .*ckpt-0"):
        dynemb.restore_tables(dirs[-1], [t])
    now = _state_of("inc")
    dynemb.restore_tables(str(tmp_path / "after-full"), [t])  # ... the new chain does
    _same(_state_of("inc"), now)


def test_saver_save_delta_and_pruning_keep_the_chain(tmp_path):
    t, ids, train, evict = _model()
    saver = tf.compat.v1.train.Saver(max_to_keep=2)
    prefix = str(tmp_path / "model")
    rng = np.random.default_rng(9)
    states = {}
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        for step in range(1, 6):
            _steps(s, ids, train, rng, 3)
            if step == 3:
                assert evict.evict(s) > 0
            # a full save at step 1 (that deltas build on), deltas after it
            saver.save(s, prefix, global_step=step, is_incremental_checkpoint=step == 1,
                       save_delta=step > 1)
            states[step] = _state_of("inc")
        kept = sorted(os.listdir(tmp_path))
        # max_to_keep=2: the TF files of steps 4 and 5; the sparse directories
        # of every step, since step 5's delta builds on 4's, 4's on 3's, ...
        assert [f for f in kept if f.startswith("sparse-")] == [
            "sparse-model-%d" % i for i in range(1, 6)]
        assert not [f for f in kept if f.startswith("model-1.")]
        for step in (5, 4):
            saver.restore(s, "%s-%d" % (prefix, step))
            _same(_state_of("inc"), states[step])
        # a full save again: the next Saver prune drops the old chain
        saver.save(s, prefix, global_step=6)
        saver.save(s, prefix, global_step=7)
        kept = sorted(f for f in os.listdir(tmp_path) if f.startswith("sparse-"))
        assert kept == ["sparse-model-6", "sparse-model-7"]


def test_init_switches_schedule_the_hook_saves(tmp_path, monkeypatch):
    """init(is_incremental_checkpoint=True, save_checkpoint_due_time=100,
    save_delta_checkpoints_secs=10): CheckpointSaverHook saves a full
    checkpoint first and every 100 s, a delta every 10 s between; every
    saved step restores to the table as it was."""
    with pytest.raises(ValueError, match="needs save_checkpoint_due_time"):
        dynemb.init(is_incremental_checkpoint=True)
    dynemb.init(is_incremental_checkpoint=True, save_checkpoint_due_time=100,
                save_delta_checkpoints_secs=10)
    import time
    clock = [1000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    t, ids, train, _ = _model()
    hook = tf.compat.v1.train.CheckpointSaverHook(str(tmp_path), save_steps=1)
    rng = np.random.default_rng(2)
    states = {}
    gs = tf.compat.v1.train.get_global_step()
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as s:
        for _ in range(30):
            clock[0] += 4
            step = s.run(gs)
            s.run(train, {ids: rng.integers(0, 300, 40)})
            states[step + 1] = _state_of("inc")
    monkeypatch.undo()
    from dynemb.core.checkpoint import checkpoint_base
    sparse = sorted((int(f.rsplit("-", 1)[1]), f) for f in os.listdir(tmp_path)
                    if f.startswith("sparse-"))
    kinds = {step: checkpoint_base(str(tmp_path / f)) is None for step, f in sparse}
    full = [s_ for s_, is_full in kinds.items() if is_full]
    deltas = [s_ for s_, is_full in kinds.items() if not is_full]
    # full saves at the start, after 100 s (25 steps) and at the end; a delta
    # every 10 s (2-3 steps) between
    assert full[0] == 0 and any(23 <= f <= 26 for f in full) and 30 in full, kinds
    assert len(deltas) >= 8 and all(d - p <= 3 for p, d in zip(sorted(kinds), sorted(kinds)[1:]))
    # the latest delta through the Saver; the first one (whose TF files
    # max_to_keep removed; its sparse directory stays: the kept step 20
    # builds on it) through restore_tables
    with tf.compat.v1.Session() as s:
        tf.compat.v1.train.Saver().restore(s, str(tmp_path / ("model.ckpt-%d" % deltas[-1])))
        _same(_state_of("inc"), states[deltas[-1]])
    assert not os.path.exists(tmp_path / ("model.ckpt-%d.index" % deltas[0]))
    dynemb.restore_tables(str(tmp_path / ("sparse-model.ckpt-%d" % deltas[0])), [t])
    _same(_state_of("inc"), states[deltas[0]])


def test_command_line_tool_follows_the_chain(tmp_path):
    """`dynemb ckpt inspect` names what a delta builds on; `verify` checks
    the whole chain; `export` writes the rows the chain adds up to."""
    import json
    import subprocess
    tool = os.path.join(os.path.dirname(__file__), "..", "..", "build", "dynemb")
    t, ids, train, _ = _model()
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        _steps(s, ids, train, np.random.default_rng(1), 3)
        dynemb.save_tables(str(tmp_path / "a"), [t], incremental=True)
        _steps(s, ids, train, np.random.default_rng(2), 3)
        dynemb.save_tables(str(tmp_path / "b"), [t], incremental=True)
    want = _state_of("inc")
    out = json.loads(subprocess.run([tool, "ckpt", "inspect", "--json", str(tmp_path / "b")],
                                    capture_output=True, text=True, check=True).stdout)
    assert os.path.normpath(out["builds_on"]) == str(tmp_path / "a")
    assert subprocess.run([tool, "ckpt", "verify", str(tmp_path / "b")]).returncode == 0
    r = subprocess.run([tool, "ckpt", "export", str(tmp_path / "b"), str(tmp_path / "npy")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "npy" / "inc" / "keys.npy"), want["keys"])
    np.testing.assert_array_equal(np.load(tmp_path / "npy" / "inc" / "embeddings.npy"),
                                  want["values"][:, :3])
    import shutil
    shutil.rmtree(tmp_path / "a")
    r = subprocess.run([tool, "ckpt", "verify", str(tmp_path / "b")], capture_output=True,
                       text=True)
    assert r.returncode != 0 and "builds on" in r.stderr


_TOOL = os.path.join(os.path.dirname(__file__), "..", "..", "build", "dynemb")
_needs_ranks = pytest.mark.skipif(
    not __import__("shutil").which("mpirun") or not os.path.isfile(os.path.join(
        os.path.dirname(__file__), "..", "..", "build", "tf", "_dynemb_sharded_ops.so")),
    reason="needs Open MPI's mpirun and make ops")


@pytest.fixture(scope="module")
def ranked_chains(tmp_path_factory):
    """{n: directory} of tests/py/mpi/incremental.py run on n ranks (base,
    delta, full, and each rank's rows at the delta's moment in live/),
    each run once, when a test first asks for it."""
    import subprocess
    import sys
    runs = {}

    def get(n):
        if n not in runs:
            out = tmp_path_factory.mktemp("ranks%d" % n)
            script = os.path.join(os.path.dirname(__file__), "mpi", "incremental.py")
            env = dict(os.environ, OMPI_MCA_btl_vader_single_copy_mechanism="none",
                       DYNEMB_EXCHANGE_TIMEOUT="60", TF_CPP_MIN_LOG_LEVEL="2")
            r = subprocess.run(["timeout", "-k", "5", "200", "mpirun", "--oversubscribe",
                                "--allow-run-as-root", "-np", str(n), sys.executable, script,
                                str(out)], capture_output=True, text=True, env=env)
            assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
            runs[n] = out
        return runs[n]
    return get


@pytest.mark.pinned_only
@_needs_ranks
def test_two_ranks_chain_restores_onto_one_process(ranked_chains):
    """A delta written by 2 ranks (each part building on that rank's part of
    the base) restores onto one process exactly as the 2 ranks' full save
    of the same moment."""
    out = ranked_chains(2)
    from dynemb.core.checkpoint import checkpoint_base
    part = str(out / "delta" / "rank-1-of-2")
    assert checkpoint_base(part) == str(out / "base" / "rank-1-of-2")
    t, _, _, _ = _model()
    dynemb.restore_tables(str(out / "full"), [t])
    want = _state_of("inc")
    assert len(want["keys"]) > 50 and len(want["cand_keys"]) > 0
    dynemb.restore_tables(str(out / "base"), [t])
    dynemb.restore_tables(str(out / "delta"), [t])
    _same(_state_of("inc"), want)


def _tool(*args):
    import subprocess
    return subprocess.run([_TOOL, *map(str, args)], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.pinned_only
@_needs_ranks
@pytest.mark.parametrize("n", [2, 3])
def test_command_line_tool_reads_every_rank_part(ranked_chains, n, tmp_path):
    """`dynemb ckpt inspect|verify|export` on the checkpoints n ranks wrote
    (a full save, a delta building on one, and a full save of the delta's
    moment): the rank count, each part's tables as the part alone shows
    them and their totals; every part verified, a damaged one named; and
    the export is the union of what the ranks held at that moment."""
    import json
    import shutil
    out = ranked_chains(n)
    live = [(np.load(out / "live" / ("rank-%d" % r) / "inc" / "keys.npy"),
             np.load(out / "live" / ("rank-%d" % r) / "inc" / "embeddings.npy"))
            for r in range(n)]
    keys = np.concatenate([k for k, _ in live])
    order = np.argsort(keys)
    assert len(np.unique(keys)) == len(keys) > 50  # (each key on one rank)
    want_keys, want_emb = keys[order], np.concatenate([e for _, e in live])[order]
    labels = ["rank-%d-of-%d" % (r, n) for r in range(n)]

    for ckpt in ("base", "delta", "full"):
        r = _tool("ckpt", "inspect", "--json", out / ckpt)
        assert r.returncode == 0, r.stderr
        got = json.loads(r.stdout)
        assert got["ranks"] == n and len(got["parts"]) == n
        alone = [json.loads(_tool("ckpt", "inspect", "--json", out / ckpt / p).stdout)
                 for p in labels]
        for part, one, label in zip(got["parts"], alone, labels):
            assert part["dir"] == str(out / ckpt / label)
            assert part["tables"] == one["tables"]
        (total,) = got["tables"]
        assert total["name"] == "inc" and total["parts"] == n
        for field in ("rows", "candidates", "file_bytes"):
            assert total[field] == sum(a["tables"][0][field] for a in alone), field
        assert total["optimizer"] == "adagrad" and total["dim"] == 3
        if ckpt == "delta":
            assert os.path.normpath(got["builds_on"]) == str(out / "base")
        else:
            assert got["builds_on"] is None
        if ckpt == "full":
            assert total["rows"] == len(want_keys)
        r = _tool("ckpt", "inspect", out / ckpt)
        assert "written by %d ranks" % n in r.stdout and "total of %d parts" % n in r.stdout
        r = _tool("ckpt", "verify", out / ckpt)
        assert r.returncode == 0 and "(%d parts, 1 table," % n in r.stdout, r.stderr

    for ckpt in ("delta", "full"):
        r = _tool("ckpt", "export", out / ckpt, tmp_path / ckpt)
        assert r.returncode == 0, r.stderr
        np.testing.assert_array_equal(np.load(tmp_path / ckpt / "inc" / "keys.npy"), want_keys)
        np.testing.assert_array_equal(np.load(tmp_path / ckpt / "inc" / "embeddings.npy"),
                                      want_emb)

    # A flipped byte in the last rank's part of the base: verify and export
    # of the delta (which builds on it) fail and name that part and file.
    copy = tmp_path / "copy"
    shutil.copytree(out / "base", copy / "base")
    shutil.copytree(out / "delta", copy / "delta")
    (victim,) = (copy / "base" / labels[-1]).glob("*.dtab")
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    r = _tool("ckpt", "verify", copy / "delta")
    assert r.returncode == 1 and r.stdout == ""
    assert "part %s is damaged" % labels[-1] in r.stderr and victim.name in r.stderr
    assert "1 of the %d parts" % n in r.stderr
    assert not any("part %s " % p in r.stderr for p in labels[:-1]), r.stderr
    r = _tool("ckpt", "export", copy / "delta", tmp_path / "bad")
    assert r.returncode == 1 and labels[-1] in r.stderr
    assert not (tmp_path / "bad" / "inc").exists()
    # A missing part: named by every command.
    shutil.rmtree(copy / "delta" / labels[0])
    for cmd in ("inspect", "verify"):
        r = _tool("ckpt", cmd, copy / "delta")
        assert r.returncode == 1 and "rank(s) 0 " in r.stderr, r.stderr


def test_restore_model_version_picks_the_step(tmp_path):
    """init(is_incremental_checkpoint=True, restore_model_version=V): Saver.restore
    given any checkpoint of the prefix (as Estimator gives the latest) loads step
    V, a full save or a delta, dense variables included."""
    dynemb.init(is_incremental_checkpoint=True, save_checkpoint_due_time=100,
                save_delta_checkpoints_secs=10, restore_model_version=2)
    t, ids, train, _ = _model()
    gs = tf.compat.v1.train.get_global_step()
    saver = tf.compat.v1.train.Saver()
    prefix = str(tmp_path / "model")
    rng = np.random.default_rng(5)
    states, steps = {}, {}
    with tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        for step in (1, 2, 3):
            _steps(s, ids, train, rng, 2)
            saver.save(s, prefix, global_step=step, save_delta=step > 1)
            states[step], steps[step] = _state_of("inc"), s.run(gs)
        saver.restore(s, tf.train.latest_checkpoint(str(tmp_path)))   # step 3's path
        _same(_state_of("inc"), states[2])
        assert s.run(gs) == steps[2]
        dynemb.init(is_incremental_checkpoint=True, save_checkpoint_due_time=100,
                    save_delta_checkpoints_secs=10, restore_model_version=7)
        with pytest.raises(ValueError, match=r"no checkpoint .*model-7.*saved steps: 1, 2, 3"):
            saver.restore(s, prefix + "-3")
    with pytest.raises(ValueError, match="restore_model_version"):
        dynemb.init(restore_model_version="latest")
