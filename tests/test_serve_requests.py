"""The request checks the two serving surfaces share (`rag/serve/requests.py`): one check and one
message per argument, whichever surface is asked. The HTTP app runs in process (starlette's
TestClient drives the real ASGI app) and the MCP server through the SDK's in-memory client; neither
is a fake. A refused argument never reaches the engine, so the engine here has an empty store and
loads no model."""

from __future__ import annotations

import logging

import anyio
import pytest

from rag.cite import check_format
from rag.config import MAX_K, check_k, check_mode
from rag.errors import InputError
from rag.serve.requests import BadRequest, checked, one_line, retrieval_options


def _message(check, value) -> str:
    """What the engine's own check says about `value` (the words both surfaces must pass on)."""
    with pytest.raises(InputError) as refused:
        check(value)
    return str(refused.value)


@pytest.mark.parametrize(
    ("check", "value", "param"),
    [
        (check_k, 0, "k"),
        (check_k, MAX_K + 1, "k"),
        (check_k, "5", "k"),
        (check_mode, "fuzzy", "mode"),
        (check_format, "docx", "format"),
    ],
)
def test_a_failed_check_names_its_argument_in_the_checks_own_words(check, value, param):
    with pytest.raises(BadRequest) as refused:
        checked(check, value, param)
    assert str(refused.value) == _message(check, value) and refused.value.param == param
    # still the user's mistake wherever it is caught (CLI: exit 1)
    assert isinstance(refused.value, InputError)


def test_retrieval_options_check_what_is_given_and_leave_the_rest_to_the_settings():
    assert retrieval_options(None, None) == (None, None)
    assert retrieval_options(3, "bm25") == (3, "bm25")
    with pytest.raises(BadRequest) as refused:
        retrieval_options(3, "fuzzy")
    assert refused.value.param == "mode"


def test_one_line_folds_white_space_and_cuts_at_the_limit():
    assert one_line("a\n  b\tc\r\n", 100) == "a b c"
    cut = one_line("word " * 100, 50)
    assert len(cut) == 50 and cut.endswith("…") and "\n" not in cut


@pytest.fixture(scope="module")
def empty_rag(tmp_path_factory):
    from rag import RAG

    return RAG(store_dir=tmp_path_factory.mktemp("never-built"), llm="none")


@pytest.mark.parametrize("k", [0, MAX_K + 1])
def test_both_surfaces_refuse_a_bad_k_with_the_same_words(empty_rag, k, caplog):
    from mcp import Client
    from starlette.testclient import TestClient

    from rag.serve.http import make_app
    from rag.serve.mcp import make_mcp_server

    expected = _message(check_k, k)
    with TestClient(make_app(empty_rag, api_key="", mcp=False)) as http:
        for path, body in (
            ("/v1/search", {"query": "state space models", "k": k}),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "What is SSM?"}], "k": k},
            ),
        ):
            r = http.post(path, json=body)
            assert r.status_code == 400, r.text
            assert r.json()["error"] == {
                "message": expected,
                "type": "invalid_request_error",
                "param": "k",
                "code": "invalid_value",
            }

    async def search_papers():
        async with Client(make_mcp_server(empty_rag), read_timeout_seconds=60) as client:
            return await client.call_tool("search_papers", {"query": "state space models", "k": k})

    with caplog.at_level(logging.INFO):
        result = anyio.run(search_papers)
    assert (
        result.is_error
        and result.content[0].text == f"Error executing tool search_papers: {expected}"
    )
    # A refused argument is the caller's mistake, not a crash of the tool: no traceback in the
    # server log.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("cite", {"paper_ids": ["p1"], "format": "docx"}, _message(check_format, "docx")),
        (
            "cite",
            {"paper_ids": [" "]},
            "paper_ids is empty; pass one or more ids as returned by search_papers",
        ),
        (
            "get_paper",
            {"paper_id": "  "},
            "paper_id is empty; pass an id as returned by search_papers",
        ),
        (
            "ask",
            {"question": " \n "},
            "question is empty; pass a question about the indexed papers",
        ),
        (
            "search_papers",
            {"query": ""},
            "query is empty; pass keywords, a name or a description to search for",
        ),
    ],
    ids=["cite-format", "cite-blank-ids", "get_paper-blank-id", "ask-blank", "search_papers-blank"],
)
def test_a_refused_tool_argument_is_one_line_naming_the_fix(empty_rag, tool, arguments, expected):
    from mcp import Client

    from rag.serve.mcp import make_mcp_server

    async def call():
        async with Client(make_mcp_server(empty_rag), read_timeout_seconds=60) as client:
            return await client.call_tool(tool, arguments)

    result = anyio.run(call)
    assert result.is_error and result.content[0].text == f"Error executing tool {tool}: {expected}"
