# dynemb build. `make demo` and `make test` are the two entry points (README).
#
#   make            the product: engine libraries (build/libdynemb.a, the shared
#                   build/libdynemb.so.X.Y.Z) and the dynemb CLI (build/dynemb)
#   make install    header, libraries, CLI and pkg-config file under
#                   $(DESTDIR)$(PREFIX) (PREFIX=/usr/local); `make uninstall`
#   make comm       build/libdynemb_comm.so: the exchange between worker
#                   processes (needs mpicc; Debian: openmpi-bin libopenmpi-dev),
#                   and build/libdynemb_shard.a: the shard room on it
#   make check      the C tests: unit tests (ASan+UBSan), TSan stress, plain
#                   tests, checkpoint fuzzing (where clang is), the exchange
#                   between processes under mpirun (where mpicc is), the install test;
#                   `make check T=test_table [F=test_admission]` runs one
#                   program [one test function of it]
#   make venv       .venv with the pinned TensorFlow (first run downloads it)
#   make ops        TensorFlow op library (needs the venv)
#   make test       `make check` + the Python/TensorFlow tests on the pinned
#                   TensorFlow 2.15.1, then the sess.run tests again on
#                   TensorFlow 2.19.1 with the SAME op library binary
#                   (`make test TF_COMPAT=0` skips that second run;
#                   docs/tensorflow-versions.md)
#   make demo       venv + build + the Criteo training demo (RANKS=2: on
#                   two ranks under mpirun)
#   make bench      engine benchmark (JSON); bench-ssd, bench-step, bench-tf,
#                   bench-ranks, bench-serving, bench-incremental and probe-limit: the other
#                   benchmarks, each building what
#                   it needs (BENCHMARKS.md); `make all` builds none of them

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
# -MMD -MP: the header lists (see UNLESS_DEPS below). PUBFLAGS is for code
# that uses the engine through its public header only (the CLI); the
# engine and its white-box tests also see src/.
PUBFLAGS := -std=c11 -D_GNU_SOURCE -Iinclude -fPIC -fvisibility=hidden -pthread $(WARN) -MMD -MP
BASEFLAGS:= $(PUBFLAGS) -Isrc
CFLAGS   ?= -O2 -g -fno-math-errno -fvect-cost-model=dynamic
LDLIBS   := -lz -lm -pthread

ENGINE_SRC := $(wildcard src/*.c)
TOOL_SRC   := $(wildcard tools/*.c)
TEST_SRC   := $(wildcard tests/c/test_*.c)
TSAN_SRC   := $(wildcard tests/c/tsan_*.c)
PLAIN_SRC  := $(wildcard tests/c/plain_*.c)

# The library version is the header's (DYNEMB_VERSION_*); the shared
# library's SONAME carries the major number.
version_part = $(shell sed -n 's/^\#define DYNEMB_VERSION_$(1) *\([0-9][0-9]*\).*/\1/p' include/dynemb.h)
VERSION_MAJOR := $(call version_part,MAJOR)
VERSION  := $(VERSION_MAJOR).$(call version_part,MINOR).$(call version_part,PATCH)
SONAME   := libdynemb.so.$(VERSION_MAJOR)
SHLIB    := build/libdynemb.so.$(VERSION)

# Header lists: every object and test program also writes the headers it
# read (-MMD, build/**/*.d, included below). A target whose list is missing
# (first build, or a tree built before the lists existed) is rebuilt.
.SECONDEXPANSION:
UNLESS_DEPS = $$(if $$(wildcard $$(basename $$@).d),,FORCE)
FORCE:

# --- the product: libraries and CLI -----------------------------------------
REL_OBJ  := $(ENGINE_SRC:src/%.c=build/obj/%.o)
TOOL_OBJ := $(TOOL_SRC:tools/%.c=build/tools/%.o)

all: build/libdynemb.a build/libdynemb.so build/dynemb

build/obj/%.o: src/%.c $(UNLESS_DEPS)
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(CFLAGS) -c $< -o $@

$(SHLIB): $(REL_OBJ)
	$(CC) -shared -Wl,-soname,$(SONAME) -o $@ $^ $(LDLIBS) -Wl,--no-undefined

# The links of a shared library install: libdynemb.so (what -ldynemb finds)
# -> libdynemb.so.0 (what programs load) -> libdynemb.so.X.Y.Z (the file).
build/libdynemb.so: $(SHLIB)
	ln -sf $(notdir $(SHLIB)) build/$(SONAME)
	ln -sf $(SONAME) $@

build/tools/%.o: tools/%.c $(UNLESS_DEPS)
	@mkdir -p $(@D)
	$(CC) $(PUBFLAGS) $(CFLAGS) -Itools -c $< -o $@

# The benchmark's Adam limit runs the engine's own row math (src/optim.h),
# so it differs from the engine's apply only in memory layout and index.
build/tools/bench.o: tools/bench.c $(UNLESS_DEPS)
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(CFLAGS) -Itools -c $< -o $@

build/dynemb: $(TOOL_OBJ) build/libdynemb.a
	$(CC) $(TOOL_OBJ) build/libdynemb.a -o $@ $(LDLIBS)

# --- install ------------------------------------------------------------------
PREFIX     ?= /usr/local
BINDIR     := $(PREFIX)/bin
LIBDIR     := $(PREFIX)/lib
INCLUDEDIR := $(PREFIX)/include
PCDIR      := $(LIBDIR)/pkgconfig
# Every installed file (uninstall removes exactly these).
INSTALLED  := $(INCLUDEDIR)/dynemb.h $(LIBDIR)/libdynemb.a $(LIBDIR)/$(notdir $(SHLIB)) \
              $(LIBDIR)/$(SONAME) $(LIBDIR)/libdynemb.so $(BINDIR)/dynemb $(PCDIR)/dynemb.pc

install: all
	install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(BINDIR) $(DESTDIR)$(PCDIR)
	install -m 644 include/dynemb.h $(DESTDIR)$(INCLUDEDIR)/
	install -m 644 build/libdynemb.a $(DESTDIR)$(LIBDIR)/
	install -m 755 $(SHLIB) $(DESTDIR)$(LIBDIR)/
	ln -sf $(notdir $(SHLIB)) $(DESTDIR)$(LIBDIR)/$(SONAME)
	ln -sf $(SONAME) $(DESTDIR)$(LIBDIR)/libdynemb.so
	install -m 755 build/dynemb $(DESTDIR)$(BINDIR)/
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(VERSION)|' dynemb.pc.in \
	  > $(DESTDIR)$(PCDIR)/dynemb.pc

uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))

