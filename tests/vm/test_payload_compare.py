# SPDX-License-Identifier: GPL-2.0
"""The comparison of test_payload.py catches what a wrong page list does:
for each form of page list, the bytes are copied as a broken device would
(two pages swapped, the last page not written, one byte too many) and each
fault must be caught, naming what it saw, while a right copy passes. No
device: tools/vm/selftest runs it on the host.
"""

import random

import pytest

from payload import FORMS, PAGE, Region

FAULTS = {
    "right": None,
    "two-pages-swapped": "holds the bytes of source offset",
    "last-page-not-written": "never written",
    "one-byte-too-many": "bytes after the destination changed",
}


def copy_with(fault, data, length, offset):
    """What a device with `fault` leaves in the destination."""
    pages = (offset + length + PAGE - 1) // PAGE
    # The boundary between the last two pages of the region (for the
    # chained forms, where the last chunk begins).
    k = pages - 2
    if fault == "right":
        return data
    if fault == "last-page-not-written":
        return data[:(k + 1) * PAGE - offset]
    if fault == "one-byte-too-many":
        return data + b"\0"
    # Page k of the destination got page k - 1's bytes and the other way
    # round, as a misordered page list does.
    a, b = (k - 1) * PAGE - offset, k * PAGE - offset
    lo = max(a, 0)
    copied = data[:lo] + data[b:b + PAGE] + data[lo + PAGE:b] + data[lo:lo + PAGE] + data[b + PAGE:]
    return copied[:length]


@pytest.mark.parametrize("name,length,offset", FORMS, ids=[f[0] for f in FORMS])
def test_comparison_catches_misplaced_bytes(name, length, offset):
    data = random.Random(1).randbytes(length)
    dst = Region(None, length, offset)
    try:
        for fault, want in FAULTS.items():
            dst.clear()
            copied = copy_with(fault, data, length, offset)
            dst.map[dst.start:dst.start + len(copied)] = copied
            try:
                dst.expect(0, data, f"{name}: {fault}", data)
                caught = None
            except AssertionError as err:
                caught = str(err)
            if want is None:
                assert caught is None, f"{fault}: a right copy was refused: {caught}"
            else:
                assert caught is not None and want in caught, f"{fault} not caught as '{want}' ({caught})"
    finally:
        dst.close()
