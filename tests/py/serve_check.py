"""Loads a SavedModel exported by dynemb the way a serving system does: in a
fresh process where `import dynemb` fails (so no dynemb op library can be
loaded), with stock TensorFlow only. Prints one JSON object:

  ops         the op types of the model's graph and functions
  unknown     those that this TensorFlow does not register (must be none)
  tf          this TensorFlow's version
  max_diff_*  with --criteo DATA --predictions FILE: the largest difference
              between the model's probabilities for the held-out rows of
              DATA and FILE's, through the TF1 loader (a Session, as
              TensorFlow Serving loads) and the TF2 one (tf.saved_model.load)

    python serve_check.py MODEL_DIR [--criteo DATA --predictions FILE]
"""
import argparse
import importlib.abc
import json
import os
import sys


class _NoDynemb(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "dynemb" or name.startswith("dynemb."):
            raise ImportError("dynemb is not installed in this (serving) process")
        return None


sys.meta_path.insert(0, _NoDynemb())

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.python.framework import op_def_registry  # noqa: E402


def heldout(data):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                    "examples"))
    import criteo_data  # (TensorFlow only)
    ds = criteo_data.make_dataset("eval", 512, data)
    return [x for x, _ in ds.as_numpy_iterator()]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model")
    p.add_argument("--criteo")
    p.add_argument("--predictions")
    args = p.parse_args()
    out = {"tf": tf.__version__}
    batches = heldout(args.criteo) if args.criteo else None
    with tf.Graph().as_default(), tf.compat.v1.Session() as s:
        mg = tf.compat.v1.saved_model.loader.load(s, ["serve"], args.model)
        ops = {n.op for n in mg.graph_def.node}
        for f in mg.graph_def.library.function:
            ops |= {n.op for n in f.node_def}
        ops -= {f.signature.name for f in mg.graph_def.library.function}
        out["ops"] = sorted(ops)
        out["unknown"] = sorted(o for o in ops if op_def_registry.get(o) is None)
        if batches:
            sig = mg.signature_def["serving_default"]
            name = sorted(sig.outputs)[0]
            got = np.concatenate([s.run(sig.outputs[name].name,
                                        {sig.inputs[k].name: v for k, v in b.items()
                                         if k in sig.inputs}) for b in batches])
            ref = np.load(args.predictions)
            out["rows"] = int(len(got))
            out["max_diff_tf1"] = float(np.abs(got.reshape(-1) - ref.reshape(-1)).max())
    if batches:
        fn = tf.saved_model.load(args.model).signatures["serving_default"]
        got = np.concatenate([list(fn(**{k: tf.constant(v) for k, v in b.items()
                                         if k in fn.structured_input_signature[1]}).values())[0]
                              .numpy() for b in batches])
        out["max_diff_tf2"] = float(np.abs(got.reshape(-1) - ref.reshape(-1)).max())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
