"""fusegen/writer.py: files written all or nothing, with the modes plain files get."""

import os
import stat
import sys

import pytest

from fusegen.writer import Planned, write_all

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX modes")


def mode(path):
    return stat.S_IMODE(path.stat().st_mode)


def test_new_files_follow_the_umask_and_rewritten_ones_keep_their_mode(tmp_path):
    # The temporary each text goes through is 0600 (mkstemp): a built module must still
    # be readable by the others a folder is shared with (a container image, a team's disk).
    old = os.umask(0o022)
    try:
        fresh, kept = tmp_path / "fresh.py", tmp_path / "kept.py"
        kept.write_text("old\n")
        kept.chmod(0o640)
        write_all([Planned(fresh, "new\n"), Planned(kept, "new\n")])
        assert mode(fresh) == 0o644 and mode(kept) == 0o640
        os.umask(0o077)
        again = tmp_path / "again.py"
        write_all([Planned(again, "new\n")])
        assert mode(again) == 0o600
    finally:
        os.umask(old)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_the_last_paths_are_replaced_after_the_others(tmp_path, monkeypatch):
    # The runtime's hash goes last: a build stopped midway leaves a runtime whose
    # modules refuse it, not modules that load a half-replaced runtime.
    order = []
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda tmp, path: (order.append(path), real(tmp, path)))
    hashed = tmp_path / "runtime" / "__init__.py"
    planned = [Planned(hashed, "h\n"), Planned(tmp_path / "a.py", "a\n")]
    planned.append(Planned(tmp_path / "runtime" / "b.py", "b\n"))
    write_all(planned, last=(hashed,))
    assert order[-1] == hashed and len(order) == 3
