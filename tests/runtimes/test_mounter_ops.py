"""The mounter's ops (``mounter.py``) refuse a malformed request with an ``OSError`` the host
reports, rather than a ``TypeError`` that kills the forked child without an outcome."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from rollout_ray._runtimes import mounter


def test_overlay_with_upper_but_no_work_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "lower").mkdir()
    (tmp_path / "upper").mkdir()
    with pytest.raises(OSError, match="`upper` needs `work`") as raised:
        mounter.overlay(str(tmp_path / "root"), [str(tmp_path / "lower")], str(tmp_path / "upper"), None, False)
    assert raised.value.errno == errno.EINVAL
    assert raised.value.filename == str(tmp_path / "root")
