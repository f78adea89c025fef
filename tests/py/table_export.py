"""The rows of a dynemb table as numpy arrays sorted by key, read through the
DynembExport op in a graph and session of their own (shared by the tests that
compare whole tables)."""
import numpy as np
import tensorflow as tf

from dynemb import _lib


def export_sorted(name):
    """(keys, values) of table `name`, in key order."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        out = s.run(list(_lib.ops.dynemb_export(table_name=name)))
    order = np.argsort(out[1])
    return out[1][order], out[2][order]
