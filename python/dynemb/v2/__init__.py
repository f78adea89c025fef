"""mxRec's second API generation ("Rec SDK TensorFlow", ``import mxrec``) on
dynemb's engine.

Migrate a script by one line: replace ``import mxrec`` with

    import dynemb.v2 as mxrec

Why this form: the second generation is one flat module (every name is
``mxrec.<name>``), while the first generation's names live at mxRec's
package paths (``mx_rec.core.embedding.create_table`` is
``dynemb.core.embedding.create_table``). A subpackage of its own keeps the
two apart: nothing under ``dynemb.*`` changes meaning, the flat names of the
second generation (``init``, ``embedding_lookup``, ...) cannot shadow the
first generation's (``dynemb.init`` takes keywords, this ``init`` a TOML
path), and ``as mxrec`` leaves the rest of the script as it was. A
top-level ``mxrec`` module would be a one-line alias of this package, but it
would claim a name that belongs to Huawei's package in the same
environment; docs/mxrec-v2.md shows how a project can add that alias itself.

What is here, and every difference from mxRec's documented behaviour with
its reason: docs/mxrec-v2.md.
"""
__all__ = [
    "AdamWOptimizer", "EmbDistributionStrategy", "EmbeddingTableSaver", "TomlConfigError",
    "embedding_lookup", "get_config", "get_embedding_table", "get_existing_tables",
    "get_init_hashtable_op", "get_local_rank_size", "get_rank_id", "get_rank_size",
    "get_sparse_embedding", "hccl_ops", "init",
]


def __getattr__(name: str):
    # The names load when first asked for (PEP 562): the package body imports
    # none of its own modules, so that they can import each other without a
    # cycle through it (tests/py/test_layering.py).
    if name in ("get_rank_id", "get_rank_size", "get_local_rank_size"):
        from dynemb import _state
        return getattr(_state, name)
    if name == "AdamWOptimizer":
        from dynemb.optimizers.adamw import AdamWOptimizer
        return AdamWOptimizer
    if name == "hccl_ops":
        from dynemb.util.communication import hccl_ops
        return hccl_ops
    if name in ("TomlConfigError", "get_config", "init"):
        from dynemb.v2 import config
        return getattr(config, name)
    if name == "EmbeddingTableSaver":
        from dynemb.v2.saver import EmbeddingTableSaver
        return EmbeddingTableSaver
    if name in __all__:
        from dynemb.v2 import tables
        return getattr(tables, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))
