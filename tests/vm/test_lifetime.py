# SPDX-License-Identifier: GPL-2.0
"""Lifetimes of user objects and of the driver, with refa.ko bound to every
efa-emu device: through the unmodified rdma-core efa provider (pyverbs),
contexts, PDs and CQs are created and freed in a loop with their ring and
doorbell pages mapped and unmapped; a device is unbound while a process
holds an open context with a mapped doorbell; the module is unloaded and
loaded 10 times (REFA_LOADS) with the devices present. The harness then
fails the run on any kernel splat or kmemleak report.

Ten loads, not more: each costs a few seconds in the TCG guest (the probe
of two devices, unloading, and registering the kCFI coverage's kprobes
again), and what a load leaks or leaves armed shows after the first; the
KUnit suites ran at the boot's load and are kept from running again at
each reload. kmemleak's scan
at the end counts every load's leaks at once. The longer stress:

  tools/vm/run --devices 2 -- env REFA_LOADS=50 tests/lib/ktap-pytest \
      tests/vm/test_lifetime.py -k insmod
"""

import os
import subprocess
import sys
import time

import pytest
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD

import vmtest

DRIVER = "/sys/bus/pci/drivers/refa"


def wait_all_ib(bdfs, seconds=10):
    """Every function has an ib device within `seconds`."""
    for bdf in bdfs:
        deadline = time.monotonic() + seconds
        while not vmtest.ib_of(bdf):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
    return True


@pytest.fixture(scope="module")
def bdfs():
    found = vmtest.amazon_functions()
    assert found, "no Amazon PCI function"
    return found


def uverbs_mappings():
    with open("/proc/self/maps") as f:
        return sum("/dev/infiniband/uverbs" in line for line in f)


def mapped_loop(device, rounds):
    """`rounds` times a context, 4 PDs and 3 CQs, whose rings and doorbells
    the efa provider maps, and everything freed."""
    for i in range(rounds):
        ctx = Context(name=device)
        pds = [PD(ctx) for _ in range(4)]
        before = uverbs_mappings()
        cqs = [CQ(ctx, 64) for _ in range(3)]
        with_cqs = uverbs_mappings()
        # The efa provider maps each CQ's ring and doorbell page.
        assert with_cqs >= before + 6, f"round {i}: {with_cqs - before} new uverbs mappings for 3 CQs"
        for cq in cqs:
            cq.close()
        assert uverbs_mappings() == before, f"round {i}: mappings left after destroying the CQs"
        for pd in pds:
            pd.close()
        ctx.close()


def test_contexts_pds_and_cqs_with_mapped_rings_in_a_loop(bdfs):
    mapped_loop(vmtest.ib_of(bdfs[0]), 100)


# Holds a context, a PD and a CQ (its doorbell mapped) until the device is
# gone from sysfs (the parent unbinds it; the core disassociates contexts
# before it removes the device), not a fixed time: a busy host makes the
# unbind take seconds. Then the context can no longer create anything, and
# the process cleans up without hanging.
HOLDER = r"""
import os, sys, time
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD
from pyverbs.pyverbs_error import PyverbsError

dev = sys.argv[1]
ctx = Context(name=dev)
pd = PD(ctx)
cq = CQ(ctx, 64)
print("ready", flush=True)
deadline = time.monotonic() + 60
while os.path.exists(f"/sys/class/infiniband/{dev}"):
    if time.monotonic() > deadline:
        sys.exit("holder: the device is still there 60 s after ready")
    time.sleep(0.1)
try:
    PD(ctx)
    sys.exit("holder: a PD on a removed device")
except PyverbsError as e:
    print(f"holder: after unbind, a new PD fails: {e}".splitlines()[0])
for o in (cq, pd, ctx):
    o.close()
print("holder: closed")
"""


def test_unbind_while_a_process_holds_a_context_with_a_mapped_doorbell(bdfs):
    bdf = bdfs[0]
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, vmtest.ib_of(bdf)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready", "the holder did not get ready"
        start = time.monotonic()
        try:
            subprocess.run(["sh", "-c", f"echo {bdf} >{DRIVER}/unbind"], check=True, timeout=30)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
            pytest.fail(f"unbind with an open context hung or failed: {e}")
        print(f"unbound in {time.monotonic() - start:.0f} s with the context open")
        assert not vmtest.ib_of(bdf), "ib device still there after unbind"
        out, _ = holder.communicate(timeout=90)
        print(out)
        assert holder.returncode == 0, f"the holder process failed: {out}"
    finally:
        if holder.poll() is None:
            holder.kill()
        if not vmtest.ib_of(bdf):
            vmtest.write_sysfs(f"{DRIVER}/bind", bdf)
    assert wait_all_ib(bdfs), "no ib device after bind"
    mapped_loop(vmtest.ib_of(bdf), 3)


def test_rmmod_and_insmod_with_the_devices_present(bdfs):
    loads = int(os.environ.get("REFA_LOADS", "10"))
    module = vmtest.refa_module()
    assert os.path.isfile(module), f"no module at {module}"
    start = time.monotonic()
    try:
        with vmtest.no_kunit_at_load():
            for i in range(1, loads + 1):
                subprocess.run(["rmmod", "refa"], check=True)
                subprocess.run(["insmod", module], check=True)
                assert wait_all_ib(bdfs), f"load {i}: not every device came up"
    finally:
        # The tests after this one need the driver.
        if not os.path.isdir("/sys/module/refa"):
            subprocess.run(["insmod", module])
    print(f"{loads} loads with {len(bdfs)} devices in {time.monotonic() - start:.0f} s")
    mapped_loop(vmtest.ib_of(bdfs[0]), 3)
