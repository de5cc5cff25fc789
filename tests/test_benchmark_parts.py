"""How the domain-notebook harness splits a repeat's time (`benchmarks.run.repeat_time_parts`)."""

from __future__ import annotations

import pytest

from benchmarks.run import repeat_time_parts, repeat_time_table


def _said(decision: str, duration: float, back: float = 0.0) -> dict:
    return {"decision": decision, "duration": duration, "brought_back": {"seconds": back}}


def _round(replay_s: float, run_nb: float, run_kernel: float, back: float, fresh_run: float) -> dict:
    return {
        "scenarios": {
            "edit": {
                "repeat": {
                    "cells": [replay_s, run_nb, 0.0],
                    "said": [_said("replayed", replay_s / 2), _said("ran", run_kernel, back), None],
                },
                "fresh": {"cells": [1.0, fresh_run, 0.5]},
            }
        }
    }


def test_a_run_cell_splits_into_brought_back_its_own_run_and_the_kernel_work_around_it() -> None:
    raw = {"nb": {"rounds": [_round(0.02, 3.0, 2.6, 0.7, 2.0)]}}
    parts = repeat_time_parts(raw)["nb"]["edit"]
    assert parts["repeat_s"] == pytest.approx(3.02)
    assert parts["replays_s"] == pytest.approx(0.02)  # nbclient's time of a replayed cell
    assert parts["brought_back_s"] == pytest.approx(0.7)
    assert parts["own_s"] == pytest.approx(1.9)  # the kernel's duration less what it brought back
    assert parts["fresh_own_s"] == pytest.approx(2.0)  # only the cells the repeat ran
    assert parts["around_s"] == pytest.approx(0.4)


def test_rounds_give_medians_and_the_table_shows_them() -> None:
    raw = {"nb": {"rounds": [_round(0.02, 3.0, 2.6, 0.7, 2.0), _round(0.04, 5.0, 4.0, 0.9, 4.0), _round(0.03, 4.0, 3.5, 0.8, 3.0)]}}
    parts = repeat_time_parts(raw)["nb"]["edit"]
    assert parts["around_s"] == pytest.approx(0.5)
    assert parts["fresh_own_s"] == pytest.approx(3.0)
    assert "| nb / edit | 4.03 | 0.030 | 0.80 | 2.70 vs 3.00 | 0.50 |" in repeat_time_table(raw)
