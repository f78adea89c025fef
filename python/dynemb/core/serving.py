"""SavedModels that stock TensorFlow serves: each dynemb table becomes a
``tf.lookup`` static hash table (key -> row index) and a variable of rows.

TensorFlow Serving and every other TensorFlow runtime lack dynemb's op
library, so an exported graph must hold none of its ops. The rewrite happens
where every export path meets, when a SavedModel builder adds a meta graph
(``tf.compat.v1.saved_model.Builder``, ``simple_save``,
``Estimator.export_saved_model`` and ``export_saved_model`` here all go
through it): in the meta graph's copy of the graph (the session's graph is
left as it is, and may be finalized),

- every lookup (train or eval) becomes a lookup in the hash table and a
  gather from the rows, reading row ``n`` -- the table's default value
  (``serving_default_value``) -- for keys without a row, exactly as an eval
  lookup does: keys never seen, keys still below the admission threshold,
  evicted keys;
- every other dynemb op (applies, evictions, exchanges, statistics) and
  whatever depends on one is removed, then whatever the signatures, the
  init op, the saver and the variables do not need;
- the table's keys and rows are written (streamed by the engine, never
  held in memory whole) as two raw files in the SavedModel's ``assets/``;
  the hash table and the rows variable are filled from them by the
  SavedModel's init op, when the model is loaded.

The table rows are those of the live tables at export time: the Estimator
export restores its checkpoint into them first; a sess.run script exports
what it trained.
"""
from __future__ import annotations

import ctypes
import inspect
import os
import re
import shutil
import threading
import weakref
from typing import Any, Iterable, Iterator, Optional

import tensorflow as tf
from tensorflow.core.framework import node_def_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.core.framework import variable_pb2
from tensorflow.core.protobuf import control_flow_pb2
from tensorflow.python.framework import meta_graph, op_def_registry
from tensorflow.python.saved_model import builder_impl

from dynemb import _lib, _state
from dynemb.core.checkpoint import tables_not_saved
from dynemb.core.tables import TABLE_SAVEABLES
from dynemb.util.log import logger

LOOKUP_TYPES = ("DynembLookup", "DynembShardedLookup")


def _replaced_kind(node: Any) -> Optional[str]:
    """"rows" for a lookup (with attr `found`, its has_row too: a lookup's
    own serving_default_value reads it); None for other nodes."""
    return "rows" if node.op in LOOKUP_TYPES else None
SCOPE = "dynemb_serving"
ASSETS = "assets"
# Meta graph collections of VariableDefs: their nodes must survive pruning,
# since loading a meta graph rebuilds these variables from them.
_VARIABLE_COLLECTIONS = ("variables", "trainable_variables", "local_variables",
                         "model_variables", "moving_average_variables",
                         "metric_variables", "global_step")
_ASSET_COLLECTION = "saved_model_assets"
_INIT_SIGNATURE = "__saved_model_init_op"
_INIT_COLLECTIONS = ("saved_model_main_op", "legacy_init_op")


def _node_of(ref: str) -> str:
    """'^a', 'a:1', 'a' -> 'a'."""
    return ref.lstrip("^").split(":")[0]


def _is_dynemb(op_type: str) -> bool:
    return op_type.startswith("Dynemb")


# --------------------------------------------------------------------------
# The table's files and its stock-op replacement
# --------------------------------------------------------------------------

def _file_stem(table: str, used: set) -> str:
    stem = "dynemb-" + (re.sub(r"[^A-Za-z0-9_.-]", "_", table) or "table")
    out, i = stem, 1
    while out in used:
        out, i = "%s-%d" % (stem, i), i + 1
    used.add(out)
    return out


def _export_raw(table: str, keys_path: str, rows_path: str) -> tuple:
    """(rows, dim) after the engine wrote this process's rows of `table`."""
    rows = ctypes.c_uint64()
    with _lib.table_handle(table, ValueError(
            "dynemb export: the graph looks up table '%s', which is not registered in "
            "this process (dropped?); create it with create_table() before exporting"
            % table)) as h:
        dim = _lib.clib.dynemb_table_dim(h)
        _lib.check(_lib.clib.dynemb_table_export_raw(
            h, keys_path.encode(), rows_path.encode(), ctypes.byref(rows)),
            "dynemb export of table '%s'" % table)
    return rows.value, dim


# Bytes of one rank's rows per exchange while rank 0 gathers a table.
GATHER_CHUNK = 16 << 20


