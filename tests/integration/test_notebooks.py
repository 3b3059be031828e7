"""The notebooks execute top to bottom (offline, against the simulator) so they never rot."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="install the 'notebooks' extra to run notebooks")
nbclient = pytest.importorskip("nbclient", reason="install the 'notebooks' extra to run notebooks")

NOTEBOOKS = sorted((Path(__file__).parents[2] / "notebooks").glob("*.ipynb"))
assert NOTEBOOKS, "no notebooks found: the path to notebooks/ is wrong"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), (
        f"{path.name}: outputs must be cleared in git (in Jupyter: Edit > Clear Outputs of All Cells)"
    )
    client = nbclient.NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    client.execute()
    images = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]
    assert len(images) >= 3, f"{path.name}: expected the plots to render"
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "Traceback" not in text
