"""One paper, one set of metadata: `rag.metadata.paper_metadata` reads the year and venue, and the
HTTP API, the MCP tools, `rag cite` (BibTeX, RIS, markdown) and the map all show what it read."""

from __future__ import annotations

import json

import anyio
import pytest

from rag.index.corpus import Paper
from rag.metadata import paper_metadata
from tests.conftest import run_cli

# venue "ICML 2026 Papers", no year field: the case the surfaces disagreed on
PALIMPSA = "wKMV7mXjUr"


@pytest.mark.parametrize(
    "venue, year, shown, booktitle",
    [
        (
            "ICML 2026 Papers",
            None,
            ("ICML 2026", "2026"),
            "International Conference on Machine Learning (ICML 2026)",
        ),
        (
            "NeurIPS",
            "2019",
            ("NeurIPS 2019", "2019"),
            "Advances in Neural Information Processing Systems (NeurIPS 2019)",
        ),
        (
            "ICML 2026 Papers",
            "2025",
            ("ICML 2025", "2025"),
            "International Conference on Machine Learning (ICML 2025)",
        ),
        (
            "ICML 2026 Workshop on Stuff",
            None,
            ("ICML 2026 Workshop on Stuff", "2026"),
            "ICML 2026 Workshop on Stuff",
        ),
        (
            "Journal of Odd Results",
            None,
            ("Journal of Odd Results", None),
            "Journal of Odd Results",
        ),
        (
            "iclr",
            None,
            ("ICLR", None),
            "International Conference on Learning Representations (ICLR)",
        ),
        (None, None, (None, None), None),
    ],
)
def test_year_and_venue_are_read_one_way(venue, year, shown, booktitle):
    meta = paper_metadata(
        Paper("p1", "A  Title", authors=[" Ada Lovelace ", ""], venue=venue, year=year)
    )
    assert (meta.venue, meta.year) == shown and meta.booktitle == booktitle
    assert meta.title == "A Title" and meta.authors == ["Ada Lovelace"]
    assert meta.to_dict() == {
        "paper_id": "p1",
        "title": "A Title",
        "authors": ["Ada Lovelace"],
        "venue": shown[0],
        "year": shown[1],
        "url": None,
    }


def test_every_surface_gives_the_same_metadata(seed_rag, seed_store):
    from mcp import Client
    from starlette.testclient import TestClient

    from rag.cite import format_citations
    from rag.paper_map.layout import map_data
    from rag.serve.http import make_app
    from rag.serve.mcp import make_mcp_server

    (paper,) = seed_rag.papers([PALIMPSA])
    expected = paper_metadata(paper).to_dict()
    assert (expected["venue"], expected["year"]) == ("ICML 2026", "2026")

    with TestClient(make_app(seed_rag, api_key="", mcp=False)) as http:
        assert http.get(f"/v1/papers/{PALIMPSA}").json() == expected

    async def get_paper():
        async with Client(make_mcp_server(seed_rag), read_timeout_seconds=60) as client:
            result = await client.call_tool("get_paper", {"paper_id": PALIMPSA})
            assert not result.is_error, result
            return json.loads(result.content[0].text)

    assert anyio.run(get_paper) == expected

    ris = run_cli("cite", PALIMPSA, "--format", "ris", "--store", str(seed_store))
    assert ris.returncode == 0, ris.stderr
    tags = dict(line.split("  - ", 1) for line in ris.stdout.splitlines() if "  - " in line)
    assert tags["PY"] == expected["year"] and tags["UR"] == expected["url"]
    assert tags["T2"] == f"International Conference on Machine Learning ({expected['venue']})"
    markdown = format_citations([paper], "markdown")
    assert f"({expected['year']})." in markdown and f" {expected['venue']}." in markdown
    assert "year = {2026}" in format_citations([paper], "bibtex")

    data = map_data(seed_rag.store, seed_rag.paper_map())["papers"]
    i = data["ids"].index(PALIMPSA)
    assert (data["venues"][i], data["years"][i], data["urls"][i]) == (
        expected["venue"],
        expected["year"],
        expected["url"],
    )
    assert data["authors"][i] == ", ".join(expected["authors"])
