"""Offline reasons for the standard tests that cannot run here.

langchain-tests forbids overriding its tests except to xfail them, so the skips are attached at
collection time instead (their capability flags stay off, so they would skip anyway, with a less
precise message).
"""

from __future__ import annotations

import pytest

_OFFLINE = "needs the internet: it downloads {what} from {host}, and this suite runs offline"

SKIPS = {
    "test_image_inputs": _OFFLINE.format(what="a PNG", host="raw.githubusercontent.com"),
    "test_image_tool_message": _OFFLINE.format(what="a PNG", host="raw.githubusercontent.com"),
    "test_pdf_inputs": _OFFLINE.format(what="a PDF", host="www.w3.org"),
    "test_pdf_tool_message": _OFFLINE.format(what="a PDF", host="www.w3.org"),
    "test_audio_inputs": _OFFLINE.format(what="a WAV", host="upload.wikimedia.org"),
    "test_stream_time": "benchmarks a recorded VCR cassette of a real provider; none exists offline",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "test_standard" not in item.nodeid:
            continue
        reason = SKIPS.get(item.originalname if isinstance(item, pytest.Function) else item.name)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
