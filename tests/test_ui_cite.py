"""The chat's citation export: the file route serves only the BibTeX files Gradio cached, and a
browser downloads the last answer's citations (tests of `rag.ui.app.citations_file`'s use; the
function itself is tested in tests/test_cite.py, which imports no Gradio)."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from tests.test_cite import field, parse_bibtex, unlatex
from tests.test_ui import (  # noqa: F401
    DEADLINE_MS,
    QUESTION,
    ask,
    assert_loopback_only,
    fake,
    needs_browser,
    open_page,
    real_url,
    send,
    wait_turn,
)

pytestmark = pytest.mark.slow  # the fast tier skips this file without importing it


def test_the_file_route_serves_only_bib_files_from_gradios_cache(fake):
    cache = Path(fake.demo.app.uploaded_file_dir)
    folder = cache / f"test-{uuid.uuid4().hex}"
    folder.mkdir(parents=True)
    (folder / "citations.bib").write_text("@misc{a,\n  title = {A}\n}\n")
    (folder / "other.txt").write_text("secret")
    outside = Path(fake.demo.app.uploaded_file_dir).parent / f"outside-{uuid.uuid4().hex}.bib"
    outside.write_text("@misc{b}")
    try:
        with httpx.Client(trust_env=False, timeout=30) as c:
            base = fake.url + "gradio_api/file="
            ok = c.get(base + str(folder / "citations.bib"))
            assert ok.status_code == 200 and ok.text.startswith("@misc{a,")
            assert c.head(base + str(folder / "citations.bib")).status_code == 200
            for path in (
                str(folder / "other.txt"),
                str(outside),
                "/etc/passwd",
                str(folder / "../../etc/x.bib"),
                str(folder / "missing.bib"),
                str(folder),
                "http://127.0.0.1:9/x.bib",
            ):
                r = c.get(base + path)
                assert r.status_code == 404 and "Not Found" in r.text, (path, r.status_code)
            # Gradio's older file route and uploads stay closed.
            assert (
                c.get(fake.url + "gradio_api/file/" + str(folder / "citations.bib")).status_code
                == 404
            )
    finally:
        for f in (folder / "citations.bib", folder / "other.txt", outside):
            f.unlink(missing_ok=True)
        folder.rmdir()


def _cited_ids_on_page(page) -> list[str]:
    metas = page.locator("#sources .src-card:not(.src-uncited) .src-meta").all_inner_texts()
    return [m.rsplit("·", 1)[1].strip() for m in metas]


def _download_bib(page, tmp_path: Path, name: str) -> str:
    button = page.locator("#export-bib")
    button.wait_for(state="visible", timeout=DEADLINE_MS)
    assert button.inner_text().strip() == "Export citations (BibTeX)"
    with page.expect_download(timeout=DEADLINE_MS) as info:
        button.click()
    download = info.value
    assert download.suggested_filename == "citations.bib"
    target = tmp_path / name
    download.save_as(target)
    return target.read_text(encoding="utf-8")


@needs_browser
def test_browser_exports_the_last_answers_citations_as_bibtex(
    browser, real_url, seed_titles, tmp_path
):
    page, _ = open_page(browser, real_url)
    assert not page.locator("#export-bib").is_visible()  # nothing to export before an answer
    ask(page, QUESTION)
    cited = _cited_ids_on_page(page)
    assert cited, "the answer cites no paper"
    entries = parse_bibtex(_download_bib(page, tmp_path, "first.bib"))
    assert [unlatex(field(e, "title")) for e in entries] == [seed_titles[i] for i in cited]
    assert all(
        field(e, "url") == f"https://openreview.net/forum?id={i}" for e, i in zip(entries, cited)
    )
    # The next answer replaces the download: it is hidden while that answer comes, then holds its
    # papers.
    send(page, "Which papers study backdoor attacks on language models?")
    wait_turn(page, 2)
    second = _cited_ids_on_page(page)
    assert second and second != cited
    entries = parse_bibtex(_download_bib(page, tmp_path, "second.bib"))
    assert [unlatex(field(e, "title")) for e in entries] == [seed_titles[i] for i in second]
    assert_loopback_only(page, real_url)
    page.locator("#clear").click()
    page.locator("#export-bib").wait_for(state="hidden", timeout=DEADLINE_MS)
    page.close()