def _agree(error: Optional[str], data: bytes = b"") -> list:
    """Every rank's `data`, in rank order; if any rank says `error`, every
    rank raises it (so no rank waits on one that gave up)."""
    w = _state._world()  # pylint: disable=protected-access
    got = w.allgather(_state.EXPORT_CHANNEL,
                      b"\x01" + error.encode(errors="replace") if error else b"\x00" + data)
    for rank, g in enumerate(got):
        if g[:1] == b"\x01":
            raise RuntimeError("dynemb export: rank %d failed: %s"
                               % (rank, g[1:].decode(errors="replace")))
    return [g[1:] for g in got]


def _gather_table(table: str, keys_path: str, rows_path: str) -> tuple:
    """Several ranks: every rank's rows of `table` (a replicated table: rank
    0's, which are all) into rank 0's files, streamed in parts of
    GATHER_CHUNK bytes; every rank calls it at the same point, and an error
    on any rank is raised on every rank. (rows, dim) of the whole table."""
    import tempfile
    rank, size = _state.get_rank_id(), _state.get_rank_size()
    tmp = tempfile.mkdtemp(prefix="dynemb-export-")
    out_k = out_r = None
    try:
        mine_k, mine_r = os.path.join(tmp, "k"), os.path.join(tmp, "r")
        error, n, dim = None, 0, 0
        try:
            n, dim = _export_raw(table, mine_k, mine_r)
            if rank == 0:
                out_k, out_r = open(keys_path, "wb"), open(rows_path, "wb")
        except Exception as e:  # pylint: disable=broad-except
            error = str(e)
        counts = [int(x) for x in _agree(error, b"%d" % n)]
        if table in _state.REPLICATED_TABLES:
            counts = counts[:1] + [0] * (size - 1)
        for src, count in enumerate(counts):
            for mine, out, total in ((mine_k, out_k, 8 * count),
                                     (mine_r, out_r, 4 * dim * count)):
                with open(mine, "rb") as f:
                    for off in range(0, total, GATHER_CHUNK):
                        want = min(GATHER_CHUNK, total - off)
                        part, error = b"", None
                        if rank == src:
                            part = f.read(want)
                            if len(part) != want:
                                error = "its rows file of table '%s' ended early" % table
                        if src != 0:  # (rank 0's own rows need no exchange)
                            part = _agree(error, part)[src]
                        elif error:
                            raise RuntimeError("dynemb export: " + error)
                        if out is not None:
                            out.write(part)
        error = None
        if out_r is not None:  # the default row, last (every rank has it)
            try:
                with open(mine_r, "rb") as f:
                    f.seek(4 * dim * n)
                    out_r.write(f.read(4 * dim))
                out_k.close()
                out_r.close()
            except Exception as e:  # pylint: disable=broad-except
                error = str(e)
        _agree(error)  # (rank 0's files are complete, or every rank raises)
        return sum(counts), dim
    finally:
        for f in (out_k, out_r):
            if f is not None and not f.closed:
                f.close()
        shutil.rmtree(tmp, ignore_errors=True)


def _write_table(table: str, assets_dir: str, stem: str) -> tuple:
    """(rows, dim) after the table's keys and rows were written: by the
    engine, or on several ranks gathered into rank 0's assets."""
    keys = os.path.join(assets_dir, stem + "-keys.bin")
    rows = os.path.join(assets_dir, stem + "-rows.bin")
    if _state.get_rank_size() > 1:
        return _gather_table(table, keys, rows)
    return _export_raw(table, keys, rows)


def _scope_free(graph_def: Any) -> str:
    names = {n.name.split("/")[0] for n in graph_def.node}
    scope, i = SCOPE, 1
    while scope in names:
        scope, i = "%s_%d" % (SCOPE, i), i + 1
    return scope


