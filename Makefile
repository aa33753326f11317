# Thin wrapper over scripts/setup.sh, CMake and CTest. `make demo` and `make test` work on a
# fresh Debian 12 machine (run as root, or with sudo available).
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all setup configure build demo test bench fuzz clean

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

clean:
	rm -rf $(BUILD)
