"""get_asc_insert_func and FeatureSpec (mxRec: ``mx_rec.core.asc.helper``,
which scripts import both from).

This module is mxRec's import path only; the code lives in
dynemb.core.asc.insert and dynemb.core.asc.spec.
"""
from dynemb.core.asc.insert import get_asc_insert_func
from dynemb.core.asc.spec import FeatureSpec

__all__ = ["FeatureSpec", "get_asc_insert_func"]