def _replacement(scope: str, tables: dict, lookups: list) -> tuple:
    """A graph of stock ops: per table (name -> (stem, rows, dim)) the hash
    table and the rows variable filled from the asset files; per lookup
    (node, dtype) its rows under a temporary name. Returns (graph_def,
    {temporary output name: lookup node name}, {template node: lookup node},
    init op name, asset tensors [(tensor name, file)], VariableDefs,
    table initializer names)."""
    g = tf.Graph()
    outputs, templates, assets, var_defs, table_inits, inits = {}, {}, [], [], [], []
    with g.as_default():
        handles = {}
        for i, (name, (stem, rows, dim)) in enumerate(tables.items()):
            with g.name_scope("%s/table_%d/" % (scope, i)):
                kfile = tf.constant(stem + "-keys.bin", name="keys_file")
                rfile = tf.constant(stem + "-rows.bin", name="rows_file")
                assets += [(kfile.name, stem + "-keys.bin"), (rfile.name, stem + "-rows.bin")]
                keys = tf.io.decode_raw(tf.io.read_file(kfile), tf.int64, little_endian=True)
                # (a table without rows has no index: every key reads the default)
                index = tf.compat.v1.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(
                        tf.reshape(keys, [rows]), tf.range(rows, dtype=tf.int64)),
                    default_value=tf.constant(rows, tf.int64), name="index") if rows else None
                values = tf.reshape(tf.io.decode_raw(tf.io.read_file(rfile), tf.float32,
                                                     little_endian=True), [rows + 1, dim])
                var = tf.compat.v1.Variable(values, trainable=False, use_resource=True,
                                            collections=[], name="rows")
                var_defs.append(var.to_proto())
                if index is not None:
                    table_inits.append(index.initializer.name)
                    inits.append(index.initializer)
                else:
                    inits.append(keys.op)  # (reads the empty file: the asset is used)
                inits.append(var.initializer)
                handles[name] = (index, var, dim)
        for j, (node, dtype) in enumerate(lookups):
            index, var, dim = handles[node.attr["table_name"].s.decode()]
            rows = tables[node.attr["table_name"].s.decode()][1]
            with g.name_scope("%s/lookup_%d/" % (scope, j)):
                ids = tf.compat.v1.placeholder(dtype, name="ids")
                flat = tf.reshape(ids, [-1])
                if dtype != tf.int64:
                    flat = tf.cast(flat, tf.int64)
                at = index.lookup(flat) if index is not None else \
                    tf.fill(tf.shape(flat), tf.constant(rows, tf.int64))
                if "found" in node.attr and node.attr["found"].b:
                    # the lookup's second output: which ids have a row
                    out = tf.identity_n([tf.gather(var, at), at < rows],
                                        name="embeddings")[0]
                else:
                    out = tf.identity(tf.gather(var, at), name="embeddings")
            outputs[out.op.name] = node.name
            templates[ids.op.name] = node
        with g.name_scope("%s/" % scope):
            init = tf.group(*inits, name="init")
    return g.as_graph_def(), outputs, templates, init.name, assets, var_defs, table_inits


# --------------------------------------------------------------------------
# The meta graph rewrite
# --------------------------------------------------------------------------

def _init_node(mg: Any) -> Optional[str]:
    """The node the loader runs after restoring the variables, if any."""
    sig = mg.signature_def.get(_INIT_SIGNATURE)
    if sig is not None and _INIT_SIGNATURE in sig.outputs:
        return _node_of(sig.outputs[_INIT_SIGNATURE].name)
    for key in _INIT_COLLECTIONS:
        if key in mg.collection_def and mg.collection_def[key].node_list.value:
            return _node_of(mg.collection_def[key].node_list.value[0])
    return None


def _signature_nodes(mg: Any) -> Iterator[tuple]:
    for key, sig in mg.signature_def.items():
        for kind, infos in (("input", sig.inputs), ("output", sig.outputs)):
            for arg, info in infos.items():
                names = [info.name] if info.name else [
                    info.coo_sparse.values_tensor_name, info.coo_sparse.indices_tensor_name,
                    info.coo_sparse.dense_shape_tensor_name] + [
                    c.name for c in info.composite_tensor.components]
                for n in names:
                    if n:
                        yield "signature '%s' %s '%s'" % (key, kind, arg), _node_of(n)


def _variable_defs(mg: Any) -> Iterator[tuple]:
    for key in _VARIABLE_COLLECTIONS:
        if key in mg.collection_def:
            for raw in mg.collection_def[key].bytes_list.value:
                v = variable_pb2.VariableDef()
                v.ParseFromString(raw)
                yield key, raw, v


def _var_nodes(v: Any) -> list:
    return [_node_of(n) for n in (v.variable_name, v.initializer_name, v.snapshot_name,
                                  v.initial_value_name) if n]


def _removed(nodes: dict, replaced: set) -> dict:
    """node -> the dynemb op it depends on, for every dynemb op other than
    the replaced lookups and every node downstream of one."""
    why = {n: "%s (%s)" % (n, d.op) for n, d in nodes.items()
           if _is_dynemb(d.op) and n not in replaced}
    consumers: dict = {}
    for n, d in nodes.items():
        if n in replaced:
            continue  # its replacement reads the ids only
        for ref in d.input:
            consumers.setdefault(_node_of(ref), []).append(n)
    stack = list(why)
    while stack:
        n = stack.pop()
        for c in consumers.get(n, ()):
            if c not in why:
                why[c] = why[n]
                stack.append(c)
    return why


