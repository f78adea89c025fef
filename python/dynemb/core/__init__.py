"""Tables, lookups and hooks (mxRec: ``mx_rec.core``)."""
