"""EvictHook (mxRec: ``mx_rec.core.feature_process.EvictHook``).

This module is mxRec's import path only; the code lives in
dynemb.core.eviction.
"""
from dynemb.core.eviction import EvictHook

__all__ = ["EvictHook"]