def _keep(nodes: dict, roots: list, removed: dict, replaced: set) -> set:
    """Nodes the roots [(what, node)] need (of a replaced lookup, its ids
    only); an error if one needs a removed node."""
    keep: set = set()
    for what, root in roots:
        stack = [root]
        while stack:
            n = stack.pop()
            if n in keep:
                continue
            if n in removed:
                raise ValueError(
                    "dynemb export: %s needs %s, which serving cannot run (it trains or "
                    "changes a table); export the prediction (an eval or train lookup "
                    "and what is computed from it), not the training step" %
                    (what, removed[n]))
            if n not in nodes:
                raise ValueError("dynemb export: %s names node '%s', which is not in the "
                                 "graph" % (what, n))
            keep.add(n)
            inputs = nodes[n].input[:1] if n in replaced else nodes[n].input
            stack.extend(_node_of(r) for r in inputs)
    return keep


def _functions_used(graph_def: Any, nodes: Iterable[Any]) -> set:
    lib = {f.signature.name: f for f in graph_def.library.function}
    used: set = set()

    def refs(node: Any) -> Iterator[str]:
        if node.op in lib:
            yield node.op
        for a in node.attr.values():
            if a.HasField("func"):
                yield a.func.name
            for f in a.list.func:
                yield f.name

    stack = [r for n in nodes for r in refs(n)]
    while stack:
        f = stack.pop()
        if f in used or f not in lib:
            continue
        used.add(f)
        for n in lib[f].node_def:
            if _is_dynemb(n.op):
                raise ValueError("dynemb export: function '%s' of the graph runs %s (%s), "
                                 "which serving cannot run; export a graph whose "
                                 "prediction does not go through it" % (f, n.name, n.op))
            stack.extend(refs(n))
    return used


def _clean_collections(mg: Any, keep: set) -> None:
    for key in list(mg.collection_def):
        col = mg.collection_def[key]
        if col.HasField("node_list"):
            vals = [v for v in col.node_list.value if _node_of(v) in keep]
            del col.node_list.value[:]
            col.node_list.value.extend(vals)
        elif col.HasField("bytes_list") and key in _VARIABLE_COLLECTIONS:
            vals = []
            for raw in col.bytes_list.value:
                v = variable_pb2.VariableDef()
                v.ParseFromString(raw)
                if all(n in keep for n in _var_nodes(v)):
                    vals.append(raw)
            del col.bytes_list.value[:]
            col.bytes_list.value.extend(vals)
        elif col.HasField("bytes_list"):
            # Control-flow contexts, savers, queue runners of the training
            # graph: serving does not need them, and they name removed nodes.
            del mg.collection_def[key]


def _assets_to_file_defs(mg: Any) -> None:
    """The v1 builder records the graph's own assets (vocabularies: the
    ASSET_FILEPATHS collection) in collection saved_model_assets; loaders
    read that collection only when asset_file_def is empty, which the
    tables' assets would make it not: move them into asset_file_def."""
    col = mg.collection_def.get(_ASSET_COLLECTION)
    if col is None:
        return
    have = {a.tensor_info.name for a in mg.asset_file_def}
    for item in col.any_list.value:
        a = meta_graph_pb2.AssetFileDef()
        item.Unpack(a)
        if a.tensor_info.name not in have:
            mg.asset_file_def.add().CopyFrom(a)
    del mg.collection_def[_ASSET_COLLECTION]


def _check_no_while_loop(mg: Any, lookups: list) -> None:
    """A lookup inside a TF1 while loop (tf.map_fn, tf.while_loop without
    control flow v2) would need the loop's frame for its replacement."""
    col = mg.collection_def.get("while_context")
    if col is None:
        return
    for raw in col.bytes_list.value:
        w = control_flow_pb2.WhileContextDef()
        w.ParseFromString(raw)
        prefix = w.context_name.rsplit("/", 1)[0] + "/"
        inside = [n.name for n in lookups if n.name.startswith(prefix)]
        if inside:
            raise ValueError(
                "dynemb export: lookup '%s' runs inside the TF1 while loop '%s' (tf.map_fn "
                "or tf.while_loop without control flow v2), which the serving graph "
                "cannot rebuild; look the ids up before the loop (one lookup of all the "
                "ids, then index the rows inside it), or enable control flow v2"
                % (inside[0], w.context_name))


