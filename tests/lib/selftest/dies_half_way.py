# SPDX-License-Identifier: GPL-2.0
"""A guest test whose process dies at its second test, as one does when
the kernel kills it or the interpreter crashes (tests/lib/ktap-selftest):
the two tests after it never report."""

import os


def test_first():
    pass


def test_second_dies():
    os._exit(0)  # not even a failing status


def test_third():
    pass


def test_fourth():
    pass
