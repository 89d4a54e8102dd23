"""Load on the browser chat: many concurrent chat sessions against the running Gradio UI.

    python -m bench.serving.load [--store DIR] [--sessions 20] [--questions 3]
                          [--llm-url http://127.0.0.1:PORT/v1 [--llm-model NAME] [--llm-sessions 5]
                           [--llm-questions 2] [--context-tokens 400] [--max-tokens 32]]
                          [--json FILE]

Each run serves `rag ui` in its own process (extractive: RAG_LLM=none; LLM: the OpenAI-compatible
server at --llm-url) and drives it through `gradio_client`, the way a browser's Gradio frontend
does: one `Client` per session (its own session hash, so its own server-side chat state), all
sessions released at once by a barrier, each asking its questions in sequence through the chat's
submit endpoint (`/respond`: message, chat, k, mode) and passing its own chat back each turn.

Every session's questions carry a unique tag word; session 1 asks about seed paper 1, session 2
about paper 2, ... and follows up with "what about its results?" and "how is it evaluated?". Each
answer is checked: complete (no streaming cursor, no error), with the expected structure (extractive
label, linked [n] markers and references, or the abstention), attached to the right session (its
chat and sources panel carry its own questions only, never another session's tag) and, extractive,
citing the session's own paper for the first question and the first follow-up (which needs the
session's own history on the server).

Printed: answers, wall time, throughput (answers/s) and latency p50/p95/max per answer (submit ->
final message), with the machine's load average. The driver is also imported by tests/test_load.py.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench.helpers import REPO, machine_load, percentile, write_json
from tests.harness import free_port, popen_logged, stop_process, wait_http_ready

CURSOR = "\u258c"
FOLLOW_UPS = ("what about its results?", "how is it evaluated?", "what are its limitations?")
EXTRACTIVE_LABEL = "Quoted word for word from the abstracts"
REFUSAL = "The indexed papers don't answer this question."


# ---------------------------------------------------------------- sessions


@dataclass
class Script:
    """What one session asks: a tag word unique to it, its topic paper and its questions."""

    tag: str
    paper_id: str
    title: str
    questions: list[str]


@dataclass
class Turn:
    question: str
    latency: float = 0.0  # seconds, submit -> final outputs
    chat: list[dict] = field(default_factory=list)  # [{role, text}] as the UI returned it
    sources: str = ""  # the sources panel HTML
    pick: object = None  # the "Sources for answer" selector update
    error: str | None = None


@dataclass
class SessionResult:
    script: Script
    turns: list[Turn] = field(default_factory=list)
    finished: float = 0.0  # perf_counter() when its last answer arrived


def seed_topics() -> list[tuple[str, str]]:
    """(openreview id, title) of the seed papers, in corpus order."""
    rows = [
        json.loads(line)
        for line in (REPO / "corpus/seed_metadata.jsonl").read_text("utf-8").splitlines()
        if line.strip()
    ]
    return [(r["openreview_url"].split("id=")[1], " ".join(r["title"].split())) for r in rows]


def make_scripts(sessions: int, questions: int) -> list[Script]:
    topics = seed_topics()
    if sessions > len(topics):
        raise SystemExit(f"at most {len(topics)} sessions (one seed paper each)")
    if not 1 <= questions <= 1 + len(FOLLOW_UPS):
        raise SystemExit(f"--questions must be 1..{1 + len(FOLLOW_UPS)}")
    scripts = []
    for i, (pid, title) in enumerate(topics[:sessions]):
        # A word found in no abstract; first, so the panel's short label keeps it. Lower-case
        # letters only: written like a name ("tagw08q") it would be a name no paper mentions, and
        # the engine rightly abstains on a question about one.
        tag = "tag" + "".join("abcdefghij"[int(d)] for d in f"{i:02d}") + "q"
        asked = [f"{tag}: What does the paper “{title}” propose?"]
        asked += [f"{tag}: {f}" for f in FOLLOW_UPS[: questions - 1]]
        scripts.append(Script(tag, pid, title, asked))
    return scripts


def _text(message: dict) -> str:
    content = message.get("content")
    if isinstance(content, list):  # Gradio 6: [{"type": "text", "text": ...}, ...]
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def run_session(
    url: str,
    script: Script,
    start: threading.Barrier | None = None,
    k: int = 5,
    mode: str = "hybrid",
    timeout: float = 300.0,
) -> SessionResult:
    """One browser-like session: its own Client, its questions in sequence, its chat passed back."""
    from gradio_client import Client

    result = SessionResult(script)
    client = Client(url, verbose=False, download_files=False)
    try:
        if start is not None:
            start.wait(timeout=120)
        chat: list = []
        for question in script.questions:
            turn = Turn(question)
            result.turns.append(turn)
            t0 = time.perf_counter()
            try:
                job = client.submit(question, chat, k, mode, api_name="/respond")
                _, new_chat, sources, pick, _download = job.result(timeout=timeout)
            # recorded and reported: a load run must not stop at the first one
            except Exception as exc:
                turn.latency = time.perf_counter() - t0
                turn.error = f"{type(exc).__name__}: {exc}"
                break
            turn.latency = time.perf_counter() - t0
            if not isinstance(new_chat, list):
                turn.error = f"chat output is {type(new_chat).__name__}, not a list"
                break
            chat = new_chat
            turn.chat = [{"role": m.get("role"), "text": _text(m)} for m in new_chat]
            turn.sources = sources if isinstance(sources, str) else ""
            turn.pick = pick
        result.finished = time.perf_counter()
    finally:
        client.close()
    return result


def run_load(
    url: str, scripts: list[Script], k: int = 5, mode: str = "hybrid", timeout: float = 300.0
) -> tuple[list[SessionResult], float]:
    """All sessions at once (released together); returns their results and the wall time."""
    start = threading.Barrier(len(scripts) + 1)
    with ThreadPoolExecutor(max_workers=len(scripts)) as pool:
        futures = [pool.submit(run_session, url, s, start, k, mode, timeout) for s in scripts]
        start.wait(timeout=120)
        t0 = time.perf_counter()
        results = [f.result() for f in futures]
    # wall: release -> last answer (not the clients' shutdown)
    end = max((r.finished for r in results if r.finished), default=time.perf_counter())
    return results, end - t0


# ---------------------------------------------------------------- checks


def check_session(result: SessionResult, all_tags: list[str], llm: bool) -> list[str]:
    """Everything wrong with one session's answers (empty when all is well)."""
    from rag.ui.render import md_math, md_text

    s = result.script
    others = [t for t in all_tags if t != s.tag]
    problems: list[str] = []
    if len(result.turns) != len(s.questions):
        problems.append(f"{s.tag}: {len(result.turns)} of {len(s.questions)} questions were asked")
    for n, turn in enumerate(result.turns, 1):
        where = f"{s.tag} turn {n}"
        if turn.error:
            problems.append(f"{where}: {turn.error}")
            continue
        chat = turn.chat
        if len(chat) != 2 * n:
            problems.append(f"{where}: chat has {len(chat)} messages, expected {2 * n}")
            continue
        if [m["role"] for m in chat] != ["user", "assistant"] * n:
            problems.append(f"{where}: roles {[m['role'] for m in chat]}")
        for j in range(n):  # the session's own questions, in order, as the UI shows them
            if chat[2 * j]["text"] != md_math(s.questions[j]):
                problems.append(
                    f"{where}: user message {j + 1} is {chat[2 * j]['text'][:80]!r}, "
                    f"not {s.questions[j][:80]!r}"
                )
        reply = chat[-1]["text"]
        if CURSOR in reply:
            problems.append(f"{where}: answer still streaming: {reply[:80]!r}")
        if reply.startswith("⚠") or "LLM failed" in reply:
            problems.append(f"{where}: error reply: {reply[:200]!r}")
        abstained = reply.startswith(md_text(REFUSAL))
        if llm:
            if not reply.strip():
                problems.append(f"{where}: empty answer")
        elif not abstained and not (
            reply.startswith(EXTRACTIVE_LABEL)
            and "**References**" in reply
            and 'class="cite' in reply
        ):
            problems.append(
                f"{where}: not an extractive answer with linked references: {reply[:120]!r}"
            )
        if not llm and n <= 2 and f"id={s.paper_id}" not in reply:
            problems.append(
                f"{where}: does not cite the session's paper {s.paper_id} ({s.title[:50]})"
            )
        if f'data-turn="{n}"' not in turn.sources or s.tag not in turn.sources:
            problems.append(f"{where}: sources panel is not this turn's: {turn.sources[:160]!r}")
        if "Finding sources" in turn.sources:
            problems.append(f"{where}: sources panel still waiting")
        pick = turn.pick.get("value") if isinstance(turn.pick, dict) else turn.pick
        if pick != n:
            problems.append(f"{where}: sources selector is at {pick!r}, expected {n}")
        everything = " ".join(m["text"] for m in chat) + turn.sources
        leaked = [t for t in others if t in everything]
        if leaked:
            problems.append(f"{where}: shows other sessions' questions: {leaked}")
    return problems