# --- C tests: the engine compiled once per flavour, into its own archive ---------
# asan: the unit tests (ASan+UBSan); tsan: the stress tests (ThreadSanitizer);
# fuzz: the libFuzzer target (clang only). The plain tests of what sanitizer
# builds do not run (real huge-page slabs and their prefault thread across
# fork) use the release flags, hence the release archive.
ASAN_FLAGS := -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer
TSAN_FLAGS := -O1 -g -fsanitize=thread
FUZZ_FLAGS := -Wno-unused-command-line-argument -O1 -g -fsanitize=address,undefined

build/asan/obj/%.o: src/%.c $(UNLESS_DEPS)
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(ASAN_FLAGS) -c $< -o $@

build/tsan/obj/%.o: src/%.c $(UNLESS_DEPS)
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(TSAN_FLAGS) -c $< -o $@

# libFuzzer's coverage instrumentation in the engine (fuzzer-no-link); the
# fuzzer's main is linked into the target only.
build/fuzz/obj/%.o: src/%.c $(UNLESS_DEPS)
	@mkdir -p $(@D)
	clang $(BASEFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

# One archive per flavour: the release one (the product) and the three above.
FLAVOURS := asan tsan fuzz
build/libdynemb.a: $(REL_OBJ)
$(foreach f,$(FLAVOURS),$(eval build/$(f)/libdynemb.a: $(ENGINE_SRC:src/%.c=build/$(f)/obj/%.o)))
build/libdynemb.a $(FLAVOURS:%=build/%/libdynemb.a):
	@rm -f $@
	ar rcs $@ $^

build/asan/test_%: tests/c/test_%.c $(UNLESS_DEPS) build/asan/libdynemb.a
	$(CC) $(BASEFLAGS) $(ASAN_FLAGS) -Itests/c $< build/asan/libdynemb.a -o $@ $(LDLIBS)

# The route of the shard room (comm/route.c) is plain C: its test runs
# under the sanitizers with the engine's.
build/asan/test_route: tests/c/test_route.c comm/route.c comm/route.h $(UNLESS_DEPS) build/asan/libdynemb.a
	$(CC) $(BASEFLAGS) $(ASAN_FLAGS) -Itests/c -Icomm $< comm/route.c build/asan/libdynemb.a -o $@ $(LDLIBS)

build/tsan/tsan_%: tests/c/tsan_%.c $(UNLESS_DEPS) build/tsan/libdynemb.a
	$(CC) $(BASEFLAGS) $(TSAN_FLAGS) -Itests/c $< build/tsan/libdynemb.a -o $@ $(LDLIBS)

build/plain/plain_%: tests/c/plain_%.c $(UNLESS_DEPS) build/libdynemb.a
	@mkdir -p $(@D)
	$(CC) $(BASEFLAGS) $(CFLAGS) -Itests/c $< build/libdynemb.a -o $@ $(LDLIBS)

build/fuzz/fuzz_ckpt: tests/fuzz/fuzz_ckpt.c $(UNLESS_DEPS) build/fuzz/libdynemb.a
	clang $(BASEFLAGS) $(FUZZ_FLAGS) -fsanitize=fuzzer $< build/fuzz/libdynemb.a -o $@ $(LDLIBS)

# The exchange between worker processes (comm/, MPI) is tested under
# mpirun where an MPI compiler is (Debian: openmpi-bin libopenmpi-dev);
# the engine itself never links MPI.
MPICC    ?= mpicc
MPI_SRC  := $(wildcard tests/mpi/mpi_*.c)
# The exchange as a shared library for the Python package (dynemb/_comm.py
# loads it under an MPI launch); libmpi comes with it, never with the engine.
COMM_LIB := build/libdynemb_comm.so
COMM_SRC := comm/exchange.c comm/status.c
COMM_DEPS := $(COMM_SRC) comm/dynemb_comm.h comm/comm_internal.h
$(COMM_LIB): $(COMM_DEPS)
	@mkdir -p $(@D)
	$(MPICC) $(filter-out -MMD -MP,$(PUBFLAGS)) $(CFLAGS) -Icomm -shared $(COMM_SRC) -o $@ -pthread -Wl,--no-undefined -Wl,-soname,libdynemb_comm.so
# The shard room (comm/shard.h): what several ranks do together, on the
# exchange and the engine's public API. A static archive (PIC, hidden
# symbols) that the op library of several ranks links in: its engine calls
# must bind to the engine copy whose registry holds the tables, the one in
# _dynemb_ops.so, which only that op library links against; a shared
# library of its own would need an engine of its own. No MPI header: it
# compiles with the plain compiler.
SHARD_LIB  := build/libdynemb_shard.a
SHARD_SRC  := comm/route.c comm/shard_part.c comm/shard_lookup.c \
              comm/shard_apply.c comm/shard_allreduce.c
SHARD_DEPS := $(SHARD_SRC) comm/route.h comm/shard.h comm/shard_int.h \
              comm/dynemb_comm.h include/dynemb.h
SHARD_OBJ  := $(SHARD_SRC:comm/%.c=build/shard/%.o)
build/shard/%.o: comm/%.c $(SHARD_DEPS)
	@mkdir -p $(@D)
	$(CC) $(filter-out -MMD -MP,$(PUBFLAGS)) $(CFLAGS) -Icomm -c $< -o $@
$(SHARD_LIB): $(SHARD_OBJ)
	@rm -f $@
	ar rcs $@ $^
comm: $(COMM_LIB) $(SHARD_LIB)
build/mpi/mpi_%: tests/mpi/mpi_%.c $(COMM_DEPS) tests/c/check.h tests/mpi/mpi_check.h
	@mkdir -p $(@D)
	$(MPICC) $(filter-out -MMD -MP,$(PUBFLAGS)) $(ASAN_FLAGS) -Icomm -Itests/c $< $(COMM_SRC) -o $@ -pthread
# The shard room's tests: the room, the exchange and the engine, all
# under ASan+UBSan.
build/mpi/mpi_shard: tests/mpi/mpi_shard.c $(COMM_DEPS) $(SHARD_DEPS) tests/c/check.h tests/mpi/mpi_check.h build/asan/libdynemb.a
	@mkdir -p $(@D)
	$(MPICC) $(filter-out -MMD -MP,$(PUBFLAGS)) $(ASAN_FLAGS) -Icomm -Itests/c $< $(SHARD_SRC) $(COMM_SRC) build/asan/libdynemb.a -o $@ $(LDLIBS)

C_TESTS     := $(TEST_SRC:tests/c/%.c=build/asan/%)
TSAN_TESTS  := $(TSAN_SRC:tests/c/%.c=build/tsan/%)
PLAIN_TESTS := $(PLAIN_SRC:tests/c/%.c=build/plain/%)
FUZZ_TESTS  := $(if $(shell command -v clang 2>/dev/null),build/fuzz/fuzz_ckpt)
HAVE_MPICC  := $(shell command -v $(MPICC) 2>/dev/null)
MPI_TESTS   := $(if $(HAVE_MPICC),$(MPI_SRC:tests/mpi/%.c=build/mpi/%))

# The program of a C test by name (test_table -> build/asan/test_table).
test_program = $(filter %/$(1),$(C_TESTS) $(TSAN_TESTS) $(PLAIN_TESTS) $(FUZZ_TESTS) $(MPI_TESTS))

DEP_FILES := $(foreach d,obj $(FLAVOURS:%=%/obj),$(ENGINE_SRC:src/%.c=build/$(d)/%.d)) \
             $(TOOL_OBJ:.o=.d) $(addsuffix .d,$(C_TESTS) $(TSAN_TESTS) $(PLAIN_TESTS) \
             build/fuzz/fuzz_ckpt build/step_costs)
include $(wildcard $(DEP_FILES))

c-tests: $(C_TESTS) $(TSAN_TESTS) $(PLAIN_TESTS) $(FUZZ_TESTS) $(MPI_TESTS)

# T=NAME: one program (test_table, tsan_stress, fuzz_ckpt, install_test);
# F=NAME: one test function of it.
ifeq ($(T),)
check: all c-tests
	@bash tests/run_all.sh c
else
check: check-$(T)
endif

check-%: all $$(call test_program,$$*)
	@if [ "$*" != install_test ] && [ -z "$(call test_program,$*)" ]; then \
	  echo "make check: no C test program named '$*'" >&2; exit 2; fi
	@bash tests/run_all.sh c $* $(F)

# --- Python / TensorFlow ------------------------------------------------------
# setuptools>=64 and wheel: the editable install below runs without build
# isolation, so the build backend pyproject.toml names must be in the venv.
$(VENV)/.stamp: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VPY) $(PIP) --upgrade pip
	$(VPY) $(PIP) $(TF_PIN) pytest pytest-xdist numpy "setuptools>=64" wheel
	@touch $@

