"""`synthetic_translation`: a built-in parallel corpus between two invented languages.

Each example is `{"source": str, "target": str}`, a sentence of the language
S and its one translation into T, tokens separated by spaces; a pure function
of `generate`'s parameters.

Why it is a translation task and not a copy task: T needs what attention is for.
- Reordering: S puts adjectives after the noun, T before it; T puts the verb
  *last* in subordinate clauses (after the object and every PP), like German.
- Agreement across words: each T noun has a gender (`m`, `f`, `n`) that S
  does not mark; T articles and adjectives agree with it in gender and number
  and come *before* it, up to three words earlier. T verbs agree in number
  with the subject's head (plural for `X nu Y`, never a nearer noun of a PP)
  and carry the tense S marks with a separate particle `ka`.
- Lengths from 4 tokens (`ta gak tor .`, "the dog runs") to a few dozen;
  with `max_clauses=3`, 19 source words on average, 99th percentile 45.

Grammar (S on the left, T on the right; `[]` optional, `*` repeated)::

    sentence   := clause ("," connector clause)* "."   (connector: subordinator,
                                                        then subordinate; or conjunction)
    clause S   := subject ["ka"] verb [object] pp*
    main    T  := subject verb[tense,num] [object] pp*
    subord. T  := subject [object] pp* verb[tense,num]   (verb last)
    subject    := np ["nu" np]        T: np ["ek" np]   (coordinated: plural)
    np S       := det noun[num] adjective*  [pp]   (pp only inside a subject)
    np T       := det[g,num] adjective[g,num]* noun[num]  [pp]
    pp         := preposition np        (np without a pp of its own)

Morphology: S plural noun = stem + `i`, nothing else inflects. T: the tables
below (`TARGET_PLURAL_SUFFIX`, `*_ARTICLES`, `ADJECTIVE_SUFFIXES`,
`VERB_SUFFIXES`). Every surface form is distinct, so a sentence parses word by
word (tests' `synthetic_translation_reference.translate` is a reference
translator). Worked example::

    S: ta gak sis pek mu fosaki ka kim ta dusi , rer ta kut det mu lar filan gok ta kat .
    T: ja jicha troz tryth yvai qaskuvae drythys zon skirnir , vev hu xilm
       yvo vavyske skez snilm zo ziz xithut .

    ja jicha troz   the(f.sg) small(f.sg) dog: gender of `troz`, two words later
    drythys         `ka kim` (PAST meet), singular: the head `gak`, not `fosaki`
    vev ... xithut  `rer` (because) opens a subordinate clause: `det` (find)
                    moves from its 3rd place to the clause's end

The splits come from separate random streams; a validation or test source
seen before is redrawn (`train` may repeat a short one). Randomness uses only
`random.Random(str).random()`, which Python reproduces across versions.
Changing the grammar, the lexicon or the sampling changes every experiment's data.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Sequence
from typing import NamedTuple

from bert_jax.data.splits import check_counts
from bert_jax.errors import DataError


class Noun(NamedTuple):
    source: str   # S stem; plural adds SOURCE_PLURAL_SUFFIX
    target: str   # T stem; plural adds TARGET_PLURAL_SUFFIX[gender]
    gender: str   # of the T noun: "m", "f" or "n"
    gloss: str


class Word(NamedTuple):
    source: str
    target: str   # for adjectives and verbs, the stem
    gloss: str


class Verb(NamedTuple):
    source: str
    target: str   # T stem; adds VERB_SUFFIXES[(tense, number)]
    transitive: bool
    gloss: str


GENDERS = ("m", "f", "n")
NUMBERS = ("sg", "pl")
TENSES = ("present", "past")

NOUNS: tuple[Noun, ...] = tuple(Noun(*row) for row in (
    ("fosak", "qaskuv", "f", "farmer"), ("gak", "troz", "f", "dog"),
    ("pobuk", "jygluv", "n", "cat"), ("magas", "hitrez", "n", "child"),
    ("pedus", "gleskaz", "m", "teacher"), ("renur", "skodrorn", "f", "bird"),
    ("fedun", "qoskych", "f", "horse"), ("dapom", "skexov", "n", "house"),
    ("dus", "skirn", "n", "river"), ("rodan", "xyglav", "f", "garden"),
    ("kut", "xilm", "m", "tree"), ("lar", "skez", "n", "stone"),
    ("gifer", "trozech", "m", "king"), ("kemun", "snoskylm", "m", "queen"),
    ("fam", "hesk", "f", "soldier"), ("rekik", "hoqirn", "m", "ship"),
    ("tus", "glyv", "m", "city"), ("sumor", "traxylm", "f", "mountain"),
    ("denek", "skuvav", "m", "road"), ("paluk", "zedrox", "n", "window"),
    ("lulok", "zoxoch", "n", "book"), ("fatit", "wosnev", "m", "letter"),
    ("pifuk", "qiglath", "f", "apple"), ("figus", "qiglesk", "n", "bread"),
    ("mem", "qorn", "f", "fish"), ("bir", "wern", "n", "friend"),
    ("tilam", "zexern", "f", "doctor"), ("rubot", "skyzyz", "m", "baker"),
    ("ter", "horn", "m", "wolf"), ("tonot", "zyhex", "n", "fox"),
    ("roses", "droglix", "m", "table"), ("fabas", "snetresk", "n", "door"),
    ("gipes", "skiqox", "n", "lamp"), ("tinus", "truhux", "n", "wagon"),
    ("bofuk", "hehoz", "f", "bridge"), ("lupur", "zuvesk", "n", "forest"),
    ("dunuk", "zoskusk", "m", "field"), ("nupos", "jyqisk", "f", "village"),
    ("fok", "trorn", "m", "lake"), ("godet", "wahyrn", "m", "boat"),
    ("fogar", "xeglex", "n", "hammer"), ("pon", "trern", "m", "basket"),
    ("tibis", "xosnalm", "f", "cup"), ("ripak", "jazith", "f", "key"),
    ("fifot", "wohuch", "f", "coat"), ("dik", "snelm", "m", "storm"),
    ("kat", "ziz", "n", "song"), ("gakar", "viqoth", "m", "mirror"),
))

ADJECTIVES: tuple[Word, ...] = tuple(Word(*row) for row in (
    ("butek", "hivesk", "big"), ("sis", "jich", "small"),
    ("filan", "vavysk", "old"), ("godot", "xutruth", "young"),
    ("giger", "skahaz", "red"), ("kofak", "gloqyth", "green"),
    ("tibom", "hixath", "black"), ("lulek", "weskev", "white"),
    ("dokut", "jeqaz", "tall"), ("demuk", "trawisk", "quiet"),
    ("pesur", "skyxeth", "loud"), ("sek", "snulm", "happy"),
    ("pes", "quv", "tired"), ("rek", "vax", "brave"),
    ("donuk", "glaglusk", "clever"), ("bodus", "zyqach", "heavy"),
    ("digem", "snyxolm", "cold"), ("sibut", "glezux", "strange"),
))

VERBS: tuple[Verb, ...] = tuple(Verb(*row) for row in (
    ("sirum", "vovoth", True, "see"), ("det", "xith", True, "find"),
    ("napen", "zovich", True, "carry"), ("pokom", "jadrax", True, "follow"),
    ("kim", "dryth", True, "meet"), ("tim", "xolm", True, "build"),
    ("bosor", "wyhorn", True, "buy"), ("dibin", "trajyv", True, "paint"),
    ("kin", "zolm", True, "hear"), ("ran", "triv", True, "call"),
    ("bisem", "woqisk", True, "push"), ("mat", "trusk", True, "wash"),
    ("bor", "dreth", True, "feed"), ("pefor", "skiwith", True, "open"),
    ("ginut", "trahyx", True, "visit"), ("poper", "skotresk", True, "remember"),
    ("fipan", "jiwusk", False, "sleep"), ("tor", "trysk", False, "run"),
    ("lanis", "skeglusk", False, "sing"), ("gomor", "wahalm", False, "laugh"),
    ("nur", "valm", False, "wait"), ("por", "jask", False, "swim"),
    ("patok", "qavesk", False, "fall"), ("bifis", "glosnaz", False, "dance"),
    ("pugon", "juvath", False, "shine"), ("kit", "josk", False, "cry"),
))

PREPOSITIONS: tuple[Word, ...] = tuple(Word(*row) for row in (
    ("pek", "tryth", "near"), ("bam", "xylm", "in"), ("dim", "glorn", "on"),
    ("gok", "snilm", "under"), ("lom", "viz", "behind"), ("gom", "wesk", "with"),
    ("nen", "wach", "without"), ("rem", "xov", "from"),
))

SUBORDINATORS: tuple[Word, ...] = tuple(Word(*row) for row in (
    ("rer", "vev", "because"), ("mot", "skyz", "when"),
    ("den", "jech", "although"), ("bit", "snorn", "if"),
    ("dak", "warn", "while"),
))

CONJUNCTIONS: tuple[Word, ...] = tuple(Word(*row) for row in (
    ("ke", "ek", "and"), ("pa", "mav", "but"),
))

# S function words and morphology.
SOURCE_DEFINITE, SOURCE_INDEFINITE = "ta", "mu"
SOURCE_PAST = "ka"           # particle before the verb
SOURCE_NP_AND = "nu"         # coordinates subjects (clauses use CONJUNCTIONS)
SOURCE_PLURAL_SUFFIX = "i"

# T function words and morphology.
TARGET_NP_AND = "ek"         # the same word as the clause conjunction "and"
TARGET_PLURAL_SUFFIX = {"m": "ot", "f": "ae", "n": "ir"}
DEFINITE_ARTICLES = {("m", "sg"): "hu", ("f", "sg"): "ja", ("n", "sg"): "zo",
                     ("m", "pl"): "hun", ("f", "pl"): "jan", ("n", "pl"): "zon"}
INDEFINITE_ARTICLES = {("m", "sg"): "yv", ("f", "sg"): "yva", ("n", "sg"): "yvo",
                       ("m", "pl"): "yvi", ("f", "pl"): "yvai", ("n", "pl"): "yvoi"}
ADJECTIVE_SUFFIXES = {("m", "sg"): "o", ("f", "sg"): "a", ("n", "sg"): "e",
                      ("m", "pl"): "oj", ("f", "pl"): "aj", ("n", "pl"): "ej"}
VERB_SUFFIXES = {("present", "sg"): "ut", ("present", "pl"): "unt",
                 ("past", "sg"): "ys", ("past", "pl"): "yns"}
PUNCTUATION = (",", ".")


@dataclasses.dataclass(frozen=True)
class NounPhrase:
    noun: int                          # index into NOUNS
    plural: bool
    definite: bool
    adjectives: tuple[int, ...] = ()   # indices into ADJECTIVES, in S order
    modifier: PrepPhrase | None = None  # only inside a subject


@dataclasses.dataclass(frozen=True)
class PrepPhrase:
    preposition: int                   # index into PREPOSITIONS
    np: NounPhrase


@dataclasses.dataclass(frozen=True)
class Clause:
    subject: tuple[NounPhrase, ...]    # 1, or 2 coordinated (plural)
    verb: int                          # index into VERBS
    past: bool
    object: NounPhrase | None = None   # exactly when the verb is transitive
    pps: tuple[PrepPhrase, ...] = ()
    # None for the first clause; ("sub", i) after SUBORDINATORS[i] (the
    # clause is subordinate), ("conj", i) after CONJUNCTIONS[i] (main clause).
    connector: tuple[str, int] | None = None

    @property
    def subordinate(self) -> bool:
        return self.connector is not None and self.connector[0] == "sub"

    @property
    def subject_number(self) -> str:
        return "pl" if len(self.subject) > 1 or self.subject[0].plural else "sg"


Sentence = tuple[Clause, ...]


def target_noun(noun: int, plural: bool) -> str:
    n = NOUNS[noun]
    return n.target + (TARGET_PLURAL_SUFFIX[n.gender] if plural else "")


def target_adjective(adjective: int, gender: str, number: str) -> str:
    return ADJECTIVES[adjective].target + ADJECTIVE_SUFFIXES[(gender, number)]


def target_verb(verb: int, past: bool, number: str) -> str:
    return VERBS[verb].target + VERB_SUFFIXES[("past" if past else "present", number)]


def _np(np_: NounPhrase, side: str) -> list[str]:
    if side == "source":
        out = [SOURCE_DEFINITE if np_.definite else SOURCE_INDEFINITE,
               NOUNS[np_.noun].source + (SOURCE_PLURAL_SUFFIX if np_.plural else "")]
        out += [ADJECTIVES[a].source for a in np_.adjectives]
    else:
        gender, number = NOUNS[np_.noun].gender, "pl" if np_.plural else "sg"
        out = [(DEFINITE_ARTICLES if np_.definite else INDEFINITE_ARTICLES)[(gender, number)]]
        out += [target_adjective(a, gender, number) for a in np_.adjectives]
        out.append(target_noun(np_.noun, np_.plural))
    return out + (_pp(np_.modifier, side) if np_.modifier is not None else [])


def _pp(pp: PrepPhrase, side: str) -> list[str]:
    return [getattr(PREPOSITIONS[pp.preposition], side)] + _np(pp.np, side)


def _render(sentence: Sentence, side: str) -> str:
    out: list[str] = []
    for clause in sentence:
        if clause.connector is not None:
            kind, i = clause.connector
            out += [",", getattr((SUBORDINATORS if kind == "sub" else CONJUNCTIONS)[i], side)]
        for k, np_ in enumerate(clause.subject):
            if k:
                out.append(SOURCE_NP_AND if side == "source" else TARGET_NP_AND)
            out += _np(np_, side)
        if side == "source":
            verb = [SOURCE_PAST] * clause.past + [VERBS[clause.verb].source]
        else:
            verb = [target_verb(clause.verb, clause.past, clause.subject_number)]
        last = side == "target" and clause.subordinate   # T: verb last in a subordinate
        out += [] if last else verb
        if clause.object is not None:
            out += _np(clause.object, side)
        for pp in clause.pps:
            out += _pp(pp, side)
        out += verb if last else []
    return " ".join(out + ["."])


def render_source(sentence: Sentence) -> str:
    return _render(sentence, "source")


def render_target(sentence: Sentence) -> str:
    return _render(sentence, "target")


def _source_words() -> dict[str, tuple]:
    """Every S surface form -> what it is; raises if two forms coincide."""
    table: dict[str, tuple] = {}

    def add(form, what):
        if form in table or form in PUNCTUATION:
            raise RuntimeError(f"synthetic_translation: source form {form!r} is "
                               f"both {table.get(form, 'punctuation')} and {what}")
        table[form] = what

    add(SOURCE_DEFINITE, ("det", True))
    add(SOURCE_INDEFINITE, ("det", False))
    add(SOURCE_PAST, ("past",))
    add(SOURCE_NP_AND, ("np_and",))
    for i, n in enumerate(NOUNS):
        add(n.source, ("noun", i, False))
        add(n.source + SOURCE_PLURAL_SUFFIX, ("noun", i, True))
    for kind, words in (("adj", ADJECTIVES), ("verb", VERBS), ("prep", PREPOSITIONS),
                        ("sub", SUBORDINATORS), ("conj", CONJUNCTIONS)):
        for i, w in enumerate(words):
            add(w.source, (kind, i))
    return table


SOURCE_WORDS = _source_words()   # checked at import: all S forms distinct


def _uniform(rng: random.Random, n: int) -> int:
    return min(int(rng.random() * n), n - 1)


def _pick(rng: random.Random, probs: Sequence[float]) -> int:
    """An index drawn with the given probabilities (summing to 1)."""
    u, acc = rng.random(), 0.0
    for i, p in enumerate(probs):
        acc += p
        if u < acc:
            return i
    return len(probs) - 1


# Sampling probabilities (part of the data definition).
P_ANOTHER_CLAUSE = 0.5      # after each clause, while below max_clauses
P_SUBORDINATE = 0.75        # an added clause is subordinate, else coordinated
P_COORDINATED_SUBJECT = 0.15
P_SUBJECT_MODIFIER = 0.2    # per subject noun phrase: "X near the Y"
P_DEFINITE, P_PLURAL, P_PAST = 0.6, 0.4, 0.4
NUM_ADJECTIVES_PROBS = (0.55, 0.3, 0.15)   # 0, 1, 2 adjectives
NUM_PPS_PROBS = (0.5, 0.35, 0.15)          # 0, 1, 2 clause-level PPs


def _sample_np(rng: random.Random, allow_modifier: bool) -> NounPhrase:
    noun = _uniform(rng, len(NOUNS))
    plural = rng.random() < P_PLURAL
    definite = rng.random() < P_DEFINITE
    adjectives: list[int] = []
    for _ in range(_pick(rng, NUM_ADJECTIVES_PROBS)):
        a = _uniform(rng, len(ADJECTIVES) - len(adjectives))
        for b in sorted(adjectives):   # draw without repetition
            a += a >= b
        adjectives.append(a)
    modifier = None
    if allow_modifier and rng.random() < P_SUBJECT_MODIFIER:
        modifier = PrepPhrase(_uniform(rng, len(PREPOSITIONS)), _sample_np(rng, False))
    return NounPhrase(noun, plural, definite, tuple(adjectives), modifier)


def _sample_clause(rng: random.Random, connector) -> Clause:
    subject = [_sample_np(rng, True)]
    if rng.random() < P_COORDINATED_SUBJECT:
        subject.append(_sample_np(rng, True))
    past = rng.random() < P_PAST
    verb = _uniform(rng, len(VERBS))
    obj = _sample_np(rng, False) if VERBS[verb].transitive else None
    pps = tuple(PrepPhrase(_uniform(rng, len(PREPOSITIONS)), _sample_np(rng, False))
                for _ in range(_pick(rng, NUM_PPS_PROBS)))
    return Clause(tuple(subject), verb, past, obj, pps, connector)


def sample_sentence(rng: random.Random, max_clauses: int) -> Sentence:
    clauses = [_sample_clause(rng, None)]
    while len(clauses) < max_clauses and rng.random() < P_ANOTHER_CLAUSE:
        if rng.random() < P_SUBORDINATE:
            connector = ("sub", _uniform(rng, len(SUBORDINATORS)))
        else:
            connector = ("conj", _uniform(rng, len(CONJUNCTIONS)))
        clauses.append(_sample_clause(rng, connector))
    return tuple(clauses)


SPLITS = ("train", "validation", "test")


@functools.lru_cache(maxsize=2)
def generate(*, num_train: int = 50000, num_validation: int = 1000, num_test: int = 1000,
             max_clauses: int = 3, seed: int = 0
             ) -> dict[str, tuple[dict[str, str], ...]]:
    """`{split: ({"source": str, "target": str}, ...)}` for `SPLITS`, in
    generation order; cached, as a task asks for its splits one by one."""
    check_counts("synthetic_translation", num_train=num_train, num_validation=num_validation,
                 num_test=num_test, max_clauses=max_clauses, seed=seed)
    if max_clauses < 1:
        raise DataError("synthetic_translation", f"max_clauses={max_clauses}",
                        "use at least 1 (the main clause)")
    sizes = {"train": num_train, "validation": num_validation, "test": num_test}
    seen: set[str] = set()
    splits = {}
    for split in SPLITS:
        # A str seed is hashed (sha512) by `random.seed` version 2: stable.
        rng = random.Random(f"synthetic_translation/seed={seed}/{split}")
        out: list[dict[str, str]] = []
        attempts = 0
        while len(out) < sizes[split]:
            attempts += 1
            if attempts > 100 * (sizes[split] + 10):
                raise DataError("synthetic_translation", f"num_{split}={sizes[split]}: too "
                                "few unseen sentences", "use smaller splits or a larger "
                                "max_clauses")
            sentence = sample_sentence(rng, max_clauses)
            source = render_source(sentence)
            if split != "train":
                if source in seen:
                    continue   # redraw: no source sentence shared between splits
                seen.add(source)
            out.append({"source": source, "target": render_target(sentence)})
        if split == "train":
            seen.update(example["source"] for example in out)
        splits[split] = tuple(out)
    return splits
