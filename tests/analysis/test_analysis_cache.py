"""A cell's analysis and code digest are kept for the process's life (they depend on its text
only), and its one parse is shared by both; an answer forced by the moment is not kept."""

from __future__ import annotations

import pytest

from nbrewind.analysis import analyze_cell, effects, parse_source
from nbrewind.session import policy

CELL = "import math\ny = [math.sqrt(v) for v in xs]\nz.append(y)\n"


def test_a_cell_is_analysed_once_and_parsed_once_for_its_effects_and_its_digest(monkeypatch: pytest.MonkeyPatch) -> None:
    source = CELL + "# a text no other test uses\n"
    parses: list[str] = []
    real_parse = effects.ast.parse

    def counting_parse(text: str, *args: object, **kwargs: object) -> object:
        parses.append(text)
        return real_parse(text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(effects.ast, "parse", counting_parse)
    first = analyze_cell(source, allowed_magics=policy.ALLOWED_MAGICS, code_magics=policy.CODE_MAGICS)
    digest = policy.code_digest(source)
    assert parses == [source]  # the digest reused the parse of the analysis
    again = analyze_cell(source, allowed_magics=set(policy.ALLOWED_MAGICS), code_magics=list(policy.CODE_MAGICS))
    assert again is first and policy.code_digest(source) == digest and parses == [source]
    assert first.reads >= {"xs", "z"} and first.writes >= {"math", "y"}
    assert any(c.receiver == "z" and c.method == "append" for c in first.calls)
    assert parse_source(source) is parse_source(source)


def test_the_same_text_under_other_magic_rules_is_another_question() -> None:
    transformed = "get_ipython().run_line_magic('matplotlib', 'inline')\n"
    allowed = analyze_cell(transformed, allowed_magics={"matplotlib"})
    not_allowed = analyze_cell(transformed)
    assert not allowed.dynamic and not_allowed.dynamic


@pytest.mark.parametrize("failure", [MemoryError, RecursionError])
def test_an_answer_forced_by_memory_or_stack_depth_is_not_kept(monkeypatch: pytest.MonkeyPatch, failure: type[BaseException]) -> None:
    source = f"a_{failure.__name__} = b + 1\n"

    def failing(text: str) -> object:
        raise failure()

    monkeypatch.setattr(effects, "parse_source", failing)
    forced = analyze_cell(source)
    assert forced.syntax_error  # as before: the cell is not recorded with made-up effects kept
    monkeypatch.undo()
    real = analyze_cell(source)
    assert not real.syntax_error and real.reads == {"b"} and real.writes == {f"a_{failure.__name__}"}


def test_a_walk_too_deep_for_the_stack_is_dynamic_and_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    source = "deep = 1\n"

    def too_deep(self: object, body: object) -> None:
        raise RecursionError

    monkeypatch.setattr(effects.CellWalker, "block", too_deep)
    assert analyze_cell(source).dynamic
    monkeypatch.undo()
    assert not analyze_cell(source).dynamic
