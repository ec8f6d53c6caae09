# SPDX-License-Identifier: GPL-2.0
"""A guest test whose first check fails (tests/lib/ktap-selftest): the
checks after it still run and report."""

import pytest


def test_first_fails():
    assert 1 == 2, "the first check"


@pytest.mark.parametrize("n", [2, 3])
def test_later(n):
    assert n > 1
