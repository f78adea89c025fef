# tf/ops.mk -- builds the TensorFlow op library build/tf/_dynemb_ops.so.
#
# Called by the top-level Makefile (`make ops`) as
#   $(MAKE) -f tf/ops.mk PYTHON=.venv/bin/python
# and by setup.py (pip install). The glue is C11 compiled with gcc against
# the headers of the installed TensorFlow wheel (tf.sysconfig.get_include());
# tf.sysconfig.get_compile_flags() is NOT used: it carries C++-only flags.
# The engine archive build/libdynemb.a is linked in whole; its public
# dynemb_* functions stay exported so Python can call them through ctypes on
# the same loaded library. --no-undefined turns a missing TF export into a
# build error instead of a load error.

PYTHON  ?= python3
CC      ?= cc
OUT     ?= build/tf/_dynemb_ops.so

TF_INC  := $(shell $(PYTHON) -c 'import os; os.environ["TF_CPP_MIN_LOG_LEVEL"]="3"; import tensorflow as tf; print(tf.sysconfig.get_include())' 2>/dev/null)
TF_LIB  := $(shell $(PYTHON) -c 'import os; os.environ["TF_CPP_MIN_LOG_LEVEL"]="3"; import tensorflow as tf; print(tf.sysconfig.get_lib())' 2>/dev/null)

OPS_CFLAGS := -std=c11 -D_GNU_SOURCE -O2 -g -fPIC -fvisibility=hidden -pthread \
              -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes \
              -Iinclude -isystem $(TF_INC)
OPS_LDFLAGS := -shared -L$(TF_LIB) -Wl,--no-undefined

$(OUT): tf/dynemb_ops.c include/dynemb.h build/libdynemb.a
	@if [ -z "$(TF_INC)" ]; then echo "tf/ops.mk: TensorFlow is not importable with $(PYTHON)" >&2; exit 1; fi
	@mkdir -p $(@D)
	$(CC) $(OPS_CFLAGS) tf/dynemb_ops.c -o $@ $(OPS_LDFLAGS) \
	  -Wl,--whole-archive build/libdynemb.a -Wl,--no-whole-archive \
	  -l:libtensorflow_framework.so.2 -lz -lm -pthread

.PHONY: ops
ops: $(OUT)