def rewrite_meta_graph(mg: Any, export_dir: str, written: Optional[dict] = None) -> list:
    """Rewrites meta graph `mg` in place for serving (see the module doc),
    writing the tables' files into `export_dir`/assets (`written`: the
    tables this export already wrote, name -> (stem, rows, dim), shared by
    its meta graphs and updated). Returns the names of the tables exported
    (none: `mg` is left as it is)."""
    gd = mg.graph_def
    nodes = {n.name: n for n in gd.node}
    lookups = [n for n in gd.node if _replaced_kind(n)]
    if not lookups and not any(_is_dynemb(n.op) for n in gd.node):
        return []
    if "://" in export_dir:
        raise ValueError(
            "dynemb export: '%s' is on a TensorFlow file system; the tables' files are "
            "written by the engine to a local directory: export to a local path, then "
            "copy the directory (e.g. gsutil cp -r / hdfs dfs -put)" % export_dir)
    _check_no_while_loop(mg, lookups)
    _assets_to_file_defs(mg)
    written = {} if written is None else written
    names = list(dict.fromkeys(n.attr["table_name"].s.decode() for n in lookups))
    removed = _removed(nodes, {n.name for n in lookups})
    init_name = _init_node(mg)
    roots = list(_signature_nodes(mg))
    if init_name:
        roots.append(("the SavedModel's init op", init_name))
    sd = mg.saver_def
    roots += [("the saver", _node_of(n)) for n in (sd.filename_tensor_name,
                                                  sd.save_tensor_name, sd.restore_op_name) if n]
    roots += [("asset '%s'" % a.filename, _node_of(a.tensor_info.name))
              for a in mg.asset_file_def]
    roots += [("variable '%s' of collection '%s'" % (v.variable_name, key), n)
              for key, _, v in _variable_defs(mg)
              if not any(m in removed or m not in nodes for m in _var_nodes(v))
              for n in _var_nodes(v)]
    keep = _keep(nodes, roots, removed, {n.name for n in lookups})
    used = [n for n in lookups if n.name in keep]
    if not used:
        logger.info("dynemb export: no signature reads a dynemb table; nothing to export")

    # (checked before any table is written)
    _functions_used(gd, [n for n in gd.node if n.name in keep])
    scope = _scope_free(gd)
    assets_dir = os.path.join(export_dir, ASSETS)
    os.makedirs(assets_dir, exist_ok=True)
    stems = {t[0] for t in written.values()}
    tables = {}
    for name in dict.fromkeys(n.attr["table_name"].s.decode() for n in used):
        if name not in written:  # (each table once per export, whatever its meta graphs)
            stem = _file_stem(name, stems)
            rows, dim = _write_table(name, assets_dir, stem)
            written[name] = (stem, rows, dim)
            logger.debug("dynemb export: table '%s': %d rows x %d written to %s", name,
                         rows, dim, assets_dir)
        tables[name] = written[name]
    if tables and _state.get_rank_id() == 0:
        logger.info("dynemb export: %d table(s), %d rows, %.1f MB written to %s",
                    len(tables), sum(t[1] for t in tables.values()),
                    sum(os.path.getsize(os.path.join(assets_dir, t[0] + x))
                        for t in tables.values() for x in ("-keys.bin", "-rows.bin")) / 1e6,
                    assets_dir)
    dtypes = [tf.as_dtype(n.attr["Tkeys"].type) if "Tkeys" in n.attr else tf.int64
              for n in used]
    rgd, outputs, templates, init, assets, var_defs, table_inits = _replacement(
        scope, tables, list(zip(used, dtypes)))

    def fix(ref: str) -> str:
        ctrl, node = ref.startswith("^"), _node_of(ref)
        if node in templates:
            ids = templates[node].input[0]
            return "^" + _node_of(ids) if ctrl else ids
        if node in outputs:
            return ref.replace(node, outputs[node], 1)
        return ref

    # Default-valued attributes of the new nodes are left out (what
    # strip_default_attrs does), so that older TensorFlow Serving releases,
    # whose op definitions lack newer attributes, load the model too.
    scratch = meta_graph_pb2.MetaGraphDef()
    scratch.graph_def.CopyFrom(rgd)
    meta_graph.strip_graph_default_valued_attrs(scratch)
    rgd = scratch.graph_def
    new_nodes = []
    for n in rgd.node:
        if n.name in templates:
            continue
        m = node_def_pb2.NodeDef()
        m.CopyFrom(n)
        m.name = outputs.get(n.name, n.name)
        del m.input[:]
        m.input.extend(fix(r) for r in n.input)
        new_nodes.append(m)
    out_nodes = [n for n in gd.node if n.name in keep and not _replaced_kind(n)]
    kept = [node_def_pb2.NodeDef() for _ in out_nodes]
    for k, n in zip(kept, out_nodes):
        k.CopyFrom(n)
    functions = _functions_used(gd, kept)
    library = [f for f in gd.library.function if f.signature.name in functions]
    gradients = [gr for gr in gd.library.gradient if gr.function_name in functions]
    final_names = {n.name for n in kept + new_nodes}
    for n in kept:  # (colocation with a pruned node would fail every import)
        if "_class" in n.attr:
            locs = [c for c in n.attr["_class"].list.s
                    if not c.startswith(b"loc:@") or c[5:].decode() in final_names]
            if locs:
                del n.attr["_class"].list.s[:]
                n.attr["_class"].list.s.extend(locs)
            else:
                del n.attr["_class"]
    del gd.node[:]
    gd.node.extend(kept + new_nodes)
    del gd.library.function[:]
    gd.library.function.extend(library)
    del gd.library.gradient[:]
    gd.library.gradient.extend(gradients)
    final = {n.name for n in gd.node}

    if tables:
        if init_name:
            by_name = {n.name: n for n in gd.node}
            by_name[init_name].input.append("^" + init)
        else:
            mg.collection_def[_INIT_COLLECTIONS[0]].node_list.value.append(init)
        for tensor, filename in assets:
            a = mg.asset_file_def.add()
            a.tensor_info.name = tensor
            a.filename = filename
        for v in var_defs:
            mg.collection_def["local_variables"].bytes_list.value.append(
                v.SerializeToString())
        mg.collection_def["table_initializer"].node_list.value.extend(table_inits)
    _clean_collections(mg, final)
    _strip_op_list(mg)
    left = sorted({n.op for n in gd.node if _is_dynemb(n.op)})
    if left:  # (not expected: the pruning above removes them all)
        raise ValueError("dynemb export: the serving graph still has dynemb ops %s" % left)
    return list(tables)


