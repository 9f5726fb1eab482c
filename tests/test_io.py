"""probe.io: a file is replaced whole or not at all."""

from __future__ import annotations

import os
import stat

import pytest

from probe.io import atomic_write, atomic_write_text, current_umask


def test_atomic_write_replaces_whole_and_leaves_no_temp(tmp_path):
    path = tmp_path / "sub" / "result.json"
    atomic_write_text(path, "first")
    atomic_write_text(path, "second")
    assert path.read_text() == "second"
    assert [p.name for p in path.parent.iterdir()] == ["result.json"]


def test_a_failing_writer_keeps_the_old_file(tmp_path):
    path = tmp_path / "result.json"
    atomic_write_text(path, "complete")

    def half_then_crash(fh):
        fh.write(b"half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        atomic_write(path, half_then_crash)
    assert path.read_text() == "complete"
    assert [p.name for p in tmp_path.iterdir()] == ["result.json"]


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_atomic_write_gives_the_mode_of_the_users_umask(tmp_path, mask, mode):
    old = os.umask(mask)
    try:
        assert current_umask() == mask
        path = atomic_write_text(tmp_path / "r.json", "{}")
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode
