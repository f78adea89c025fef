"""The rows of a dynemb table as numpy arrays sorted by key, read through the
DynembExport op in a graph and session of their own (shared by the tests that
compare whole tables)."""
import ctypes
import os

import numpy as np
import tensorflow as tf

from dynemb import _lib


def export_sorted(name):
    """(keys, values) of table `name`, in key order."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        out = s.run(list(_lib.ops.dynemb_export(table_name=name)))
    order = np.argsort(out[1])
    return out[1][order], out[2][order]


def checkpoint_rows(saver_prefix, name):
    """(keys, values) of table `name` in a Saver checkpoint, sorted by key:
    read from its sparse directory (mxRec's sparse-<prefix>) by the engine.
    A directory stands for its latest checkpoint."""
    prefix = str(saver_prefix)
    if os.path.isdir(prefix) and not os.path.basename(prefix).startswith("sparse-"):
        prefix = tf.train.latest_checkpoint(prefix) or prefix
    d, base = os.path.split(os.path.normpath(prefix))
    snap = _lib.Snapshot()
    _lib.check(_lib.clib.dynemb_checkpoint_read(os.path.join(d, "sparse-" + base).encode(),
                                                name.encode(), ctypes.byref(snap)),
               "checkpoint_rows")
    try:
        keys = np.ctypeslib.as_array(snap.keys, (snap.rows,)).copy() if snap.rows else \
            np.zeros([0], np.int64)
        values = np.ctypeslib.as_array(snap.values, (snap.rows, snap.row_floats)).copy() \
            if snap.rows else np.zeros([0, snap.row_floats], np.float32)
    finally:
        _lib.clib.dynemb_snapshot_free(ctypes.byref(snap))
    order = np.argsort(keys)
    return keys[order], values[order]


def run_pipeline(iterator, train, modify, steps):
    """Runs `train` `steps` times over an initializable iterator, after
    automatic graph modification when `modify` is set."""
    from dynemb.graph.modifier import modify_graph_and_start_emb_cache
    from dynemb.util.initialize import get_initializer
    if modify:
        modify_graph_and_start_emb_cache()
    with tf.compat.v1.Session() as s:
        s.run(get_initializer(True) if modify else iterator.initializer)
        for _ in range(steps):
            s.run(train)
