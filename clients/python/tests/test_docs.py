"""The Python examples of docs/clients.md, run as a reader would paste them, against the server."""
from __future__ import annotations

import contextlib
import io
import os
import re

import pytest

from dispatch_client import Client, DispatchError

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "clients.md")


def examples() -> list:
    with open(DOC) as f:
        blocks = re.findall(r"^```python\n(.*?)^```", f.read(), re.S | re.M)
    # Scripts (a #! line) are recipes with arguments: RecipesTests runs them.
    return [b for b in blocks if not b.startswith("#!")]


@pytest.mark.parametrize("index", range(len(examples())))
def test_example_runs(index: int, server: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    code = examples()[index]
    monkeypatch.setenv("DISPATCH_URL", server[0])
    monkeypatch.setenv("DISPATCH_TOKEN", server[1])
    if "client.batch(" in code:
        try:
            Client().batch([])
        except DispatchError as e:
            if e.status in (404, 405):
                pytest.skip(f"this server has no POST /v1/changes yet (answered {e.status} {e.code})")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, f"docs/clients.md example {index}", "exec"), {"__name__": "__main__"})
    printed = out.getvalue()
    # What the comments in the examples say they print.
    for expected in re.findall(r"# (?:\.\.\. )?([\w\[\]\d, ]+?)$", code, re.M):
        if expected.strip() and expected.startswith(("[", "409", "completed")):
            assert expected.strip() in printed, (expected, printed)
    assert printed, "each example prints something"


def test_there_are_examples() -> None:
    assert len(examples()) >= 3
