"""A reference translator for the `synthetic_translation` grammar (tests only).

Every surface form of each language of `bert_jax.data.synthetic_translation` is
distinct (checked at import here), so a source sentence parses word by word
(the grammar is LL(1)): `translate(source)` parses S and renders T, the one
correct translation.
"""

from __future__ import annotations

from bert_jax.data.synthetic_translation import (  # noqa: F401
    ADJECTIVES, CONJUNCTIONS, DEFINITE_ARTICLES, GENDERS, INDEFINITE_ARTICLES, NOUNS,
    NUMBERS, PREPOSITIONS, PUNCTUATION, SOURCE_DEFINITE, SOURCE_INDEFINITE, SOURCE_NP_AND,
    SOURCE_PAST, SOURCE_PLURAL_SUFFIX, SUBORDINATORS, TARGET_NP_AND, TENSES, VERBS, Clause,
    NounPhrase, PrepPhrase, SOURCE_WORDS, Sentence, render_target, target_adjective,
    target_noun, target_verb)


def _target_words() -> dict[str, tuple]:
    """Every T surface form -> what it is; raises if two forms coincide."""
    table: dict[str, tuple] = {}

    def add(form, what, shared_ok=False):
        clash = form in table and not (shared_ok and table[form] == what)
        if form in PUNCTUATION or clash:
            raise RuntimeError(f"synthetic_translation: target form {form!r} is "
                               f"both {table.get(form, 'punctuation')} and {what}")
        table[form] = what

    for (g, n), form in DEFINITE_ARTICLES.items():
        add(form, ("det", True, g, n))
    for (g, n), form in INDEFINITE_ARTICLES.items():
        add(form, ("det", False, g, n))
    for i in range(len(NOUNS)):
        add(target_noun(i, False), ("noun", i, False))
        add(target_noun(i, True), ("noun", i, True))
    for i in range(len(ADJECTIVES)):
        for g in GENDERS:
            for n in NUMBERS:
                add(target_adjective(i, g, n), ("adj", i, g, n))
    for i in range(len(VERBS)):
        for t in TENSES:
            for n in NUMBERS:
                add(target_verb(i, t == "past", n), ("verb", i, t == "past", n))
    for kind, words in (("prep", PREPOSITIONS), ("sub", SUBORDINATORS)):
        for i, w in enumerate(words):
            add(w.target, (kind, i))
    add(CONJUNCTIONS[0].target, ("and",))
    add(TARGET_NP_AND, ("and",), shared_ok=True)
    add(CONJUNCTIONS[1].target, ("conj", 1))
    return table


TARGET_WORDS = _target_words()   # checked at import: all T forms distinct


class _Parser:
    def __init__(self, source: str):
        self.tokens = source.split()
        self.pos = 0
        self.source = source

    def peek(self) -> tuple:
        if self.pos >= len(self.tokens):
            return ("end",)
        tok = self.tokens[self.pos]
        if tok in PUNCTUATION:
            return (tok,)
        if tok not in SOURCE_WORDS:
            self.fail(f"unknown word {tok!r}")
        return SOURCE_WORDS[tok]

    def take(self, kind: str) -> tuple:
        what = self.peek()
        if what[0] != kind:
            self.fail(f"expected {kind}, found {what[0]}")
        self.pos += 1
        return what

    def fail(self, why: str):
        raise ValueError(f"synthetic_translation: cannot parse source sentence at "
                         f"token {self.pos} ({why}): {self.source!r}")

    def np(self, allow_modifier: bool) -> NounPhrase:
        definite = self.take("det")[1]
        _, noun, plural = self.take("noun")
        adjectives = []
        while self.peek()[0] == "adj":
            adjectives.append(self.take("adj")[1])
        modifier = None
        if allow_modifier and self.peek()[0] == "prep":
            modifier = self.pp()
        return NounPhrase(noun, plural, definite, tuple(adjectives), modifier)

    def pp(self) -> PrepPhrase:
        return PrepPhrase(self.take("prep")[1], self.np(allow_modifier=False))

    def clause(self, connector) -> Clause:
        subject = [self.np(allow_modifier=True)]
        if self.peek()[0] == "np_and":
            self.pos += 1
            subject.append(self.np(allow_modifier=True))
        past = self.peek()[0] == "past"
        if past:
            self.pos += 1
        verb = self.take("verb")[1]
        obj = self.np(allow_modifier=False) if VERBS[verb].transitive else None
        pps = []
        while self.peek()[0] == "prep":
            pps.append(self.pp())
        return Clause(tuple(subject), verb, past, obj, tuple(pps), connector)

    def sentence(self) -> Sentence:
        clauses = [self.clause(None)]
        while self.peek()[0] == ",":
            self.pos += 1
            kind, *rest = self.peek()
            if kind not in ("sub", "conj"):
                self.fail("expected a subordinator or a conjunction after ','")
            self.pos += 1
            clauses.append(self.clause((kind, rest[0])))
        self.take(".")
        if self.pos != len(self.tokens):
            self.fail("text after the final '.'")
        return tuple(clauses)


def parse_source(source: str) -> Sentence:
    """The syntax tree of an S sentence (the grammar is LL(1): one parse)."""
    return _Parser(source).sentence()


def translate(source: str) -> str:
    """The one correct T translation of an S sentence (a reference translator)."""
    return render_target(parse_source(source))
