"""An mxRec-style script (tests/py/mxrec_style/train.py: mxRec's little demo
in shape, after the migration edits only) runs in every mode its run script
offers off Ascend: train, load_and_train and predict (finding the checkpoint
by mxRec's saved-model/sparse-model-* layout), HBM / DDR / SSD cache modes, both
graph modes, data timestamps, one-shot iterators, static shapes, several lookups
of a table and dynamic expansion with the by-address optimizer. Each run is a
fresh process, as a user runs it."""
import math
import os
import subprocess
import sys

import pytest

import tensorflow as tf

# The script runs 15 times (about 80 s): on the pinned TensorFlow only, to keep
# the suite within its time; the compatibility run's sess.run tests cover the
# newer TensorFlow.
pytestmark = pytest.mark.skipif(
    tuple(int(x) for x in tf.__version__.split(".")[:2]) >= (2, 16),
    reason="the mxRec-style script runs on the pinned TensorFlow (suite time)")

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mxrec_style", "train.py")
TRAIN_STEPS, EVAL_ROUNDS = 24, 3


def _run(cwd, **env):
    full = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", **{k: str(v) for k, v in env.items()})
    r = subprocess.run([sys.executable, SCRIPT], cwd=cwd, env=full, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, "%s\n%s" % (env, r.stderr[-3000:])
    line = [x for x in r.stdout.splitlines() if x.startswith("RESULT ")][-1]
    fields = dict(kv.split("=", 1) for kv in line.split()[1:])
    return {"step": int(fields["step"]), "first": float(fields["first_loss"]),
            "last": float(fields["last_loss"]),
            "evals": [float(x) for x in fields["evals"].split(",") if x],
            "sizes": [int(x) for x in fields["sizes"].split(",")],
            "seen_items": int(fields["seen_items"])}


def _trained(res):
    assert res["step"] == TRAIN_STEPS
    assert math.isfinite(res["first"]) and math.isfinite(res["last"])
    assert len(res["evals"]) == EVAL_ROUNDS and all(map(math.isfinite, res["evals"]))
    assert all(n > 0 for n in res["sizes"])


@pytest.mark.parametrize("cache_mode", ["HBM", "DDR", "SSD"])
def test_train_then_load_and_train_then_predict(tmp_path, cache_mode):
    first = _run(tmp_path, CACHE_MODE=cache_mode)
    _trained(first)
    assert (tmp_path / "saved-model" / "sparse-model-24").is_dir()
    again = _run(tmp_path, CACHE_MODE=cache_mode, USE_MODE="load_and_train")
    assert again["step"] == 2 * TRAIN_STEPS  # continued from the checkpoint of step 24
    assert again["first"] < first["first"]   # from trained weights, on the same data
    assert again["sizes"] == first["sizes"] or all(
        b >= a for a, b in zip(first["sizes"], again["sizes"]))
    pred = _run(tmp_path, CACHE_MODE=cache_mode, USE_MODE="predict")
    assert pred["step"] == 2 * TRAIN_STEPS and len(pred["evals"]) == EVAL_ROUNDS
    assert pred["sizes"] == again["sizes"]    # predicting trains nothing


def test_predict_without_a_model_stops_with_mxrecs_message(tmp_path):
    r = subprocess.run([sys.executable, SCRIPT], cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, USE_MODE="predict", TF_CPP_MIN_LOG_LEVEL="2"),
                       timeout=300)
    assert r.returncode != 0 and "no model file exist" in r.stderr


@pytest.mark.parametrize("env", [
    {"USE_MODIFY_GRAPH": 0, "CACHE_MODE": "DDR"},
    {"USE_TIMESTAMP": 1},
    {"USE_TIMESTAMP": 1, "USE_MODIFY_GRAPH": 0},
    {"USE_ONE_SHOT": 1},
    {"USE_ONE_SHOT": 1, "USE_MODIFY_GRAPH": 0},
    {"USE_DYNAMIC": 0},
    {"USE_MULTI_LOOKUP": 1},
    {"USE_MULTI_LOOKUP": 1, "USE_MODIFY_GRAPH": 0},
    {"USE_DYNAMIC_EXPANSION": 1},
    {"USE_DYNAMIC_EXPANSION": 1, "USE_MODIFY_GRAPH": 0},
], ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_modes(tmp_path, env):
    _trained(_run(tmp_path, **env))


def test_admission_settings_reach_the_tables(tmp_path):
    # FeatureSpec mode admits user ids at their second sighting (and item ids,
    # weighted by faae_coefficient 4, at their first): fewer user rows than
    # graph modification without thresholds, every item of the batches
    # trained on (the dataset holds just those, so no pipeline prepares more).
    (tmp_path / "modify").mkdir()
    (tmp_path / "fs").mkdir()
    plain = _run(tmp_path / "modify")
    fs = _run(tmp_path / "fs", USE_MODIFY_GRAPH=0)
    assert fs["sizes"][0] < plain["sizes"][0]
    assert fs["sizes"][1] == fs["seen_items"] == plain["sizes"][1] == plain["seen_items"]
