"""Build hook for `pip install .`: compiles the engine and the TensorFlow op
library with make (C11, gcc) and ships build/tf/_dynemb_ops.so inside the
`dynemb` package, with build/libdynemb_comm.so (the exchange between worker
processes) and build/tf/_dynemb_sharded_ops.so (the ops of several ranks)
where Open MPI's mpicc is. Metadata lives in pyproject.toml.

The op library is compiled against the TensorFlow importable by the
interpreter running the build, so install with --no-build-isolation into an
environment that already has the pinned tensorflow-cpu (the Makefile does).
The library built against 2.15.1 also loads unchanged in TensorFlow 2.19-2.21
(it uses only the C kernel/op API; docs/tensorflow-versions.md).
Editable installs (`pip install -e .`) load the library from build/tf/ of
the source tree instead (see python/dynemb/_lib.py).
"""
import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join("build", "tf", "_dynemb_ops.so")
COMM_LIB = os.path.join("build", "libdynemb_comm.so")
SHARDED_LIB = os.path.join("build", "tf", "_dynemb_sharded_ops.so")


def build_native() -> None:
    make = os.environ.get("MAKE", "make")
    subprocess.check_call([make, "-C", ROOT, "build/libdynemb.a"])
    subprocess.check_call([make, "-C", ROOT, "-f", "tf/ops.mk", "PYTHON=" + sys.executable])
    # The exchange between worker processes and the shard room on it, where Open MPI's compiler is
    # (one worker needs neither it nor MPI).
    if shutil.which(os.environ.get("MPICC", "mpicc")):
        subprocess.check_call([make, "-C", ROOT, "comm"])
        subprocess.check_call([make, "-C", ROOT, "-f", "tf/ops.mk", "PYTHON=" + sys.executable,
                               "sharded-ops"])


class BuildPyWithOps(build_py):
    def run(self):
        build_native()
        super().run()
        if not getattr(self, "editable_mode", False):
            dest = os.path.join(self.build_lib, "dynemb")
            os.makedirs(dest, exist_ok=True)
            shutil.copy2(os.path.join(ROOT, LIB), os.path.join(dest, "_dynemb_ops.so"))
            for lib in (COMM_LIB, SHARDED_LIB):
                if os.path.isfile(os.path.join(ROOT, lib)):
                    shutil.copy2(os.path.join(ROOT, lib),
                                 os.path.join(dest, os.path.basename(lib)))


class BinaryDistribution(Distribution):
    """The wheel holds a native library: tag it for the platform."""

    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithOps}, distclass=BinaryDistribution)