def check_all(results: list[SessionResult], llm: bool) -> list[str]:
    tags = [r.script.tag for r in results]
    return [p for r in results for p in check_session(r, tags, llm)]


def summarize(results: list[SessionResult], wall: float) -> dict:
    latencies = [t.latency for r in results for t in r.turns if not t.error]
    errors = sum(1 for r in results for t in r.turns if t.error)
    return {
        "sessions": len(results),
        "answers": len(latencies),
        "errors": errors,
        "wall_s": round(wall, 3),
        "answers_per_s": round(len(latencies) / wall, 3) if wall > 0 else None,
        "latency_p50_s": round(percentile(latencies, 50), 3),
        "latency_p95_s": round(percentile(latencies, 95), 3),
        "latency_max_s": round(max(latencies), 3) if latencies else None,
        "latency_mean_s": round(statistics.fmean(latencies), 3) if latencies else None,
    }


# ---------------------------------------------------------------- the UI in its own process


def _rag_exe() -> str:
    cand = Path(sys.executable).parent / "rag"
    return str(cand) if cand.exists() else "rag"


class UIServer:
    """`rag ui --store DIR` on a free loopback port, in its own process group."""

    def __init__(self, store: Path, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        clean = {k: v for k, v in os.environ.items() if not k.startswith(("RAG_", "OPENAI_"))}
        full_env = {
            **clean,
            "GRADIO_ANALYTICS_ENABLED": "False",
            "ANONYMIZED_TELEMETRY": "False",
            "HF_HUB_OFFLINE": "1",
            **env,
        }
        self.log = log
        self.proc = popen_logged(
            [
                _rag_exe(),
                "ui",
                "--store",
                str(store),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            log,
            full_env,
            REPO,
        )

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Until /config answers; raises with the log's tail when `rag ui` dies or is not up in
        time."""
        wait_http_ready(self.proc, self.url + "config", self.log, timeout, interval=0.2)

    def stop(self) -> None:
        stop_process(self.proc, timeout=15)


def _llm_model(base_url: str) -> str:
    import httpx

    r = httpx.get(base_url.rstrip("/") + "/models", timeout=10, trust_env=False)
    r.raise_for_status()
    return r.json()["data"][0]["id"]


def bench(
    label: str,
    store: Path,
    env: dict[str, str],
    sessions: int,
    questions: int,
    llm: bool,
    workdir: Path,
    warmups: int = 1,
) -> dict:
    server = UIServer(store, env, workdir / f"ui-{label}.log")
    try:
        server.wait_ready()
        warm = make_scripts(1, 1)[0]
        for _ in range(warmups):  # first question loads the embedder (and the LLM connection)
            run_session(server.url, warm)
        scripts = make_scripts(sessions, questions)
        results, wall = run_load(server.url, scripts)
    finally:
        server.stop()
    problems = check_all(results, llm)
    summary = {
        "run": label,
        "questions_per_session": questions,
        **summarize(results, wall),
        "problems": problems,
    }
    return summary


def _print(summary: dict) -> None:
    print(
        f"{summary['run']}: {summary['sessions']} sessions x {summary['questions_per_session']}"
        f" questions: {summary['answers']} answers, {summary['errors']} errors in"
        f" {summary['wall_s']:.2f} s -> {summary['answers_per_s']:.2f} answers/s; latency p50"
        f" {summary['latency_p50_s']:.2f} s, p95 {summary['latency_p95_s']:.2f} s, max"
        f" {summary['latency_max_s']:.2f} s ({machine_load()})"
    )
    for p in summary["problems"][:20]:
        print(f"  problem: {p}")
    if len(summary["problems"]) > 20:
        print(f"  ... and {len(summary['problems']) - 20} more problems")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--store", type=Path, help="a built store (default: a fresh one from corpus/ in a temp dir)"
    )
    ap.add_argument("--sessions", type=int, default=20)
    ap.add_argument(
        "--questions", type=int, default=3, help="questions per session (1 + follow-ups)"
    )
    ap.add_argument("--no-extractive", action="store_true", help="skip the extractive run")
    ap.add_argument("--llm-url", help="OpenAI-compatible base url (…/v1), e.g. a llama.cpp server")
    ap.add_argument("--llm-model", help="model name (default: the first of /v1/models)")
    ap.add_argument("--llm-sessions", type=int, default=5)
    ap.add_argument("--llm-questions", type=int, default=2)
    ap.add_argument("--context-tokens", type=int, default=400, help="RAG_LLM_CONTEXT_TOKENS")
    ap.add_argument("--max-tokens", type=int, default=32, help="RAG_LLM_MAX_TOKENS")
    ap.add_argument("--json", type=Path, help="write the summaries here")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="rag-load-") as tmp:
        workdir = Path(tmp)
        store = args.store
        if store is None:
            store = workdir / "store"
            t0 = time.perf_counter()
            subprocess.run(
                [_rag_exe(), "ingest", "--store", str(store)],
                check=True,
                cwd=REPO,
                capture_output=True,
                env={**os.environ, "HF_HUB_OFFLINE": "1"},
            )
            print(f"built a seed store in {time.perf_counter() - t0:.1f} s")
        summaries = []
        if not args.no_extractive:
            summaries.append(
                bench(
                    "extractive",
                    store,
                    {"RAG_LLM": "none"},
                    args.sessions,
                    args.questions,
                    False,
                    workdir,
                )
            )
            _print(summaries[-1])
        if args.llm_url:
            model = args.llm_model or _llm_model(args.llm_url)
            env = {
                "RAG_LLM": "openai",
                "OPENAI_BASE_URL": args.llm_url,
                "RAG_LLM_MODEL": model,
                "RAG_LLM_CONTEXT_TOKENS": str(args.context_tokens),
                "RAG_LLM_MAX_TOKENS": str(args.max_tokens),
            }
            summaries.append(
                bench(
                    f"llm ({model})",
                    store,
                    env,
                    args.llm_sessions,
                    args.llm_questions,
                    True,
                    workdir,
                )
            )
            _print(summaries[-1])
    if args.json:
        write_json(args.json, summaries)
    return 1 if any(s["problems"] for s in summaries) else 0


if __name__ == "__main__":
    sys.exit(main())
