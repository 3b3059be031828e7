"""``llm-resilience demo`` tells the truth: the installed command, run short, end to end.

Its counts add up (every upstream request of every phase, at least one per answered call), it
speaks one vocabulary (ok / failed / refused), one line per phase says what to notice, a phase
shows a difference in answers (a hanging provider), and no traceback or LangChain callback
error print leaks into it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ENTRY = Path(sys.executable).parent / "llm-resilience"
CALLS = 4
PHASES = 7


def _row(text: str, label: str) -> tuple[str, str]:
    m = re.search(rf"^\| {re.escape(label)} \| (.+?) \| (.+?) \|$", text, re.M)
    assert m, f"no row {label!r} in:\n{text}"
    return m.group(1), m.group(2)


@pytest.mark.timeout(180)
def test_the_demo_counts_right_and_prints_no_errors(tmp_path: Path) -> None:
    env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost"}
    res = subprocess.run(
        [str(ENTRY), "demo", "--calls", str(CALLS)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=170,
    )
    text = res.stdout + res.stderr
    assert res.returncode == 0, text
    assert res.stderr == "", res.stderr
    assert "Traceback" not in text and "Error in" not in text
    assert not any(line.strip() == "budget_alert" for line in text.splitlines())

    # The incident side by side: both systems, the breakers' story, the spend.
    assert "| success rate |" in text and "plain Router" in text
    assert "breaker transitions (plugin):" in text
    assert "-> open" in text  # the outage opened at least one breaker
    assert "tenant spend vs" in text

    calls = _row(text, "calls")
    assert calls == (str(CALLS * PHASES), str(CALLS * PHASES))
    ok = [int(x) for x in _row(text, "ok")]
    upstream = [int(x) for x in _row(text, "upstream requests (all phases)")]
    assert upstream[0] >= ok[0] and upstream[1] >= ok[1], (ok, upstream)  # every request counted
    refused = [int(x) for x in _row(text, "refused (budget, nothing sent)")]
    failed = [int(x) for x in _row(text, "failed")]
    assert refused[0] >= 1 and refused[1] == 0
    assert ok[0] + failed[0] + refused[0] == CALLS * PHASES

    # One vocabulary: the progress says "refused" where the summary does, never "failed" for it.
    last = [line for line in text.splitlines() if "tenant budget" in line and "[" in line][-1]
    assert f"plugin: {CALLS - refused[0]} ok / 0 failed / {refused[0]} refused" in last
    assert f"refused before sending: {refused[0]} call(s) - budget tenant/day[tenant=acme]" in text

    # A phase where the difference is in the answers, not only the latency.
    hang = [line for line in text.splitlines() if "primary hangs" in line][-1]
    assert f"plugin: {CALLS} ok / 0 failed" in hang and f"plain Router: 0 ok / {CALLS} failed" in hang
    notices = [line for line in text.splitlines() if line.strip().startswith("notice:")]
    assert len(notices) == PHASES
    assert any("LiteLLM's default timeout is" in n for n in notices)
