"""Run under mpirun by tests/py/test_mpi_launch.py: writes this process's
ranks as dynemb answers them, and what creating tables does (the same
table on every rank, then one whose dim differs by rank), as JSON into
$RESULTS/<the rank mpirun gave this process>.json (one file per process:
mpirun interleaves the processes' output)."""
import json
import os

import tensorflow as tf

import dynemb
from dynemb.util.communication import hccl_ops

tf.compat.v1.disable_eager_execution()
dynemb.init(use_mpi=True)
out = {"rank": hccl_ops.get_rank_id(), "size": hccl_ops.get_rank_size(),
       "local_size": hccl_ops.get_local_rank_size()}
dynemb.create_table(tf.int64, 4, "t", tf.compat.v1.zeros_initializer())
out["create_table"] = "created"
try:
    dynemb.create_table(tf.int64, 4 + out["rank"], "u", tf.compat.v1.zeros_initializer())
    out["mismatch"] = "created"
except ValueError as e:
    out["mismatch"] = str(e)
with open(os.path.join(os.environ["RESULTS"], os.environ["OMPI_COMM_WORLD_RANK"] + ".json"),
          "w") as f:
    json.dump(out, f)
