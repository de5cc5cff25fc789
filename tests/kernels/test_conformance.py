"""Both kernels pass the Jupyter kernel conformance suite (jupyter_kernel_test), like python3.

Real kernels, started through jupyter_client from the installed kernelspecs.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import jupyter_kernel_test
import pytest

pytestmark = pytest.mark.kernel


class _NbrewindConformance(jupyter_kernel_test.KernelTests):
    __test__ = False  # the base runs python3; only the subclasses below are collected
    language_name = "python"
    file_extension = ".py"
    code_hello_world = "print('hello, world')"
    code_stderr = "import sys; print('test', file=sys.stderr)"
    completion_samples = [{"text": "zi", "matches": {"zip"}}]
    complete_code_samples = ["1", "print('hello, world')", "def f(x):\n  return x*2\n\n\n"]
    incomplete_code_samples = ["print('''hello", "def f(x):\n  x*2"]
    invalid_code_samples = ["import = 7q"]
    code_page_something = "zip?"
    code_generate_error = "raise ValueError('boom')"
    code_execute_result = [{"code": "1+2+3", "result": "6"}, {"code": "[n*n for n in range(1, 4)]", "result": "[1, 4, 9]"}]
    code_display_data = [
        {"code": "from IPython.display import HTML, display; display(HTML('<b>test</b>'))", "mime": "text/html"},
        {"code": "from IPython.display import Math, display; display(Math('\\\\frac{1}{2}'))", "mime": "text/latex"},
    ]
    code_history_pattern = "1?2*"
    supported_history_operations = ("tail", "search")
    code_inspect_sample = "zip"
    code_clear_output = "from IPython.display import clear_output; clear_output()"

    _store_dir: str

    @classmethod
    def setUpClass(cls) -> None:
        cls._store_dir = tempfile.mkdtemp(prefix="nbrewind-conformance-")
        cls._saved_env = os.environ.get("NBREWIND_STORE")
        os.environ["NBREWIND_STORE"] = os.path.join(cls._store_dir, "store")
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        if cls._saved_env is None:
            os.environ.pop("NBREWIND_STORE", None)
        else:
            os.environ["NBREWIND_STORE"] = cls._saved_env
        shutil.rmtree(cls._store_dir, ignore_errors=True)


class TestAuditConformance(_NbrewindConformance):
    __test__ = True
    kernel_name = "nbrewind-audit"


class TestRepeatConformance(_NbrewindConformance):
    __test__ = True
    kernel_name = "nbrewind-repeat"
