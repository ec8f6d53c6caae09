# refa: the two commands a newcomer needs are 'make run' and 'make test'.
# Everything else here is a building block under them (see README.md).
# Kbuild reads the file 'Kbuild', not this one.

.PHONY: run test env kernel module emu check-user vm kunit bench bench-emu bench-fabric fuzz interop efa-patches upstream clean help

# Boot a VM with refa loaded and show what it does.
run: env kernel module emu
	@tools/run

# Everything that exists, with a pass/fail summary. ONLY=step,step runs
# those steps and what they need (tools/test --list names them);
# KEEP_GOING=1 reports every failing step; JUNIT=file writes JUnit XML.
test:
	@tools/test $(if $(ONLY),--only $(ONLY)) $(if $(KEEP_GOING),--keep-going) $(if $(JUNIT),--junit $(JUNIT))

help:
	@sed -n 's/^\([a-z-]*\):.*/  make \1/p' Makefile

env:
	@tools/env/setup

kernel: env
	@tools/kernel/build

module: kernel
	@tools/module/build

emu: env
	@tools/emu/build

# Userspace crates: fmt, clippy, tests.
check-user: env
	@tools/cargo-check

# A VM with a driver and emulated devices: a shell on its console when run
# from a terminal without CMD, else CMD (make vm CMD='ibv_devinfo -v'
# DRIVER=efa DEVICES=1).
vm: module emu
	@tools/vm/run --driver $(or $(DRIVER),refa) --devices $(or $(DEVICES),1) $(if $(CMD),-- $(CMD),$(if $(shell [ -t 0 ] && echo tty),--interactive,-- true))

kunit: module
	@tools/vm/run --driver refa --kunit

# Data-path figures: efa.ko on efa-emu beside rxe, and efa-emu's idle CPU.
bench: kernel emu module
	@tools/bench/datapath

# efa-emu's data path without a guest: messages a second, bandwidth and
# latency in one process and across two, beside memcpy, with copies per
# byte and allocations per message (tools/bench/emu).
bench-emu: env
	@tools/bench/emu

# The fabric's latency and bandwidth across two guests, in one guest and
# without a guest, one after the other in one run (tools/bench/fabric);
# DRIVER=efa for the C driver.
bench-fabric: kernel module emu
	@BENCH_DRIVER=$(or $(DRIVER),refa) tools/bench/fabric

# Adversaries with random seeds for DURATION (default 10m): the random
# uverbs client and failing allocations, the hostile device against refa,
# efa-emu's fuzz targets. Prints the seed, and for any failure a replay
# command: make fuzz REPLAY='ADVERSARY:SPEC'. SEED=S replays a whole run;
# ONLY=verbs,hostile,emu-admin picks adversaries. The VM adversaries need
# the module and efa-emu's binary; efa-emu's fuzz targets (emu-*) build
# themselves.
comma := ,
fuzz_names := $(if $(REPLAY),$(firstword $(subst :, ,$(REPLAY))),$(if $(ONLY),$(subst $(comma), ,$(ONLY)),hostile))
fuzz: env $(if $(filter-out emu-%,$(fuzz_names)),module emu)
	@tools/fuzz/run $(if $(REPLAY),--replay '$(REPLAY)',--duration $(or $(DURATION),10m) $(if $(SEED),--seed $(SEED)) $(if $(ONLY),--only $(ONLY)))

# Outside referees: fabtests, Open MPI, UCX and rdma-core 65's efadv on
# both drivers and both guest userspaces, one table (tests/interop/all).
interop: kernel module emu
	@tests/interop/all

# The efa.ko patches of patches/efa/: the patched module built against the
# test kernel, checkpatch --strict, and their reproducers under the
# kernel's efa.ko (each must see its bug) and the patched one (each must
# pass), one table (tests/efa-patches/run).
efa-patches: kernel emu
	@tests/efa-patches/run

# refa as a patch series for Linux (build/upstream/series), applied to the
# pristine source of the test kernel, built in tree with kCFI and booted
# with refa's checks (tools/upstream/build; NO_BOOT=1 stops after the build,
# NO_BISECT=1 builds the series at once rather than patch by patch).
upstream: kernel emu
	@tools/upstream/build $(if $(NO_BOOT),--no-boot) $(if $(NO_BISECT),--no-bisect)

clean:
	rm -rf build
