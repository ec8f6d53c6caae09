# SPDX-License-Identifier: GPL-2.0
"""The guest tests' fixtures (pytest), in the shape of rdma-core's
tests/base.py and efa_base.py: the devices under test, a context, a PD, a
CQ, a byte-level uverbs context (uverbs.py), the efa-emu device model
behind a device (its control window: faults, counters) and the device's
hardware counters (hw_counter).

A test that takes `device` runs once per device under test: those given
with --device (repeatable), or every RDMA device. Tests run in file order,
device after device (the parametrisation is module-wide), and each one
stands alone: it creates what it checks, so that any one can be picked
with -k and fails on its own.

Run them inside the test VM through tests/lib/ktap-pytest (KTAP on
standard output), e.g.

  tools/vm/run --devices 2 -- tests/lib/ktap-pytest tests/vm/test_events.py -k channel
"""

import os
import sys

import pytest
import pyverbs.providers.efa.efadv as efadv
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.pd import PD

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tools", "efa-emu", "guest"))

import efa_emu  # noqa: E402
import uverbs as uv  # noqa: E402
import vmtest  # noqa: E402


def pytest_addoption(parser):
    group = parser.getgroup("refa", "the devices under test")
    group.addoption("--device", action="append", default=[], metavar="NAME",
                    help="an RDMA device to test (repeatable; default: every one)")
    group.addoption("--require-handshake", action="store_true",
                    help="test_uapi: fail unless a device under test needs a capability")
    group.addoption("--rounds", type=int, default=6,
                    help="test_isolation: the attacker's rounds (default 6)")
    group.addoption("--one-device", action="store_true",
                    help="test_traffic: skip the cross-device tests (they fail without a second device)")
    group.addoption("--each-driver", action="store_true",
                    help="a file that takes N devices (DEVICES = N) takes the first N of each driver's "
                    "(a boot with refa and efa.ko side by side)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "refa_only: what refa does beyond any driver of the device (faults injected into "
        "the model, refusals stricter than efa.ko's); -m 'not refa_only' leaves the referee's part")


def devices_under_test(config):
    return config.getoption("device") or vmtest.ib_devices()


def pytest_generate_tests(metafunc):
    # Module-wide: pytest then runs a module's tests device after device. A
    # file whose checks need not run on every device says how many it
    # takes (DEVICES = 1: the first under test), so that one pytest run can
    # take every file of a boot.
    if "device" in metafunc.fixturenames:
        names = devices_under_test(metafunc.config)
        count = getattr(metafunc.module, "DEVICES", len(names))
        if metafunc.config.getoption("each_driver"):
            by_driver = {}
            for name in names:
                by_driver.setdefault(vmtest.driver_of(name), []).append(name)
            names = [name for group in by_driver.values() for name in group[:count]]
        else:
            names = names[:count]
        metafunc.parametrize("device", names or [None], ids=names or ["no-device"], indirect=True,
                             scope="module")


@pytest.fixture(scope="module")
def device(request):
    """The name of the RDMA device under test (refa_0, efa_1, ...)."""
    if request.param is None:
        pytest.fail("no RDMA device (none given with --device, none in /sys/class/infiniband)")
    return request.param


@pytest.fixture(scope="session")
def devices(request):
    """Every device under test."""
    names = devices_under_test(request.config)
    if not names:
        pytest.fail("no RDMA device (none given with --device, none in /sys/class/infiniband)")
    return names


@pytest.fixture(scope="module")
def peers(devices):
    """The GIDs of every device under test."""
    gids = []
    for n in devices:
        with Context(name=n) as c:
            gids.append(c.query_gid(1, 0))
    return gids


@pytest.fixture(scope="module")
def bdf(device):
    return vmtest.bdf_of(device)


@pytest.fixture(scope="module")
def driver(device):
    """The kernel driver bound to the device: refa or efa."""
    return vmtest.driver_of(device)


@pytest.fixture
def ctx(device):
    """A context on the device through the efa provider (efadv)."""
    c = efadv.EfaContext(name=device)
    yield c
    c.close()


@pytest.fixture
def pd(ctx):
    p = PD(ctx)
    yield p
    p.close()


@pytest.fixture
def cq(ctx):
    c = CQ(ctx, 64)
    yield c
    c.close()


@pytest.fixture
def uverbs(device):
    """A user context on the device spoken byte by byte (uverbs.py),
    with every capability the efa provider announces."""
    u = uv.Uverbs(device)
    u.get_context()
    yield u
    u.close()


@pytest.fixture
def hw_counter(device):
    """The device's hardware counters: hw_counter(NAME) of the device,
    hw_counter(NAME, port=1) of a port, read past the core's 10 ms cache of
    them, so that two reads around a verb see what it counted."""
    def read(name, port=None):
        return vmtest.fresh_counter(device, name, port)
    return read


class EmuDevice:
    """The efa-emu model behind an RDMA device, through its control
    window (tools/efa-emu/guest/efa_emu.py)."""

    def __init__(self, device):
        self.name = device
        self.bdf = vmtest.bdf_of(device)
        self.win = efa_emu.Window(self.bdf)
        self.declared = False
        assert self.win.read(efa_emu.MAGIC) == efa_emu.MAGIC_VALUE, \
            f"{device} is not an efa-emu device with its control window on"

    @property
    def index(self):
        """efa-emu's --index of the model."""
        return self.win.read(efa_emu.INDEX)

    def admin(self):
        """(admin commands fetched, error completions written, injected
        faults that fired) so far."""
        return tuple(self.win.read(r) for r in (efa_emu.ADMIN_CMDS, efa_emu.ADMIN_ERRORS, efa_emu.INJECTED))

    def inject(self, opcode, status=0, nth=1, timeout=False):
        """Fails (or, with `timeout`, never answers) the `nth` next admin
        command `opcode`; the ones before it run. The default status,
        UNKNOWN_ERROR, is EINVAL to the drivers (efa_com_status_to_errno).
        The model counts the failure: declared to the harness first."""
        if not self.declared:
            vmtest.emu_may_report("admin_error", index=self.index)
            self.declared = True
        self.win.inject(opcode, 1, status, timeout, nth - 1)

    def clear(self):
        self.win.clear()


@pytest.fixture
def emu(device):
    """The efa-emu model behind the device, its faults disarmed when the
    test ends, whatever became of the test."""
    model = EmuDevice(device)
    yield model
    model.clear()


@pytest.fixture(autouse=True)
def _kmsg_mark(request):
    """Each test marked in the kernel log, so that a splat reads as the
    test's (blktests' habit): in the test VM (tools/vm/guest-init has
    refa_run from the kernel's command line), not on a host."""
    if "refa_run" not in os.environ or not os.access("/dev/kmsg", os.W_OK):
        yield
        return
    vmtest.kmsg(f"refa-test: start {request.node.nodeid}")
    yield
    vmtest.kmsg(f"refa-test: end {request.node.nodeid}")
