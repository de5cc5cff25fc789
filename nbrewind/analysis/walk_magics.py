"""`get_ipython().run_*_magic(...)` calls the caller trusts: analysed, not treated as dynamic."""

from __future__ import annotations

import ast

from nbrewind.analysis.walk_state import MAGIC_RUNNERS, WalkerState


class MagicWalk(WalkerState):
    """The magic half of `CellWalker`."""

    def _magic(self, node: ast.Call) -> bool:
        """Handle `get_ipython().run_*_magic('name', ...)` for the magics the caller trusts."""
        func = node.func
        if not (
            isinstance(func, ast.Attribute)
            and func.attr in MAGIC_RUNNERS
            and isinstance(func.value, ast.Call)
            and isinstance(func.value.func, ast.Name)
            and func.value.func.id == "get_ipython"
            and not func.value.args
            and not func.value.keywords
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            return False
        magic = node.args[0].value
        if magic in self.code_magics:
            code_at = MAGIC_RUNNERS[func.attr]
            code = node.args[code_at] if len(node.args) > code_at else None
            for i, arg in enumerate(node.args[1:], start=1):
                if i != code_at:
                    self.expr(arg)
            if not (isinstance(code, ast.Constant) and isinstance(code.value, str)):
                self.dynamic = True
                return True
            try:
                inner = ast.parse(code.value)
            except (SyntaxError, ValueError):
                self.dynamic = True  # e.g. IPython syntax inside: the magic transforms it itself
                return True
            if self.top is not self.module:
                self.dynamic = True
                return True
            self.block(inner.body)
            return True
        if magic in self.allowed_magics:
            for arg in node.args[1:]:
                self.expr(arg)
            for kw in node.keywords:
                self.expr(kw.value)
            return True
        return False
