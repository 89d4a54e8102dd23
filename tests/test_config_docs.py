"""`.env.example` and `docs/configuration.md` are written from `Settings` (rag/config_docs.py): the
checked-in files must equal what the code writes, so a setting added or re-described without running
`python -m rag.config_docs` fails here."""

from __future__ import annotations

from rag import config_docs
from rag.config import Settings


def test_checked_in_files_match_the_settings():
    for path, make in config_docs.TARGETS.items():
        assert path.read_text(encoding="utf-8") == make(), (
            f"{path.name} is stale: run python -m rag.config_docs"
        )


def test_every_setting_is_described_with_its_variable_in_both_files():
    env, page = config_docs.env_example(), config_docs.configuration_markdown()
    for name, field in Settings.model_fields.items():
        assert (field.description or "").strip(), f"Settings.{name} has no description"
        variable = config_docs.variables(name, field)[0]
        assert f"# {variable}=" in env
        assert f"`{variable}`" in page


def test_check_names_a_stale_file_and_fails(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "env"
    stale.write_text("# RAG_TOP_K=5\n")
    monkeypatch.setattr(config_docs, "TARGETS", {stale: config_docs.env_example})
    assert config_docs.main(["--check"]) == 1
    assert "env differ from rag/config.py" in capsys.readouterr().err
    assert config_docs.main([]) == 0 and config_docs.main(["--check"]) == 0
