# dynemb build. `make demo` and `make test` are the two entry points (README).
#
#   make            engine libraries + CLI (build/)
#   make venv       .venv with the pinned TensorFlow (first run downloads it)
#   make ops        TensorFlow op library (needs the venv)
#   make test       every test: C unit tests (ASan+UBSan), TSan stress,
#                   checkpoint fuzzing, Python/TensorFlow tests on the pinned
#                   TensorFlow 2.15.1, then the sess.run tests again on
#                   TensorFlow 2.19.1 with the SAME op library binary
#                   (`make test TF_COMPAT=0` skips that second run;
#                   docs/tensorflow-versions.md)
#   make demo       venv + build + the Criteo training demo
#   make bench      engine benchmark (JSON)

CC       ?= cc
PYTHON   ?= python3
VENV     := .venv
VPY      := $(VENV)/bin/python
TF_PIN   := tensorflow-cpu==2.15.1 tensorflow-estimator==2.15.0
PIP      := -m pip install -q --disable-pip-version-check --no-input

# Second TensorFlow for the compatibility run of `make test`: a venv with the
# locked TF 2.19.1 + tf-keras (tf/requirements-tf219.txt), in which the op
# library built against 2.15.1 is loaded unchanged. CI runs it (TF_COMPAT=1).
TF_COMPAT   ?= 1
COMPAT_VENV := .venv-tf219
COMPAT_LOCK := tf/requirements-tf219.txt

WARN     := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
BASEFLAGS:= -std=c11 -D_GNU_SOURCE -Iinclude -Isrc -fPIC -fvisibility=hidden -pthread $(WARN)
CFLAGS   ?= -O2 -g -fno-math-errno -fvect-cost-model=dynamic
LDLIBS   := -lz -lm -pthread

