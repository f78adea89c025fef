"""Process configuration, variables, logging (mxRec: ``mx_rec.util``)."""
