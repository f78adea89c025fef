"""FeatureSpec (mxRec: ``mx_rec.core.asc.feature_spec``).

This module is mxRec's import path only; the code lives in
dynemb.core.asc.spec (FeatureSpec) and dynemb.core.asc.lookups (the lookups
that read a FeatureSpec's prepared batch components).
"""
from dynemb._state import table_of_feature
from dynemb.core.asc.lookups import lookup_ids
from dynemb.core.asc.spec import RESERVED_PREFIX, FeatureSpec, admitted_key, tickets_key

__all__ = ["FeatureSpec", "RESERVED_PREFIX", "admitted_key", "tickets_key", "lookup_ids",
           "table_of_feature"]