ENGINE_SRC := $(wildcard src/*.c)
TOOL_SRC   := $(wildcard tools/*.c)
TEST_SRC   := $(wildcard tests/c/test_*.c)
TSAN_SRC   := $(wildcard tests/c/tsan_*.c)
PLAIN_SRC  := $(wildcard tests/c/plain_*.c)

# --- release build ---------------------------------------------------------
REL_OBJ  := $(ENGINE_SRC:src/%.c=build/obj/%.o)

all: build/libdynemb.a build/libdynemb.so build/dynemb build/probe_limit build/step_costs

build/obj/%.o: src/%.c include/dynemb.h $(wildcard src/*.h)
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(CFLAGS) -c $< -o $@

build/libdynemb.a: $(REL_OBJ)
	@rm -f $@
	ar rcs $@ $^

build/libdynemb.so: $(REL_OBJ)
	$(CC) -shared -o $@ $^ $(LDLIBS) -Wl,--no-undefined

build/dynemb: $(TOOL_SRC) build/libdynemb.a
	$(CC) $(BASEFLAGS) $(CFLAGS) -Itools $(TOOL_SRC) build/libdynemb.a -o $@ $(LDLIBS)

# --- sanitizer builds for tests ---------------------------------------------
ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TSAN_FLAGS := -O1 -g -fsanitize=thread

build/asan/test_%: tests/c/test_%.c $(ENGINE_SRC) tests/c/check.h include/dynemb.h $(wildcard src/*.h)
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(ASAN_FLAGS) -Itests/c $< $(ENGINE_SRC) -o $@ $(LDLIBS)

build/tsan/tsan_%: tests/c/tsan_%.c $(ENGINE_SRC) tests/c/check.h include/dynemb.h $(wildcard src/*.h)
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(TSAN_FLAGS) -Itests/c $< $(ENGINE_SRC) -o $@ $(LDLIBS)

# Tests of what sanitizer builds do not run (real huge-page slabs and their
# prefault thread across fork): the release flags, no sanitizer.
build/plain/plain_%: tests/c/plain_%.c $(ENGINE_SRC) tests/c/check.h include/dynemb.h $(wildcard src/*.h)
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(CFLAGS) -Itests/c $< $(ENGINE_SRC) -o $@ $(LDLIBS)

# libFuzzer needs clang; the fuzz target is skipped where clang is missing.
build/fuzz/fuzz_ckpt: tests/fuzz/fuzz_ckpt.c $(ENGINE_SRC) include/dynemb.h $(wildcard src/*.h)
	@mkdir -p $(@D)
	clang $(BASEFLAGS) -Wno-unused-command-line-argument -O1 -g -fsanitize=fuzzer,address,undefined $< $(ENGINE_SRC) -o $@ $(LDLIBS)

C_TESTS    := $(TEST_SRC:tests/c/%.c=build/asan/%)
TSAN_TESTS := $(TSAN_SRC:tests/c/%.c=build/tsan/%)
PLAIN_TESTS := $(PLAIN_SRC:tests/c/%.c=build/plain/%)

c-tests: $(C_TESTS) $(TSAN_TESTS) $(PLAIN_TESTS)

# --- Python / TensorFlow ------------------------------------------------------
# setuptools>=64 and wheel: the editable install below runs without build
# isolation, so the build backend pyproject.toml names must be in the venv.
$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) $(PIP) --upgrade pip
	$(VPY) $(PIP) $(TF_PIN) pytest numpy "setuptools>=64" wheel
	@touch $@

venv: $(VENV)/.stamp

# The lock lists every package: --no-deps installs exactly it (see the file).
$(COMPAT_VENV)/.stamp: $(COMPAT_LOCK)
	rm -rf $(COMPAT_VENV)
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python $(PIP) --no-deps -r $(COMPAT_LOCK)
	@touch $@

compat-venv: $(COMPAT_VENV)/.stamp

ops: venv build/libdynemb.a
	$(MAKE) --no-print-directory -f tf/ops.mk PYTHON=$(VPY)

# An analysis build of the op library for bench/tf_train.py's dynemb_hollow
# variant: the same kernels with every engine call left out (never install it).
ops-hollow: venv build/libdynemb.a
	$(MAKE) --no-print-directory -f tf/ops.mk PYTHON=$(VPY) \
	  OUT=build/tf-hollow/_dynemb_ops.so EXTRA_CFLAGS=-DDYNEMB_OPS_HOLLOW

install-py: venv
	$(VPY) $(PIP) --no-build-isolation -e .

# --- entry points ---------------------------------------------------------------
# The op library is built once, against .venv's TensorFlow 2.15.1 headers;
# tests/run_all.sh loads that same file under both TensorFlow versions.
test: all c-tests
	@if command -v clang >/dev/null 2>&1; then $(MAKE) --no-print-directory build/fuzz/fuzz_ckpt; fi
	@$(MAKE) --no-print-directory install-py
	@$(MAKE) --no-print-directory ops ops-hollow
	@if [ "$(TF_COMPAT)" != 0 ]; then $(MAKE) --no-print-directory compat-venv; fi
	@TF_COMPAT=$(TF_COMPAT) TF_COMPAT_VENV=$(COMPAT_VENV) bash tests/run_all.sh

demo: all install-py
	$(VPY) examples/criteo_demo.py

demo-estimator: all install-py
	$(VPY) examples/criteo_estimator.py

bench: all
	./build/dynemb bench --rows 4000000 --dim 64 --batch 65536 --dist uniform --threads 2 --json
	./build/dynemb bench --rows 4000000 --dim 64 --batch 65536 --dist zipf:1.05 --threads 2 --json

# What any hash index could reach against the gather (BENCHMARKS.md, session 6).
build/probe_limit: bench/probe_limit.c
	@mkdir -p build
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -pthread $< -o $@

probe-limit: build/probe_limit
	./build/probe_limit 2

# The engine's part of a training step of bench/tf_train.py, per phase (C only).
build/step_costs: bench/step_costs.c build/libdynemb.a
	$(CC) $(BASEFLAGS) $(CFLAGS) $< build/libdynemb.a -o $@ $(LDLIBS)

bench-step: all install-py
	$(VPY) bench/tf_op_costs.py --dump-ids build/step_ids.bin
	./build/step_costs build/step_ids.bin

# The SSD tier (docs/ssd-tier.md): 1M rows, 200,000 in memory, the rest in a
# file under SSD_DIR (default build/ssd-bench; point it at the disk to measure).
SSD_DIR ?= build/ssd-bench
bench-ssd: all
	mkdir -p $(SSD_DIR)
	./build/dynemb bench --rows 1000000 --dim 64 --batch 4096 --dist uniform --threads 2 --skip-stall --host-rows 200000 --ssd-dir $(SSD_DIR) --ssd-cold --json
	./build/dynemb bench --rows 1000000 --dim 64 --batch 4096 --dist zipf:1.05 --threads 2 --skip-stall --host-rows 200000 --ssd-dir $(SSD_DIR) --ssd-cold --json

clean:
	rm -rf build

.PHONY: demo-estimator all c-tests venv compat-venv ops install-py test demo bench bench-ssd probe-limit bench-step ops-hollow clean

# --- TensorFlow training benchmark (bench/tf_train.py) -------------------------
# TFRA needs its own TensorFlow, so it gets its own virtualenv; where pip cannot
# install it, the benchmark reports tfra as null with the reason.
TFRA_VENV := .venv-tfra
TFRA_PIN  := tensorflow==2.16.2 tf-keras==2.16.0 tensorflow-recommenders-addons==0.8.1

$(TFRA_VENV)/.stamp:
	@($(PYTHON) -m venv $(TFRA_VENV) && $(TFRA_VENV)/bin/pip install -q --upgrade pip && \
	  $(TFRA_VENV)/bin/pip install -q $(TFRA_PIN) numpy && touch $@) || \
	  echo "bench-tf: could not install $(TFRA_PIN) into $(TFRA_VENV)" >&2

bench-tf: all install-py ops-hollow
	@$(MAKE) --no-print-directory $(TFRA_VENV)/.stamp
	$(VPY) bench/tf_train.py --json

.PHONY: bench-tf
