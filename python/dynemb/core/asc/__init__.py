"""FeatureSpec mode (mxRec: ``mx_rec.core.asc``): FeatureSpec, get_asc_insert_func,
start_asc_pipeline."""
from dynemb.core.asc.feature_spec import FeatureSpec
from dynemb.core.asc.helper import get_asc_insert_func
from dynemb.core.asc.manager import start_asc_pipeline

__all__ = ["FeatureSpec", "get_asc_insert_func", "start_asc_pipeline"]
