"""The C kernels' build: a library is written whole or not at all, once per source, and loads."""

import ctypes

import pytest

from rlvr.engine.cpu import native


@pytest.fixture
def cc():
    try:
        return native.compiler("a C compiler", True)
    except RuntimeError as error:
        pytest.skip(str(error))


def test_a_failed_build_leaves_nothing_and_a_good_one_a_library_built_once(tmp_path, monkeypatch, cc):
    monkeypatch.setenv("RLVR_HOME", str(tmp_path / "home"))
    kernels = tmp_path / "home" / "kernels"
    bad = tmp_path / "bad.c"
    bad.write_text("int twice(int x) { return 2 * x }\n")  # no semicolon
    with pytest.raises(RuntimeError, match="failed"):
        native.build(str(bad), cc)
    assert list(kernels.iterdir()) == []  # neither a half-written library nor a temporary file
    good = tmp_path / "good.c"
    good.write_text("int twice(int x) { return 2 * x; }\n")
    library = native.build(str(good), cc)
    assert list(kernels.iterdir()) == [library] and library.name.startswith("good-")
    assert ctypes.CDLL(str(library)).twice(21) == 42
    built_at = library.stat().st_mtime_ns
    assert native.build(str(good), cc) == library and library.stat().st_mtime_ns == built_at  # cached
