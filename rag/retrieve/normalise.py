"""The question as the papers write it, before retrieval and the answer rules read it: links and
quote marks around words out, a question typed in capitals lowered, and a word typed in lower case
written as the papers write it when they write it as a name ("what is palimpsa" asks about
Palimpsa; "lora" is LoRA). The rules that find what a question names read capitals, so without
this "What is palimpsa?" was refused while "What is Palimpsa?" was answered.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING

from rag.index.keyword import name_like_words

if TYPE_CHECKING:
    from rag.index.store import Store

_URL = re.compile(r"\b(?:https?://|www\.)\S{1,2000}", re.I)
# Quote marks around a word or phrase ('What is "Palimpsa"?'), straight or typographic; an
# apostrophe inside a word ("Palimpsa's") stays.
_OPEN, _CLOSE = "\"'\u2018\u201c`", "\"'\u2019\u201d`"
_QUOTED = re.compile(rf"(?<!\w)[{_OPEN}]{{1,2}}([^{_CLOSE}]{{1,200}})[{_CLOSE}]{{1,2}}(?!\w)")
_WORD = re.compile(r"(?<![\w-])[a-z][a-z0-9-]{3,60}(?![\w-])")  # a whole word in lower case
_LAST_WORD = re.compile(r"([A-Za-z][\w-]{0,30})[^\w.!?]{0,3}$")
_FIRST_WORD = re.compile(r"[^\w.!?]{0,3}([A-Za-z][\w-]{0,30})")
RARE_CHUNKS = 24  # a word in more chunks is common: left as typed (the rules read rare names)


def normalise(question: str, store: Store) -> str:
    """`question` with links and quote marks out, capitals lowered when it is typed all in them, and
    its lower-case words written as the papers write them when that is as a name."""
    text = _QUOTED.sub(r"\1", _URL.sub(" ", question))
    if not any(c.islower() for c in text) and sum(c.isupper() for c in text) > 3:
        text = text.lower()  # "WHAT IS PALIMPSA?": every word looked like a name
    text = " ".join(_WORD.sub(lambda m: _as_written(m.group(0), store), text).split())
    return text if text.strip(" ?.!") else question


def _as_written(word: str, store: Store) -> str:
    """How the papers write `word`, when it is rare and they never write it in lower case: as the
    name their uses spell most (mid-sentence capitals, an inner capital or a digit), else as it was
    typed. A capitalised word inside a run of them ("Group Relative Policy Optimization") is part of
    a longer name, not a name of its own."""
    keys = store.keyword_index().rare_keys(word, RARE_CHUNKS)
    if not keys:
        return word
    forms: Counter[str] = Counter()
    pattern = re.compile(rf"(?<![\w-]){re.escape(word)}(?![\w-])", re.I)
    # The abstracts' prose, not their titles (a title capitalises every word) nor their links (a
    # repository path writes "github.com/x/defacto" for DeFacto).
    for abstract in {_URL.sub(" ", c.abstract) for c in store.chunks_by_rowid(keys).values()}:
        names = {w for w in name_like_words(abstract) if w.lower() == word}
        for m in pattern.finditer(abstract):
            form = m.group(0)
            if form.islower():
                return word  # "transformers" as well as "Transformers": a word, not only a name
            if form in names and (form[1:] != form[1:].lower() or not _in_capitalised_run(m)):
                forms[form] += 1
    return forms.most_common(1)[0][0] if forms else word


def _in_capitalised_run(m: re.Match) -> bool:
    """Whether the word next to the match on either side is capitalised too."""
    text = m.string
    before = _LAST_WORD.search(text, max(0, m.start() - 40), m.start())
    after = _FIRST_WORD.match(text, m.end(), m.end() + 40)
    return any(w is not None and w.group(1)[0].isupper() for w in (before, after))