def _strip_op_list(mg: Any) -> None:
    """The meta graph's list of the op definitions it uses, for the ops it
    uses now."""
    used = {n.op for n in mg.graph_def.node}
    for f in mg.graph_def.library.function:
        used |= {n.op for n in f.node_def}
    used -= {f.signature.name for f in mg.graph_def.library.function}
    ops = mg.meta_info_def.stripped_op_list
    have = {o.name: o for o in ops.op if o.name in used}
    for name in sorted(used - set(have)):
        od = op_def_registry.get(name)
        if od is not None:
            have[name] = od
    del ops.op[:]
    ops.op.extend(have[k] for k in sorted(have))


# --------------------------------------------------------------------------
# The builders
# --------------------------------------------------------------------------

# Per thread: inside an Estimator export wrapper (several ranks).
_EXPORTING = threading.local()


_orig_tag_and_add = builder_impl._SavedModelBuilder._tag_and_add_meta_graph  # pylint: disable=protected-access
_orig_add_v1 = builder_impl.SavedModelBuilder.add_meta_graph_and_variables
_orig_add_v2 = builder_impl._SavedModelBuilder.add_meta_graph_and_variables  # pylint: disable=protected-access
_orig_meta_v1 = builder_impl.SavedModelBuilder.add_meta_graph
_orig_meta_v2 = builder_impl._SavedModelBuilder.add_meta_graph  # pylint: disable=protected-access


def _tag_and_add(self, meta_graph_def, tags, signature_def_map):
    if any(_is_dynemb(n.op) for n in meta_graph_def.graph_def.node):
        if signature_def_map:  # signatures are added to the meta graph below
            for k, v in signature_def_map.items():
                meta_graph_def.signature_def[k].CopyFrom(v)
        export_dir = self._export_dir  # pylint: disable=protected-access
        if not hasattr(self, "_dynemb_tables"):
            self._dynemb_tables = {}  # (the tables written for this SavedModel)
        rewrite_meta_graph(meta_graph_def, export_dir.decode()
                           if isinstance(export_dir, bytes) else str(export_dir),
                           self._dynemb_tables)
    return _orig_tag_and_add(self, meta_graph_def, tags, signature_def_map)


