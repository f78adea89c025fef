"""get_asc_insert_func (mxRec: ``mx_rec.core.asc.helper``).

This module is mxRec's import path only; the code lives in
dynemb.core.asc.insert.
"""
from dynemb.core.asc.insert import get_asc_insert_func

__all__ = ["get_asc_insert_func"]
