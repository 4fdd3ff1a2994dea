# nebula's front door. `make demo` and `make test` each install what is missing, build, and run.
BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
CTEST_ARGS ?=
PREFIX     ?= /usr/local
DESTDIR    ?=

.PHONY: all setup configure build install deb test test-all quality demo bench sanitize format \
        clean help

all: build

help:
	@echo "make demo      set up, build, and run the main job"
	@echo "make test      set up, build, and run the CPU test suite (everything not labelled gpu or quality)"
	@echo "make sanitize  the unit suite under address+undefined sanitizers (build-asan/)"
	@echo "make quality   checks of what tiny trained models write (BLAS-kernel dependent)"
	@echo "make bench     run the benchmarks (after build)"
	@echo "make install   build, then install libnebula, nebula.h, nebula.pc and nebula into PREFIX"
	@echo "               (default /usr/local; DESTDIR=D stages it under D; docs/api.md), with the"
	@echo "               WAN scripts, the delay line and the gateway's systemd unit"
	@echo "make deb       build, then the Debian package $(BUILD)/nebula_VERSION_ARCH.deb (cpack -G DEB)"
	@echo "make format    apply .clang-format to every C/CUDA source"

setup:
	@bash scripts/setup.sh

# after setup (also under make -j: the configure step needs the packages setup installs)
$(BUILD)/CMakeCache.txt: | setup
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

configure: setup $(BUILD)/CMakeCache.txt

build: configure
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -LE "gpu|quality" $(CTEST_ARGS)

# PREFIX/include/nebula.h, PREFIX/lib/libnebula.{so,a}, PREFIX/lib/pkgconfig/nebula.pc (relocatable)
# and PREFIX/bin/nebula; DESTDIR (staging for a package) is prepended to every path by cmake
install: build
	DESTDIR='$(DESTDIR)' cmake --install $(BUILD) --prefix '$(PREFIX)'

# the Debian package (docs/operations.md, The package): into $(BUILD)/
deb: build
	cd $(BUILD) && cpack -G DEB

# gpu tests too (they skip cleanly without a device)
test-all: build
	cd $(BUILD) && ctest --output-on-failure -LE quality $(CTEST_ARGS)

# what tiny trained models write (depends on the BLAS kernel's rounding: a measurement)
quality: build
	cd $(BUILD) && ctest --output-on-failure -L quality $(CTEST_ARGS)

sanitize: setup
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DNB_SANITIZE=address,undefined -DNB_CUDA=OFF
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ctest --output-on-failure -j $(JOBS) -L unit $(CTEST_ARGS)

demo: build data
	@bash scripts/demo.sh $(BUILD)

bench: build
	$(BUILD)/nebula bench codec

format:
	@git ls-files '*.c' '*.h' '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD) build-asan

# Corpus from Debian's repository (docs/data.md): quick tier for the demo and CI, full tier for
# real runs. Cached: returns at once when data/<tier> is current.
.PHONY: data data-full
data:
	python3 scripts/data/build.py --tier quick --out data --cache .cache/data

data-full:
	python3 scripts/data/build.py --tier full --out data --cache .cache/data