# graph -> ((variables, saveables), the saver made for them): a training
# graph that exports every N steps gets one saver, not one per export.
_SAVERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _serving_saver(graph: tf.Graph, saver: Any) -> Any:
    """The builder's saver without the tables' checkpoint markers (their
    rows are in the assets, and a marker's save runs Python): the given
    saver's variables, or the builder's default ones."""
    ours = [s for s in graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
            if isinstance(s, TABLE_SAVEABLES)]
    if not ours or graph.finalized:
        return saver
    if saver is None:
        key = (len(graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)),
               len(graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)))
        cached = _SAVERS.get(graph)
        if cached is not None and cached[0] == key:
            return cached[1]
    var_list = getattr(saver, "_var_list", None) if saver is not None else None
    if var_list is None:
        var_list = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) + \
            graph.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS)
    if isinstance(var_list, dict):
        var_list = {k: v for k, v in var_list.items() if not isinstance(v, TABLE_SAVEABLES)}
    else:
        var_list = [v for v in var_list if not isinstance(v, TABLE_SAVEABLES)]
    with graph.as_default():
        out = tf.compat.v1.train.Saver(
            var_list=var_list, sharded=True, allow_empty=True,
            write_version=tf.compat.v1.train.SaverDef.V2)
    if saver is None:
        _SAVERS[graph] = (key, out)
    return out


def _add(orig: Any, self: Any, sess: Any, tags: Any, *args: Any, **kwargs: Any) -> Any:
    bound = inspect.signature(orig).bind(self, sess, tags, *args, **kwargs)
    bound.arguments["saver"] = _serving_saver(sess.graph, bound.arguments.get("saver"))
    with tables_not_saved():  # (the tables go into the assets)
        return orig(*bound.args, **bound.kwargs)


def _add_meta(orig: Any, self: Any, tags: Any, *args: Any, **kwargs: Any) -> Any:
    """add_meta_graph (an Estimator's second and later modes): its saver
    leaves the tables' markers out too."""
    bound = inspect.signature(orig).bind(self, tags, *args, **kwargs)
    bound.arguments["saver"] = _serving_saver(tf.compat.v1.get_default_graph(),
                                              bound.arguments.get("saver"))
    return orig(*bound.args, **bound.kwargs)


def _meta_v1(self, tags, *args, **kwargs):
    return _add_meta(_orig_meta_v1, self, tags, *args, **kwargs)


def _meta_v2(self, tags, *args, **kwargs):
    return _add_meta(_orig_meta_v2, self, tags, *args, **kwargs)


def _add_v1(self, sess, tags, *args, **kwargs):
    return _add(_orig_add_v1, self, sess, tags, *args, **kwargs)


def _add_v2(self, sess, tags, *args, **kwargs):
    return _add(_orig_add_v2, self, sess, tags, *args, **kwargs)


def _estimator_export(orig: Any) -> Any:
    """Estimator.export_saved_model on several ranks: every rank calls it
    (each restores its part of the tables and sends its rows to rank 0),
    rank 0 writes the one model; every rank returns its path."""
    def export(self, export_dir_base, *args, **kwargs):
        if _state.get_rank_size() == 1 or getattr(_EXPORTING, "estimator", False):
            return orig(self, export_dir_base, *args, **kwargs)
        import tempfile
        rank0 = _state.get_rank_id() == 0
        base = export_dir_base if rank0 else tempfile.mkdtemp(prefix="dynemb-export-rank-")
        _EXPORTING.estimator = True  # (one wrapper per call, whatever calls it)
        try:
            out = orig(self, base, *args, **kwargs)
        finally:
            _EXPORTING.estimator = False
            if not rank0:
                shutil.rmtree(base, ignore_errors=True)
        paths = _state._world().allgather(  # pylint: disable=protected-access
            _state.EXPORT_CHANNEL, out if rank0 else b"")
        return paths[0]
    export.__doc__ = orig.__doc__
    export._dynemb = True  # pylint: disable=protected-access
    return export


