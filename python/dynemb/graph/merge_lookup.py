"""mxRec's ``mx_rec.graph.merge_lookup``: ``do_merge_lookup(is_train)`` merges the
lookups of each table so that a script taking tf.gradients itself gets one
gradient per table. dynemb's lookups of a table already share the table's
sparse variable (one IndexedSlices gradient over all its lookups), so there is
nothing left to merge: the call checks its argument and returns."""


def do_merge_lookup(is_train: bool = True) -> None:
    if not isinstance(is_train, bool):
        raise TypeError("do_merge_lookup: is_train must be a bool, got %r" % (is_train,))
