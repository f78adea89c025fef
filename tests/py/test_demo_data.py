"""The Criteo demo's data pipeline (examples/criteo_data.py) against an
independent pure-Python parse, and the demo's AUC against a pairwise count."""
import math
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
sys.path.insert(0, EXAMPLES)
import criteo_data  # noqa: E402

LINES = [
    "1\t5\t-2\t\t0\t1382\t4\t15\t2\t181\t1\t2\t\t2\t68fd1e64\t80e26c9b\tfb936136\t7b4723c4"
    "\t25c83c98\t7e0ccccf\tde7995b8\t1f89b562\ta73ee510\ta8cd5504\tb2cb9c98\t37c9c164"
    "\t2824a5f6\t1adce6ef\t8ba8b39a\t891b62e7\te5ba7672\tf54016b9\t21ddcdc9\tb1252a9d"
    "\t07b5194c\t\t3a171ecb\tc5c50484\te8b83407\t9727dd16",
    "0\t\t0\t44\t1\t102\t8\t2\t2\t4\t1\t1\t\t4\t\tf0cf0024\t6f67f7e5\t41274cd7\t25c83c98"
    "\tfe6b92e5\t922afcc0\t0b153874\ta73ee510\t2b53e5fb\t4f1b46f3\t623049e6\td7020589"
    "\tb28479f6\te6c5b5cd\tc92f3b61\t07c540c4\tb04e4670\t21ddcdc9\t5840adea\t60f6221e"
    "\t\t3a171ecb\t43f13e8b\te8b83407\tFFFFFFFF",
]


def _reference(line):
    cols = line.split("\t")
    assert len(cols) == 40
    label = float(cols[0])
    dense = [math.copysign(math.log1p(abs(int(c))), int(c)) if c else 0.0 for c in cols[1:14]]
    ids = [int(c, 16) if c else 2**32 for c in cols[14:]]
    return label, dense, ids


def _run(ds, n):
    it = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    out = []
    with tf.compat.v1.Session() as s:
        for _ in range(n):
            out.append(s.run(it))
    return out


def _write(tmp_path, lines):
    p = tmp_path / "mini.tsv"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def test_parse_matches_a_pure_python_parse(tmp_path):
    path = _write(tmp_path, LINES * 5)  # 10 lines: 8 train, 2 held out
    assert criteo_data.split_sizes(path) == (8, 2)
    (feats, label), = _run(criteo_data.make_dataset("train", 8, path), 1)
    assert feats["dense"].dtype == np.float32 and feats["C1"].dtype == np.int64
    for row, line in enumerate((LINES * 5)[:8]):
        want_label, want_dense, want_ids = _reference(line)
        assert label[row] == want_label
        np.testing.assert_allclose(feats["dense"][row], want_dense, rtol=1e-6)
        assert [int(feats[c][row]) for c in criteo_data.CAT_NAMES] == want_ids
    assert criteo_data.MISSING_ID not in range(2**32)  # no 32-bit hash can collide
    (ev, ev_label), = _run(criteo_data.make_dataset("eval", 100, path), 1)
    assert len(ev_label) == 2


def test_real_file_split_and_first_rows():
    path = criteo_data.data_path()
    with open(path) as f:
        head = [next(f).rstrip("\n") for _ in range(3)]
    assert criteo_data.split_sizes(path) == (8000, 2000)
    (feats, label), = _run(criteo_data.make_dataset("train", 3, path), 1)
    for row, line in enumerate(head):
        want_label, want_dense, want_ids = _reference(line)
        assert label[row] == want_label
        np.testing.assert_allclose(feats["dense"][row], want_dense, rtol=1e-6)
        assert [int(feats[c][row]) for c in criteo_data.CAT_NAMES] == want_ids


def test_missing_file_and_override(tmp_path, monkeypatch):
    monkeypatch.setenv(criteo_data.ENV_VAR, str(tmp_path / "nope.tsv"))
    with pytest.raises(FileNotFoundError, match=criteo_data.ENV_VAR):
        criteo_data.data_path()
    path = _write(tmp_path, LINES)
    monkeypatch.setenv(criteo_data.ENV_VAR, path)
    assert criteo_data.data_path() == path
    with pytest.raises(FileNotFoundError):
        criteo_data.data_path(str(tmp_path / "x"))


def test_bad_hex_is_a_data_error():
    ids = criteo_data.hex_to_id(tf.constant(["68fd1e64", "68fd1e6", "zzzzzzzz"]))
    with tf.compat.v1.Session() as s:
        with pytest.raises(tf.errors.InvalidArgumentError, match="8 hex digits"):
            s.run(ids)
        with pytest.raises(tf.errors.InvalidArgumentError, match="not hex"):
            s.run(criteo_data.hex_to_id(tf.constant(["zzzzzzzz"])))
        assert s.run(criteo_data.hex_to_id(tf.constant(["", "00000000", "ffffffff"]))).tolist() \
            == [2**32, 0, 2**32 - 1]


def test_demo_auc_matches_pairwise_count():
    import criteo_demo
    rng = np.random.RandomState(3)
    y = rng.randint(0, 2, 300)
    p = np.round(rng.rand(300), 1)  # many ties
    pos, neg = p[y == 1], p[y == 0]
    want = ((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()) \
        / (len(pos) * len(neg))
    assert criteo_demo.auc(y, p) == pytest.approx(want, rel=1e-12)


def test_make_dataset_part_splits_the_rows(tmp_path):
    lines = [LINES[0].replace("\t5\t", f"\t{i}\t", 1) for i in range(10)]
    path = _write(tmp_path, lines)  # 8 train rows (I1 = 0..7), 2 held out
    got = []
    for k in range(2):
        for x, _ in _run(criteo_data.make_dataset("train", 3, path, part=(k, 2)), 2):
            got.append(x["dense"][:, 0].tolist())
    expm1 = [[round(math.expm1(v)) for v in b] for b in got]
    assert expm1 == [[0, 1, 2], [3], [4, 5, 6], [7]]

