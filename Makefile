# Makefile: the README's commands, wrapping CMake. `make demo` and `make check` first run
# scripts/deps.sh, which installs (apt-get) whatever is missing.
MAKEFLAGS += --no-print-directory
JOBS ?= $(shell nproc)
BUILD ?= build
CMAKE_FLAGS ?=

.PHONY: all deps build demo check check-avx2 check-asan check-tsan check-layers check-mpich check-fuzz fuzz fuzz-build bench install clean

all: build

deps:
	@scripts/deps.sh

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# The demo: one epoch of the MLP 784-1024-1024-10 on Fashion-MNIST with `loom train` (AdamW,
# batch 256, bf16 autocast; a few seconds), ending with its test accuracy.
demo: deps build
	@$(BUILD)/tools/loom train --epochs 1 --amp bf16

check: deps build check-layers
	@cd $(BUILD) && ctest -LE bench --output-on-failure -j $(JOBS)

# An AVX2-only CPU (no AVX-512), emulated on any machine: loom's kernels capped at AVX2
# (LOOM_CPU) and oneDNN at AVX2 (ONEDNN_MAX_CPU_ISA; 2.6 also reads DNNL_MAX_CPU_ISA), so bf16
# GEMMs and convolutions take the widened path. The whole quick suite and the demo run under
# the caps; the kernel suites also run at the scalar level.
# OpenBLAS reads its core before loom runs, so it is capped here too: without it, OpenBLAS would
# run its AVX-512 kernels on an AVX-512 machine and the AVX2 suite would not be AVX2-only.
AVX2_CAPS = LOOM_CPU=avx2 ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell
check-avx2: deps build
	@cd $(BUILD) && $(AVX2_CAPS) ctest -LE bench --output-on-failure -j $(JOBS)
	@cd $(BUILD) && LOOM_CPU=scalar ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell ctest -L "^(core|amp|ops|optim)$$" --output-on-failure -j $(JOBS)
	@$(AVX2_CAPS) $(BUILD)/tools/loom train --epochs 1 --amp bf16

# The same suites built with AddressSanitizer + UndefinedBehaviorSanitizer.
check-asan: deps
	@$(MAKE) --no-print-directory build BUILD=build-asan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=address,undefined"
	@cd build-asan && LOOM_SANITIZED=1 ctest -LE bench --output-on-failure -j $(JOBS)

# The threaded suites built with ThreadSanitizer.
check-tsan: deps
	@$(MAKE) --no-print-directory build BUILD=build-tsan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=thread"
	@cd build-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp $(TSAN_OPTIONS)" ctest -L "$(TSAN_LABELS)" --output-on-failure -j $(JOBS)
TSAN_LABELS ?= core|amp|autograd|nn|dist|ddp|fsdp|step

# Every MPI test (ctest -R mpi: the dist suites on 2 and 3 ranks, the finalize bound, `loom
# train --backend mpi`'s, and across namespace hosts as root) against MPICH, in build-mpich,
# beside Debian's default Open MPI: libloom built by MPICH's compiler wrapper, its tests and
# bench_allreduce launched by MPICH's hydra (cmake/loom_mpiexec.cmake).
MPICH_BUILD ?= build-mpich
check-mpich:
	@LOOM_WITH_MPICH=1 scripts/deps.sh
	@$(MAKE) --no-print-directory build BUILD=$(MPICH_BUILD) CMAKE_FLAGS="-DMPI_C_COMPILER=/usr/bin/mpicc.mpich -DMPIEXEC_EXECUTABLE=/usr/bin/mpiexec.mpich $(CMAKE_FLAGS)"
	@cd $(MPICH_BUILD) && ctest -R mpi --output-on-failure -j $(JOBS)

check-layers:
	@scripts/check_layers.sh

bench: deps build
	@cd $(BUILD) && ctest -L bench -V

# Fuzzing (fuzz/, scripts/fuzz.sh): libFuzzer harnesses of every parser of untrusted bytes, built
# with clang under ASan + UBSan in $(FUZZ_BUILD); `make fuzz` explores at random for FUZZ_SECONDS
# each, `make check-fuzz` (CI) replays the seed corpus and past crashes, then runs a fixed number
# of inputs from a fixed seed (reproducible: a gate, not a search).
FUZZ_BUILD ?= build-fuzz
FUZZ_SECONDS ?= 300
fuzz-build:
	@LOOM_WITH_FUZZ=1 scripts/deps.sh
	@CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Release -DLOOM_FUZZ=ON \
	  -DLOOM_SANITIZE=address,undefined >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_all
fuzz: fuzz-build
	@scripts/fuzz.sh $(FUZZ_BUILD) $(FUZZ_SECONDS)
check-fuzz: fuzz-build
	@scripts/fuzz.sh $(FUZZ_BUILD) fixed

# Install headers, libloom (shared and static), the loom tool, the CMake package and loom.pc /
# loom-static.pc under PREFIX (default /usr/local). Builds those targets only: no test,
# benchmark or example (`make check` and `make bench` build them).
PREFIX ?= /usr/local
install: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) --target loom loom_shared loom_tool
	@cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf build build-asan build-tsan
