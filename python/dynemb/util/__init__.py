"""Process configuration, variables, logging (mxRec: ``mx_rec.util``).

mxRec's examples use ``import mx_rec.util as mxrec_util`` and then
``mxrec_util.communication.hccl_ops.get_rank_id()``: the package's
``communication`` attribute loads that subpackage when first asked for (not
on import, so that importing ``dynemb.util.log`` from the lowest layer loads
nothing above it).
"""
import importlib

__all__ = ["communication"]


def __getattr__(name: str):
    if name == "communication":
        return importlib.import_module("dynemb.util.communication")
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
