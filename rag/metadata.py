"""A paper's metadata as every surface shows it: `paper_metadata(paper)` is the one place that reads
a paper's year and venue, so `rag cite`, `GET /v1/papers/{id}`, MCP `get_paper`, the map and the
UI's citations never disagree.

Records write venues loosely ("ICML 2026 Papers", "icml"), the year in its own field or only in the
venue: the venue shown is a known conference's acronym and year ("ICML 2026"), else as written; the
year is the field's, else the venue's. Nothing is made up: what the record does not say stays None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from rag.index.corpus import Paper

# Venue acronyms -> the proceedings' name; the acronym as written in the booktitle.
_VENUES: dict[str, tuple[str, str]] = {
    "icml": ("ICML", "International Conference on Machine Learning"),
    "neurips": ("NeurIPS", "Advances in Neural Information Processing Systems"),
    "nips": ("NIPS", "Advances in Neural Information Processing Systems"),
    "iclr": ("ICLR", "International Conference on Learning Representations"),
    "aistats": ("AISTATS", "International Conference on Artificial Intelligence and Statistics"),
    "colt": ("COLT", "Conference on Learning Theory"),
    "uai": ("UAI", "Conference on Uncertainty in Artificial Intelligence"),
    "alt": ("ALT", "International Conference on Algorithmic Learning Theory"),
    "acml": ("ACML", "Asian Conference on Machine Learning"),
    "cvpr": ("CVPR", "IEEE/CVF Conference on Computer Vision and Pattern Recognition"),
    "iccv": ("ICCV", "IEEE/CVF International Conference on Computer Vision"),
    "eccv": ("ECCV", "European Conference on Computer Vision"),
    "wacv": ("WACV", "IEEE/CVF Winter Conference on Applications of Computer Vision"),
    "acl": ("ACL", "Annual Meeting of the Association for Computational Linguistics"),
    "emnlp": ("EMNLP", "Conference on Empirical Methods in Natural Language Processing"),
    "naacl": (
        "NAACL",
        "Conference of the North American Chapter of the Association for Computational Linguistics",
    ),
    "coling": ("COLING", "International Conference on Computational Linguistics"),
    "colm": ("COLM", "Conference on Language Modeling"),
    "aaai": ("AAAI", "AAAI Conference on Artificial Intelligence"),
    "ijcai": ("IJCAI", "International Joint Conference on Artificial Intelligence"),
    "corl": ("CoRL", "Conference on Robot Learning"),
    "icra": ("ICRA", "IEEE International Conference on Robotics and Automation"),
    "iros": ("IROS", "IEEE/RSJ International Conference on Intelligent Robots and Systems"),
    "rss": ("RSS", "Robotics: Science and Systems"),
}
_YEAR = re.compile(r"(?<!\d)(19[5-9]\d|20\d\d)(?!\d)")


@dataclass(frozen=True)
class PaperMetadata:
    """What is known of one paper, in the forms the surfaces show."""

    paper_id: str
    title: str  # the title, or a label from the abstract when it has none
    authors: list[str] = field(default_factory=list)
    # "ICML 2026": a known conference and its year, else the venue as written
    venue: str | None = None
    year: str | None = None  # "2026"
    url: str | None = None
    venue_as_written: str | None = None  # "ICML 2026 Papers"
    # "International Conference on Machine Learning (ICML 2026)", for citations
    booktitle: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON of `GET /v1/papers/{id}` and MCP `get_paper`: {paper_id, title, authors, venue,
        year, url}."""
        return {
            "paper_id": self.paper_id,
            "title": self.title,
            "authors": list(self.authors),
            "venue": self.venue,
            "year": self.year,
            "url": self.url,
        }


def paper_metadata(paper: Paper) -> PaperMetadata:
    """The paper's metadata, its year and venue read the one way every surface shows them."""
    venue = _clean(paper.venue) or None
    year_match = _YEAR.search(_clean(paper.year)) or _YEAR.search(venue or "")
    year = year_match.group(1) if year_match else None
    booktitle = short_venue = venue
    known = _known_venue(venue)
    if known:
        acronym, name = known
        short_venue = f"{acronym} {year}" if year else acronym
        booktitle = f"{name} ({short_venue})"
    return PaperMetadata(
        paper_id=paper.paper_id,
        title=_clean(paper.display_title),
        authors=[_clean(a) for a in paper.authors if _clean(a)],
        venue=short_venue,
        year=year,
        url=_clean(paper.url) or None,
        venue_as_written=venue,
        booktitle=booktitle,
    )


def _clean(text: str | None) -> str:
    return " ".join(str(text or "").split())


def _known_venue(venue: str | None) -> tuple[str, str] | None:
    """A conference's proceedings when the venue names one (not one of its workshops)."""
    words = re.findall(r"[a-z]+", (venue or "").lower())
    if "workshop" in words or "workshops" in words:
        return None
    for word in words:
        if word in _VENUES:
            return _VENUES[word]
    return None
