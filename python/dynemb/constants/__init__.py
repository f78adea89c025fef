"""Constants (mxRec: ``mx_rec.constants``)."""
