"""`nbrewind.identity.imports.after_import`: act on a library right after its first import,
without importing it. Each case runs in a fresh interpreter, where the module is not loaded."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def _run(tmp_path: Path, code: str) -> str:
    (tmp_path / "slowlib.py").write_text("VALUE = 1\n")
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_fires_once_after_the_module_ran_and_before_the_importer_gets_it(tmp_path: Path) -> None:
    out = _run(tmp_path, """
        import sys
        from nbrewind.identity.imports import after_import
        seen = []
        hook = after_import("slowlib", lambda m: (seen.append(m.VALUE), setattr(m, "VALUE", 2)))
        assert "slowlib" not in sys.modules and hook in sys.meta_path
        import slowlib
        assert slowlib.VALUE == 2 and seen == [1]
        del sys.modules["slowlib"]
        import slowlib
        assert seen == [1] and hook not in sys.meta_path
        print("ok")
    """)
    assert out == "ok"


def test_a_loaded_module_is_acted_on_at_once_and_a_removed_hook_never_fires(tmp_path: Path) -> None:
    out = _run(tmp_path, """
        import sys
        from nbrewind.identity.imports import after_import
        import json
        seen = []
        assert after_import("json", lambda m: seen.append(m.__name__)) is None and seen == ["json"]
        hook = after_import("slowlib", seen.append)
        hook.remove()
        import slowlib
        assert seen == ["json"] and hook not in sys.meta_path
        print("ok")
    """)
    assert out == "ok"


def test_two_hooks_on_one_module_both_fire(tmp_path: Path) -> None:
    out = _run(tmp_path, """
        from nbrewind.identity.imports import after_import
        seen = []
        after_import("slowlib", lambda m: seen.append("first"))
        after_import("slowlib", lambda m: seen.append("second"))
        import slowlib
        assert sorted(seen) == ["first", "second"], seen
        print("ok")
    """)
    assert out == "ok"
