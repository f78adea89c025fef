"""start_asc_pipeline (mxRec: ``mx_rec.core.asc.manager``).

This module is mxRec's import path only; the code lives in
dynemb.core.asc.lookups.
"""
from dynemb.core.asc.lookups import batch_features, register_lookup_ids, start_asc_pipeline

__all__ = ["batch_features", "register_lookup_ids", "start_asc_pipeline"]