venv: $(VENV)/.stamp

# The lock lists every package: --no-deps installs exactly it (see the file).
$(COMPAT_VENV)/.stamp: $(COMPAT_LOCK)
	rm -rf $(COMPAT_VENV)
	$(PYTHON) -m venv $(COMPAT_VENV)
	$(COMPAT_VENV)/bin/python $(PIP) --no-deps -r $(COMPAT_LOCK)
	@touch $@

compat-venv: $(COMPAT_VENV)/.stamp

ops: venv build/libdynemb.a $(if $(HAVE_MPICC),$(COMM_LIB) $(SHARD_LIB))
	$(MAKE) --no-print-directory -f tf/ops.mk PYTHON=$(VPY) ops $(if $(HAVE_MPICC),sharded-ops)

install-py: venv
	$(VPY) $(PIP) --no-build-isolation -e .

# --- entry points ---------------------------------------------------------------
# The op library is built once, against .venv's TensorFlow 2.15.1 headers;
# tests/run_all.sh loads that same file under both TensorFlow versions. The
# Python tests also run the benchmark programs (tests/py/test_bench_scripts.py).
test: all c-tests $(if $(HAVE_MPICC),$(COMM_LIB) build/bench/exchange_bench)
	@$(MAKE) --no-print-directory install-py
	@$(MAKE) --no-print-directory ops $(ENGINE_LEFT_OUT_LIB) build/step_costs
	@if [ "$(TF_COMPAT)" != 0 ]; then $(MAKE) --no-print-directory compat-venv; fi
	@TF_COMPAT=$(TF_COMPAT) TF_COMPAT_VENV=$(COMPAT_VENV) bash tests/run_all.sh all

