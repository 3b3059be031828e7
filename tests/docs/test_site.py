"""The built documentation site: no raw reST roles on any page, API cross-references that link,
nothing fetched from the web, and no shipped feature called planned."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs", reason="install the 'docs' extra to build the site")

# Under pytest-xdist (scripts/test.sh) this file's tests stay on one worker: one site build, not one
# per worker that gets a test.
pytestmark = pytest.mark.xdist_group("docs-site")

ROOT = Path(__file__).resolve().parents[2]
RAW_ROLE = re.compile(r":(?:py:)?(?:class|meth|func|data|mod|attr|exc|obj|const):`?")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=300,
    )
    pages = {str(p.relative_to(out)): p.read_text(encoding="utf-8") for p in out.rglob("*.html")}
    assert any(name.startswith("api/") for name in pages), "the API reference was not built"
    return pages


def _text(page: str) -> str:
    """The page's visible text without the search index and scripts."""
    return re.sub(r"<script.*?</script>", "", page, flags=re.DOTALL)


def test_no_raw_rest_roles(site: dict[str, str]) -> None:
    raw = {
        name: sorted(set(RAW_ROLE.findall(_text(page))))
        for name, page in site.items()
        if RAW_ROLE.search(_text(page))
    }
    assert raw == {}


def test_roles_became_links_to_the_reference(site: dict[str, str]) -> None:
    routing = site["api/routing/index.html"]
    # ResilientRouter's docstring names RouterSpec and CostGuard with :class: roles.
    link = r'<a class="autorefs autorefs-internal"[^>]*href="\.\./policy/#[^"]*RouterSpec"'
    assert re.search(link, routing)
    links = sum(page.count('class="autorefs autorefs-internal"') for page in site.values())
    assert links > 50


def test_pages_fetch_no_web_fonts(site: dict[str, str]) -> None:
    fetching = [name for name, page in site.items() if "fonts.googleapis" in page or "fonts.gstatic" in page]
    assert fetching == []


def test_shipped_exporters_are_not_called_planned(site: dict[str, str]) -> None:
    for name in ("index.html", "observability/index.html"):
        assert "planned" not in _text(site[name]), name
