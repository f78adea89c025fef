"""Process ranks and collectives (mxRec: ``mx_rec.util.communication``).

Nothing is imported here, so that ``import dynemb.util.communication.hccl_ops``
loads only that module.
"""
