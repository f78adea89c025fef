"""Checkpoint directories on TensorFlow's file systems (hdfs://, s3://, gs://,
ram://, ...), through a local staging copy.

The engine writes and reads its checkpoints with the C library's own file
calls, which reach local paths only; a Saver (or Estimator) writing to
``hdfs://.../model`` would otherwise put the tables into a local directory
named ``hdfs:``. Here a remote directory is written by staging the engine's
checkpoint in a local temporary directory and copying it up with
``tf.io.gfile`` (the same file systems the Saver's own files use), and read by
copying it down first. The staging directory is under ``$DYNEMB_STAGING_DIR``
when set (room for one checkpoint of this process's tables), else the
system's temporary directory.

Crash safety on the remote side: each engine checkpoint's ``MANIFEST`` (which
names and checksums its files) is copied last, so a directory cut short by a
crash has no manifest, or one whose files are all there, and a restore
verifies them. The Saver writes its own index after the tables, so a listed
checkpoint has them. Warm start reads a local mirror made once per process.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import tempfile
from typing import Iterator

import tensorflow as tf

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
MANIFEST = "MANIFEST"


def is_remote(path: str) -> bool:
    """Whether `path` names a TensorFlow file system other than the local
    one (``file://`` paths are local: local_path)."""
    return bool(_SCHEME.match(str(path))) and not str(path).startswith("file://")


def local_path(path: str) -> str:
    """`path` without a ``file://`` scheme (the engine opens plain paths)."""
    path = str(path)
    return path[len("file://"):] if path.startswith("file://") else path


def split(path: str) -> tuple:
    """(directory, base name) of a remote path, keeping its ``scheme://``
    (os.path.normpath would fold it into ``scheme:/``)."""
    d, _, base = str(path).rstrip("/").rpartition("/")
    return d, base


def _staging() -> str:
    return tempfile.mkdtemp(prefix="dynemb-stage-", dir=os.environ.get("DYNEMB_STAGING_DIR"))


def download(remote: str, local: str) -> bool:
    """Copies directory tree `remote` into `local` (made if missing); False
    if `remote` does not exist."""
    if not tf.io.gfile.isdir(remote):
        return False
    base = remote.rstrip("/")
    for root, _, files in tf.io.gfile.walk(base):
        rel = root.rstrip("/")[len(base):].lstrip("/")
        os.makedirs(os.path.join(local, rel), exist_ok=True)
        for name in files:
            tf.io.gfile.copy(root.rstrip("/") + "/" + name, os.path.join(local, rel, name),
                             overwrite=True)
    return True


def upload(local: str, remote: str) -> None:
    """Makes directory tree `remote` hold what `local` holds: the files
    copied, every MANIFEST last (each through a temporary name and a rename,
    so a crash never leaves a truncated one in place of a good one), then
    the files `remote` had that `local` no longer has removed (the engine
    deletes the files of tables an earlier save wrote and this one
    replaced; `local` started as a copy of `remote`)."""
    last, wanted = [], {}
    for root, _, files in os.walk(local):
        rel = os.path.relpath(root, local)
        target = remote.rstrip("/") + ("" if rel == "." else "/" + rel.replace(os.sep, "/"))
        tf.io.gfile.makedirs(target)
        wanted[target] = set(files)
        for name in sorted(files):
            pair = (os.path.join(root, name), target + "/" + name)
            if name == MANIFEST:
                last.append(pair)
            else:
                tf.io.gfile.copy(*pair, overwrite=True)
    for src, dst in last:
        tf.io.gfile.copy(src, dst + ".tmp", overwrite=True)
        tf.io.gfile.rename(dst + ".tmp", dst, overwrite=True)
    for target, names in wanted.items():
        for name in tf.io.gfile.listdir(target):
            if not name.endswith("/") and name not in names and \
                    not tf.io.gfile.isdir(target + "/" + name):
                tf.io.gfile.remove(target + "/" + name)


@contextlib.contextmanager
def writable(remote: str) -> Iterator[str]:
    """A local directory holding what `remote` holds, copied up to `remote`
    when the block succeeds (nothing is copied if it raises)."""
    with readable(remote) as local:
        os.makedirs(local, exist_ok=True)
        yield local
        upload(local, remote)


@contextlib.contextmanager
def readable(remote: str) -> Iterator[str]:
    """A local copy of directory `remote` for the block (a path that does
    not exist when `remote` does not)."""
    stage = _staging()
    try:
        local = os.path.join(stage, "ckpt")
        download(remote, local)
        yield local
    finally:
        shutil.rmtree(stage, ignore_errors=True)


_MIRRORS: dict = {}


def mirror(remote_dir: str) -> str:
    """A local copy of directory `remote_dir` that lasts until the process
    exits (warm start builds load ops that read it when they run), made
    once per version of the directory (its listing); a path that does not
    exist if `remote_dir` does not."""
    try:
        version = tuple(sorted(tf.io.gfile.listdir(remote_dir)))
    except tf.errors.OpError:
        version = ()
    key = (remote_dir, version)
    if key not in _MIRRORS:
        stage = _staging()
        atexit.register(shutil.rmtree, stage, True)
        local = os.path.join(stage, "ckpt")
        download(remote_dir, local)
        _MIRRORS[key] = local
    return _MIRRORS[key]
