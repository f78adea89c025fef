"""FeatureSpec mode (mxRec: ``mx_rec.core.asc``): FeatureSpec, get_asc_insert_func,
start_asc_pipeline.

The package also holds what those are built from (spec, lookups, insert),
which the rest of dynemb imports; so that importing those does not import
mxRec's modules, which sit above them, the three names are loaded here when
first asked for.
"""
__all__ = ["FeatureSpec", "get_asc_insert_func", "start_asc_pipeline"]


def __getattr__(name: str):
    if name == "FeatureSpec":
        from dynemb.core.asc.feature_spec import FeatureSpec
        return FeatureSpec
    if name == "get_asc_insert_func":
        from dynemb.core.asc.helper import get_asc_insert_func
        return get_asc_insert_func
    if name == "start_asc_pipeline":
        from dynemb.core.asc.manager import start_asc_pipeline
        return start_asc_pipeline
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
