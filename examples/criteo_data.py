"""Criteo Display Advertising data as a tf.data pipeline (for the demo and tests).

The file is the Criteo Kaggle 2014 `train.txt` format: tab-separated, no header,
40 columns per line:

    label   I1 .. I13 (integers, may be empty)   C1 .. C26 (32-bit hex hashes, may be empty)

What the pipeline yields per batch (a dict, plus the label):

  * ``"dense"``: float32 ``[batch, 13]``, ``sign(x) * log(1 + |x|)`` of each integer
    feature; a missing value is 0.
  * ``"C1"`` .. ``"C26"``: int64 ``[batch]``, the raw hash values themselves used as
    feature ids: the hex string parsed to an integer in [0, 2^32). There is no
    vocabulary and no modulo: dynemb tables grow with the ids they see.
    An empty field gets the reserved id ``MISSING_ID = 2**32``, a value no 32-bit
    hash can take, so "missing" is its own feature and collides with nothing.
  * label: float32 ``[batch]``, 0 or 1.

The split is by position: the last ``eval_fraction`` of the lines (20 % by default)
is the held-out set, the rest is for training (the file is in log order, so this
evaluates on later traffic).

The data file defaults to ``../shared/data/criteo-10k.tsv`` relative to the
repository (the first 10,000 lines of Criteo's training set, published by Criteo for
non-commercial research); ``DYNEMB_CRITEO`` or the ``path`` argument overrides it.
"""

from __future__ import annotations

import os
from typing import Dict, Optional, Tuple

import tensorflow as tf

NUM_INT = 13
NUM_CAT = 26
NUM_COLUMNS = 1 + NUM_INT + NUM_CAT
CAT_NAMES = tuple(f"C{i + 1}" for i in range(NUM_CAT))
MISSING_ID = 2**32  # id of an empty categorical field (outside the 32-bit range)

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PATH = os.path.normpath(os.path.join(_REPO, "..", "shared", "data", "criteo-10k.tsv"))
ENV_VAR = "DYNEMB_CRITEO"


def data_path(path: Optional[str] = None) -> str:
    """The data file to read: `path`, else $DYNEMB_CRITEO, else the shared copy.

    Raises FileNotFoundError with the places tried and how to fix it.
    """
    chosen = path or os.environ.get(ENV_VAR) or DEFAULT_PATH
    if not os.path.isfile(chosen):
        raise FileNotFoundError(
            f"Criteo data file not found: {chosen!r}. Expected the first 10,000 lines of "
            f"Criteo's train.txt (tab-separated: label, I1-I13, C1-C26) at {DEFAULT_PATH}; "
            f"point ${ENV_VAR} (or --data) at another copy.")
    return chosen


def count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def split_sizes(path: str, eval_fraction: float = 0.2) -> Tuple[int, int]:
    """(train_rows, eval_rows): the last `eval_fraction` of the lines is held out."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    total = count_lines(path)
    n_eval = max(1, int(round(total * eval_fraction)))
    if n_eval >= total:
        raise ValueError(f"{path} has {total} lines: too few to hold out {eval_fraction:.0%}")
    return total - n_eval, n_eval


def hex_to_id(hex_strings: tf.Tensor) -> tf.Tensor:
    """Parses 8-digit hex strings (any shape) to int64 ids; '' -> MISSING_ID.

    Done with plain TensorFlow ops so it runs inside tf.data. Criteo's hashes are
    always 8 hex digits; anything else (other lengths, non-hex characters) is a
    data error and fails the step with a message.
    """
    length = tf.strings.length(hex_strings)
    ok = tf.reduce_all(tf.logical_or(tf.equal(length, 0), tf.equal(length, 8)))
    check = tf.debugging.Assert(ok, ["Criteo categorical values must be 8 hex digits or empty",
                                     tf.boolean_mask(hex_strings, tf.logical_and(length > 0, length != 8))],
                                summarize=5)
    with tf.control_dependencies([check]):
        codes = tf.cast(tf.io.decode_raw(hex_strings, tf.uint8, fixed_length=8), tf.int64)  # [..., 8]
    # '0'-'9' = 48-57, 'A'-'F' = 65-70, 'a'-'f' = 97-102.
    nibble = tf.where(codes >= 97, codes - 87, tf.where(codes >= 65, codes - 55, codes - 48))
    bad = tf.logical_or(nibble < 0, nibble > 15)
    valid = tf.logical_or(tf.logical_not(bad), tf.expand_dims(tf.equal(length, 0), -1))
    check_hex = tf.debugging.Assert(tf.reduce_all(valid), ["Criteo categorical value is not hex"])
    with tf.control_dependencies([check_hex]):
        weights = tf.constant([16**(7 - i) for i in range(8)], tf.int64)
        value = tf.reduce_sum(nibble * weights, axis=-1)
    return tf.where(tf.equal(length, 0), tf.constant(MISSING_ID, tf.int64), value)


def parse_lines(lines: tf.Tensor) -> Tuple[Dict[str, tf.Tensor], tf.Tensor]:
    """A batch of raw lines ([batch] string) -> (features dict, label)."""
    defaults = [[0]] + [[0]] * NUM_INT + [[""]] * NUM_CAT
    cols = tf.io.decode_csv(lines, record_defaults=defaults, field_delim="\t", na_value="")
    label = tf.cast(cols[0], tf.float32)
    ints = tf.cast(tf.stack(cols[1:1 + NUM_INT], axis=1), tf.float32)
    dense = tf.sign(ints) * tf.math.log1p(tf.abs(ints))
    features: Dict[str, tf.Tensor] = {"dense": dense}
    for name, col in zip(CAT_NAMES, cols[1 + NUM_INT:]):
        features[name] = hex_to_id(col)
    return features, label


def make_dataset(split: str, batch_size: int, path: Optional[str] = None,
                 eval_fraction: float = 0.2, shuffle_seed: Optional[int] = None,
                 epochs: int = 1, part: Optional[Tuple[int, int]] = None) -> tf.data.Dataset:
    """The train or eval split, batched and parsed (the last batch may be short).

    `shuffle_seed` shuffles the rows (None: file order); `epochs` repeats;
    `part=(k, n)` keeps only the k-th of n consecutive, equal parts of the split
    (e.g. "yesterday" and "today" for a warm-started run).
    """
    if split not in ("train", "eval"):
        raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
    path = data_path(path)
    n_train, n_eval = split_sizes(path, eval_fraction)
    ds = tf.data.TextLineDataset(path)
    ds = ds.take(n_train) if split == "train" else ds.skip(n_train)
    rows = n_train if split == "train" else n_eval
    if part is not None:
        k, n = part
        if not 0 <= k < n:
            raise ValueError(f"part must be (k, n) with 0 <= k < n, got {part!r}")
        first, last = rows * k // n, rows * (k + 1) // n
        ds = ds.skip(first).take(last - first)
        rows = last - first
    if shuffle_seed is not None:
        ds = ds.shuffle(rows, seed=shuffle_seed, reshuffle_each_iteration=True)
    if epochs != 1:
        ds = ds.repeat(epochs)
    return ds.batch(batch_size).map(parse_lines, num_parallel_calls=2).prefetch(2)