# RANKS=N runs it on N ranks under mpirun (docs/distributed.md).
RANKS  ?= 1
MPIRUN ?= mpirun --oversubscribe --mca btl_vader_single_copy_mechanism none \
          $(if $(filter 0,$(shell id -u)),--allow-run-as-root)
demo: all install-py
	$(if $(filter-out 1,$(RANKS)),$(MPIRUN) -np $(RANKS) )$(VPY) examples/criteo_demo.py

demo-estimator: all install-py
	$(VPY) examples/criteo_estimator.py

bench: all
	./build/dynemb bench --rows 4000000 --dim 64 --batch 65536 --dist uniform --threads 2 --json
	./build/dynemb bench --rows 4000000 --dim 64 --batch 65536 --dist zipf:1.05 --threads 2 --json

# --- benchmark programs (none of them is part of the product) ------------------
# What any hash index could reach against the gather (BENCHMARKS.md, session 6).
build/probe_limit: bench/probe_limit.c
	@mkdir -p build
	$(CC) -std=c11 -D_GNU_SOURCE -O2 -Wall -Wextra -Werror -pthread $< -o $@

probe-limit: build/probe_limit
	./build/probe_limit 2

# The engine's part of a training step of bench/tf_train.py, per phase (C only).
build/step_costs: bench/step_costs.c comm/route.c comm/route.h build/libdynemb.a
	$(CC) $(BASEFLAGS) $(CFLAGS) -Icomm $< comm/route.c build/libdynemb.a -o $@ $(LDLIBS)

