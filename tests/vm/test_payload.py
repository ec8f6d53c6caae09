# SPDX-License-Identifier: GPL-2.0
"""Payloads end to end (payload.py), under refa or the kernel's efa.ko:
each operation (RDMA write, RDMA write with immediate, RDMA read, SRD send,
UD send) on each form of page list (payload.FORMS), between two contexts
on the first device under test, then from the first to the second (two
devices, joined by efa-emu's fabric) when there are two. The guest kernel
has neither transparent huge pages nor hugetlbfs, so every region is of
4 KiB pages (the driver may still merge contiguous ones).
"""

import random

import pytest

import payload

OPERATIONS = ["RDMA-write", "RDMA-write-with-immediate", "RDMA-read", "SRD-send", "UD-send"]


def pytest_generate_tests(metafunc):
    if "pair" in metafunc.fixturenames:
        names = metafunc.config.getoption("device")
        pairs = []
        if names:
            pairs.append((names[0], names[0]))
            if len(names) > 1:
                pairs.append((names[0], names[1]))
        metafunc.parametrize("pair", pairs or [None], ids=[f"{a}-{b}" for a, b in pairs] or ["no-device"],
                             indirect=True, scope="module")
    if "form" in metafunc.fixturenames:
        metafunc.parametrize("form", payload.FORMS, ids=[f[0] for f in payload.FORMS])


@pytest.fixture(scope="module")
def pair(request):
    """Two sides (contexts) on the devices --device names: the first twice,
    or the first and the second."""
    if request.param is None:
        pytest.fail("test_payload needs --device A [--device B]")
    a_name, b_name = request.param
    a, b = payload.Side(a_name), payload.Side(b_name)
    yield payload.Pair(a, b, f"{a_name}->{b_name}")
    a.close()
    b.close()


class Regions:
    """The regions of the form of page list the tests are at, kept from one
    test to the next (the five operations of a form run in a row): a
    region on each side in that form, and known bytes for it."""

    def __init__(self):
        self.key, self.regions = None, None

    def get(self, pair, form):
        if self.key != (pair, form):
            self.close()
            name, length, offset = form
            src, dst = payload.Region(pair.a, length, offset), payload.Region(pair.b, length, offset)
            self.key = (pair, form)
            self.regions = (src, dst, random.Random(f"{name} 0x0EFA").randbytes(length), offset)
        return self.regions

    def close(self):
        if self.regions:
            self.regions[0].close()
            self.regions[1].close()
        self.key, self.regions = None, None


@pytest.fixture(scope="module")
def kept(pair):
    # Torn down before the pair whose PDs its regions are registered in.
    k = Regions()
    yield k
    k.close()


@pytest.fixture
def regions(kept, pair, form):
    """(source on a, destination on b, known bytes, page offset)."""
    return kept.get(pair, form)


@pytest.mark.parametrize("operation", OPERATIONS)
def test_payload(pair, regions, operation):
    src, dst, data, offset = regions
    if operation == "RDMA-write":
        pair.rdma_write_checks(src, dst, data, offset)
    elif operation == "RDMA-write-with-immediate":
        pair.rdma_write_imm_checks(src, dst, data)
    elif operation == "RDMA-read":
        pair.rdma_read_checks(src, dst, data, offset)
    else:
        pair.send_checks(operation.replace("-", " "), src, dst, data, offset)
