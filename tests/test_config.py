"""Where settings come from: the environment, then `.env` in the current directory, then the
per-user `.env` (~/.config/rag-papers/.env), then the default; and `rag doctor` says which files it
read."""

from __future__ import annotations

import json

from rag.config import Settings, user_env_file
from rag.doctor import _settings_sources
from tests.conftest import run_cli


def _user_env(tmp_path, monkeypatch, text: str):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    path = user_env_file()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


def test_the_per_user_file_is_read_from_any_directory(tmp_path, monkeypatch):
    path = _user_env(tmp_path, monkeypatch, "RAG_TOP_K=7\nRAG_LLM_MODEL=from-user-file\n")
    assert path == tmp_path / "config" / "rag-papers" / ".env"
    monkeypatch.chdir(tmp_path)
    s = Settings()
    assert (s.top_k, s.llm_model) == (7, "from-user-file")


def test_the_current_directory_beats_the_user_file_and_the_environment_beats_both(
    tmp_path, monkeypatch
):
    _user_env(tmp_path, monkeypatch, "RAG_TOP_K=7\nRAG_LLM_MODEL=from-user-file\nRAG_MODE=bm25\n")
    project = tmp_path / "project"
    project.mkdir()
    (project / ".env").write_text("RAG_TOP_K=9\nRAG_LLM_MODEL=from-project\n")
    monkeypatch.chdir(project)
    monkeypatch.setenv("RAG_LLM_MODEL", "from-environment")
    s = Settings()
    assert (s.top_k, s.llm_model, s.mode) == (9, "from-environment", "bm25")
    assert Settings(top_k=3).top_k == 3  # a keyword (a CLI flag) beats everything


def test_doctor_names_the_files_it_read_and_the_variables_set(tmp_path, monkeypatch):
    path = _user_env(tmp_path, monkeypatch, "RAG_TOP_K=7\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-value")
    check = _settings_sources()
    assert str(path) in check.detail and "OPENAI_API_KEY" in check.detail
    assert "sk-secret-value" not in check.detail
    path.unlink()
    assert "no .env file (looked for" in _settings_sources().detail


def test_doctor_cli_reports_the_settings_check(seed_store):
    r = run_cli("doctor", "--json", "--store", str(seed_store))
    checks = {c["name"]: c for c in json.loads(r.stdout)}
    assert checks["settings"]["status"] == "ok" and "environment:" in checks["settings"]["detail"]
    assert "RAG_LLM=local" in checks["llm"]["detail"]  # how to set up a model


def test_the_larger_model_gets_snowball_stems_and_an_even_blend_unless_set():
    """What measured best per embedding model (docs/retrieval.md), and a setting always wins."""
    from rag.config import MPNET_EMBED_MODEL, Settings, dense_weight_for, keyword_stemmer_for

    assert keyword_stemmer_for("auto", MPNET_EMBED_MODEL) == "snowball"
    assert keyword_stemmer_for("auto", "all-MiniLM-L6-v2") == "light"
    assert keyword_stemmer_for("light", MPNET_EMBED_MODEL) == "light"
    assert dense_weight_for(Settings(embed_model=MPNET_EMBED_MODEL)) == 0.5
    assert dense_weight_for(Settings()) == 0.65
    assert dense_weight_for(Settings(embed_model=MPNET_EMBED_MODEL, dense_weight=0.8)) == 0.8