bench-step: build/step_costs install-py
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

.PHONY: comm demo-estimator all install uninstall check c-tests venv compat-venv ops install-py \
        test demo bench bench-ssd probe-limit bench-step clean FORCE

# --- TensorFlow training benchmark (bench/tf_train.py) -------------------------
# TFRA needs its own TensorFlow, so it gets its own virtualenv; where pip cannot
# install it, the benchmark reports tfra as null with the reason.
TFRA_VENV := .venv-tfra
TFRA_PIN  := tensorflow==2.16.2 tf-keras==2.16.0 tensorflow-recommenders-addons==0.8.1

$(TFRA_VENV)/.stamp:
	@($(PYTHON) -m venv $(TFRA_VENV) && $(TFRA_VENV)/bin/pip install -q --upgrade pip && \
	  $(TFRA_VENV)/bin/pip install -q $(TFRA_PIN) numpy && touch $@) || \
	  echo "bench-tf: could not install $(TFRA_PIN) into $(TFRA_VENV)" >&2

# bench/tf_train.py's dynemb_engine_left_out variant loads an analysis build
# of the op library: the unchanged tf/dynemb_ops.c whose calls of the
# engine's per-batch functions (ENGINE_LEFT_OUT_CALLS) are redirected by
# -Wl,--wrap to the stand-ins of bench/engine_left_out.c, which write their
# outputs (zero rows, "not admitted", 0 applied) and do nothing else. The step
# costs what it costs without the engine's work; it does not train.
ENGINE_LEFT_OUT_CALLS := dynemb_lookup dynemb_lookup_prepared dynemb_prepare \
                         dynemb_apply
ENGINE_LEFT_OUT_LIB   := build/bench/engine-left-out/_dynemb_ops.so

$(ENGINE_LEFT_OUT_LIB): bench/engine_left_out.c tf/dynemb_ops.c tf/ops.mk Makefile \
                        include/dynemb.h build/libdynemb.a $(VENV)/.stamp
	@rm -f $@
	$(MAKE) --no-print-directory -f tf/ops.mk PYTHON=$(VPY) OUT=$@ \
	  EXTRA_SRC=bench/engine_left_out.c \
	  EXTRA_LDFLAGS="$(ENGINE_LEFT_OUT_CALLS:%=-Wl,--wrap=%)"

bench-tf: all install-py $(ENGINE_LEFT_OUT_LIB)
	@$(MAKE) --no-print-directory $(TFRA_VENV)/.stamp
	$(VPY) bench/tf_train.py --json

.PHONY: bench-tf

# Several ranks against one process: step time, bytes per rank and step, and
# the link's bounds (bench/ranks.py; needs Open MPI). LINK_RATE=1gbit: the
# ranks on network hosts of this machine with links of that rate (root).
EXCHANGE_BENCH := build/bench/exchange_bench
$(EXCHANGE_BENCH): bench/exchange_bench.c $(COMM_DEPS)
	@mkdir -p $(@D)
	$(MPICC) $(filter-out -MMD -MP,$(PUBFLAGS)) $(CFLAGS) -Icomm $< $(COMM_SRC) -o $@ -pthread

# Export for serving: time and size against a checkpoint, served latency
# against the training graph's eval lookups (docs/serving.md).
bench-serving: all install-py
	$(VPY) bench/serving.py --json
.PHONY: bench-serving

# Incremental checkpoints against full ones (docs/checkpoint-format.md).
bench-incremental: all install-py
	$(VPY) bench/incremental.py --json
.PHONY: bench-incremental

bench-ranks: all install-py $(EXCHANGE_BENCH)
	$(VPY) bench/ranks.py --ranks $(if $(filter-out 1,$(RANKS)),$(RANKS),2) \
	  $(if $(LINK_RATE),--link-rate $(LINK_RATE)) --json
.PHONY: bench-ranks
