"""mxRec's ``mx_rec.saver`` package (``saver.sparse.export``)."""
