"""Process ranks and collectives (mxRec: ``mx_rec.util.communication``).

Nothing is imported here, so that ``import dynemb.util.communication.hccl_ops``
loads only that module; the ``hccl_ops`` attribute (mxRec's examples reach
it as ``mxrec_util.communication.hccl_ops``) loads it when first asked for.
"""
import importlib


def __getattr__(name: str):
    if name == "hccl_ops":
        return importlib.import_module("dynemb.util.communication.hccl_ops")
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
