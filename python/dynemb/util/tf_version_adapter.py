"""mxRec's ``mx_rec.util.tf_version_adapter``: where scripts import the HCCL
op module (``from mx_rec.util.tf_version_adapter import hccl_ops``).

Here ``hccl_ops`` is ``dynemb.util.communication.hccl_ops``: the rank queries
and ``allreduce``, for one process.
"""
from dynemb.util.communication import hccl_ops

__all__ = ["hccl_ops"]
