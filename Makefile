# Thin wrapper over scripts/setup.sh, CMake and CTest. `make demo` and `make test` work on a
# fresh Debian 12 machine (run as root, or with sudo available).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup configure build demo test bench fuzz fresh-test fresh-demo clean

all: build

setup:
	bash scripts/setup.sh

configure: setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	bash scripts/demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

bench: build
	bash scripts/bench.sh $(BUILD)

fuzz: setup
	bash scripts/fuzz.sh

# `make test` / `make demo` on a brand-new Debian 12 root with a clean clone of HEAD (needs root).
fresh-test:
	bash scripts/fresh-root.sh test

fresh-demo:
	bash scripts/fresh-root.sh demo

clean:
	rm -rf $(BUILD)
