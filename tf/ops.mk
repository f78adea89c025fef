# tf/ops.mk -- builds the TensorFlow op library build/tf/_dynemb_ops.so and
# (target sharded-ops, where MPI is) build/tf/_dynemb_sharded_ops.so.
#
# Called by the top-level Makefile (`make ops`) as
#   $(MAKE) -f tf/ops.mk PYTHON=.venv/bin/python
# and by setup.py (pip install). The glue is C11 compiled with gcc against
# the headers of the installed TensorFlow wheel (tf.sysconfig.get_include());
# tf.sysconfig.get_compile_flags() is NOT used: it carries C++-only flags.
# The engine archive build/libdynemb.a is linked in whole; its public
# dynemb_* functions stay exported so Python can call them through ctypes on
# the same loaded library. --no-undefined turns a missing TF export into a
# build error instead of a load error. -lz comes before the TensorFlow
# library: libtensorflow_framework.so.2 exports its own bundled zlib's crc32,
# and with gcc's default --as-needed the op library would otherwise depend on
# that private export instead of on libz.so.1.
#
# One binary serves several TensorFlow versions (docs/tensorflow-versions.md):
# $(OUT).tf-version records the TensorFlow whose headers it was built with.

PYTHON  ?= python3
CC      ?= cc
OUT     ?= build/tf/_dynemb_ops.so

# One TensorFlow import (a few seconds) for include dir, library dir, version.
TF_INFO := $(shell $(PYTHON) -c 'import os; os.environ["TF_CPP_MIN_LOG_LEVEL"]="3"; import tensorflow as tf; print(tf.sysconfig.get_include(), tf.sysconfig.get_lib(), tf.__version__)' 2>/dev/null)
TF_INC  := $(word 1,$(TF_INFO))
TF_LIB  := $(word 2,$(TF_INFO))
TF_VER  := $(word 3,$(TF_INFO))

# EXTRA_CFLAGS, EXTRA_SRC, EXTRA_LDFLAGS: more flags and C files for a variant of the
# library, e.g. the analysis build of `make bench-tf` (the Makefile's
# ENGINE_LEFT_OUT_LIB: stand-ins for engine calls, linked with -Wl,--wrap).
OPS_CFLAGS := -std=c11 -D_GNU_SOURCE -O2 -g -fPIC -fvisibility=hidden -pthread \
              -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
              -Iinclude -isystem $(TF_INC) $(EXTRA_CFLAGS)
# The soname lets the library of several ranks (below), which depends on this
# one, bind to the copy Python loaded, wherever it was loaded from: one
# process has one table registry.
OPS_LDFLAGS := -shared -L$(TF_LIB) -Wl,--no-undefined -Wl,-soname,_dynemb_ops.so

$(OUT): tf/dynemb_ops.c tf/kernel_util.h $(EXTRA_SRC) tf/ops.mk include/dynemb.h build/libdynemb.a
	@if [ -z "$(TF_INC)" ]; then echo "tf/ops.mk: TensorFlow is not importable with $(PYTHON)" >&2; exit 1; fi
	@mkdir -p $(@D)
	$(CC) $(OPS_CFLAGS) tf/dynemb_ops.c $(EXTRA_SRC) -o $@ $(OPS_LDFLAGS) $(EXTRA_LDFLAGS) \
	  -Wl,--whole-archive build/libdynemb.a -Wl,--no-whole-archive \
	  -lz -lm -l:libtensorflow_framework.so.2 -pthread
	@echo "$(TF_VER)" > $@.tf-version

# The op library of several ranks (tf/sharded_ops.c): the shard room
# (SHARD, linked in) on the engine's ops from $(OUT) and the exchange from
# libdynemb_comm.so (COMM; both built by the top-level Makefile's `comm`),
# found next to it when installed ($$ORIGIN) and in build/ of a source
# checkout ($$ORIGIN/..).
SHARDED_OUT ?= $(dir $(OUT))_dynemb_sharded_ops.so
COMM        ?= build/libdynemb_comm.so
SHARD       ?= build/libdynemb_shard.a
$(SHARDED_OUT): tf/sharded_ops.c tf/kernel_util.h comm/dynemb_comm.h comm/shard.h tf/ops.mk $(OUT) $(COMM) $(SHARD)
	@if [ -z "$(TF_INC)" ]; then echo "tf/ops.mk: TensorFlow is not importable with $(PYTHON)" >&2; exit 1; fi
	$(CC) $(OPS_CFLAGS) -Icomm tf/sharded_ops.c $(SHARD) -o $@ -shared -L$(TF_LIB) -Wl,--no-undefined \
	  -L$(dir $(OUT)) -l:_dynemb_ops.so -L$(dir $(COMM)) -l:$(notdir $(COMM)) \
	  -l:libtensorflow_framework.so.2 -pthread -Wl,-rpath,'$$ORIGIN:$$ORIGIN/..'

.PHONY: ops sharded-ops
ops: $(OUT)
sharded-ops: $(SHARDED_OUT)
