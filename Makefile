# Makefile: the README's commands, wrapping CMake. `make demo` and `make check` first run
# scripts/deps.sh, which installs (apt-get) whatever is missing.
MAKEFLAGS += --no-print-directory
JOBS ?= $(shell nproc)
BUILD ?= build
CMAKE_FLAGS ?=

.PHONY: all deps build demo check check-asan check-tsan check-layers bench clean

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

# The same suites built with AddressSanitizer + UndefinedBehaviorSanitizer.
check-asan: deps
	@$(MAKE) --no-print-directory build BUILD=build-asan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=address,undefined"
	@cd build-asan && LOOM_SANITIZED=1 ctest -LE bench --output-on-failure -j $(JOBS)

# The threaded suites built with ThreadSanitizer.
check-tsan: deps
	@$(MAKE) --no-print-directory build BUILD=build-tsan CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=thread"
	@cd build-tsan && TSAN_OPTIONS="suppressions=$(CURDIR)/tests/tsan.supp $(TSAN_OPTIONS)" ctest -L "$(TSAN_LABELS)" --output-on-failure -j $(JOBS)
TSAN_LABELS ?= core|amp|autograd|nn|dist|ddp|fsdp

check-layers:
	@scripts/check_layers.sh

bench: deps build
	@cd $(BUILD) && ctest -L bench -V

clean:
	rm -rf build build-asan build-tsan