def patch_builders() -> None:
    """Installs the rewrite in TensorFlow's SavedModel builders (idempotent;
    a graph without dynemb ops is exported unchanged), and Estimator's
    export on several ranks."""
    builder_impl._SavedModelBuilder._tag_and_add_meta_graph = _tag_and_add  # pylint: disable=protected-access
    builder_impl.SavedModelBuilder.add_meta_graph_and_variables = _add_v1
    builder_impl._SavedModelBuilder.add_meta_graph_and_variables = _add_v2  # pylint: disable=protected-access
    builder_impl.SavedModelBuilder.add_meta_graph = _meta_v1
    builder_impl._SavedModelBuilder.add_meta_graph = _meta_v2  # pylint: disable=protected-access
    try:  # the base class of tf.estimator.Estimator and tf.compat.v1's
        from tensorflow_estimator.python.estimator import estimator as est_mod
    except ImportError:  # (TensorFlow >= 2.16 has no Estimator)
        return
    for cls in {est_mod.Estimator, getattr(est_mod, "EstimatorV2", est_mod.Estimator)}:
        for meth in ("export_saved_model", "experimental_export_all_saved_models",
                     "export_savedmodel"):
            fn = cls.__dict__.get(meth)
            if fn is not None and not getattr(fn, "_dynemb", False):
                setattr(cls, meth, _estimator_export(fn))


_TABLE_INITS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _tables_initializer(graph: tf.Graph) -> tf.Operation:
    """The graph's tables' initializer, made once per set of tables."""
    n = len(graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS))
    cached = _TABLE_INITS.get(graph)
    if cached is None or cached[0] != n:
        with graph.as_default():
            cached = (n, tf.compat.v1.tables_initializer())
        _TABLE_INITS[graph] = cached
    return cached[1]


def export_saved_model(sess: Any, export_dir: str, inputs: dict, outputs: dict,
                       tags: Optional[list] = None,
                       signature_name: str = "serving_default") -> str:
    """Writes a SavedModel of `sess`'s graph that stock TensorFlow serves (no
    dynemb needed to load or run it): one prediction signature from `inputs`
    and `outputs` (name -> tensor), tagged `tags` (default: serve), whose
    lookups read the tables as they are now. Returns `export_dir`, which must
    not exist yet. On several ranks every rank calls it: rank 0 writes the
    one model, with every rank's rows."""
    if not isinstance(inputs, dict) or not isinstance(outputs, dict) or not outputs:
        raise TypeError("dynemb.export_saved_model: inputs and outputs must be dicts of "
                        "name -> tensor (outputs not empty)")
    several = _state.get_rank_size() > 1
    if several:  # every rank must know, and agree
        exists = [x == b"1" for x in _state._world().allgather(  # pylint: disable=protected-access
            _state.EXPORT_CHANNEL, b"1" if os.path.exists(export_dir) else b"0")]
        exists = exists[0]
    else:
        exists = os.path.exists(export_dir)
    if exists:
        raise ValueError("dynemb.export_saved_model: '%s' exists; pass a new directory "
                         "(nothing was written)" % export_dir)
    target = export_dir
    if several and _state.get_rank_id() != 0:
        # (this rank sends its rows to rank 0, which writes the one model)
        import tempfile
        target = os.path.join(tempfile.mkdtemp(prefix="dynemb-export-rank-"), "model")
    sig = tf.compat.v1.saved_model.signature_def_utils.predict_signature_def(inputs, outputs)
    if hasattr(sess, "_tf_sess"):  # a MonitoredSession: its hooks must not run
        sess = sess._tf_sess()  # pylint: disable=protected-access
    graph = sess.graph
    # The builder adds its saver's ops (a MonitoredSession finalizes the graph).
    finalized = graph.finalized
    if finalized:
        graph._unsafe_unfinalize()  # pylint: disable=protected-access
    # Written next to its place and renamed: a failed export leaves nothing.
    tmp = "%s.tmp-%d" % (os.path.normpath(target), os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    # The builder records its main op and assets in the graph, and refuses a
    # graph that has a main op: a training graph exports again and again.
    kept = {k: graph.get_collection(k) for k in _INIT_COLLECTIONS + (_ASSET_COLLECTION,)}
    for k in kept:
        graph.clear_collection(k)
    try:
        builder = tf.compat.v1.saved_model.Builder(tmp)
        with graph.as_default():
            builder.add_meta_graph_and_variables(
                sess, tags or [tf.compat.v1.saved_model.tag_constants.SERVING],
                signature_def_map={signature_name: sig},
                assets_collection=graph.get_collection(
                    tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
                main_op=_tables_initializer(graph))
        builder.save()
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if target != export_dir:
            shutil.rmtree(os.path.dirname(target), ignore_errors=True)
        for k, v in kept.items():
            graph.clear_collection(k)
            for x in v:
                graph.add_to_collection(k, x)
        if finalized:
            graph.finalize()
    if target == export_dir:
        logger.info("dynemb export: SavedModel written to %s", export_dir)
    return export_dir
