"""Translation data: the synthetic_translation corpus, the parallel_text tfds builder,
Multi30k from ../shared/data, and the tfds catalog WMT path under mock_data."""

import collections
import os
import re

import pytest
import tensorflow_datasets as tfds

from bert_jax.data import ParallelText, load_source, parallel_text_config
from bert_jax.data import synthetic_translation as st
from bert_jax.data.parallel_text import discover_splits
from bert_jax.data.sources import prepare
from bert_jax.errors import DataError
from synthetic_translation_reference import translate

SMALL = dict(num_train=300, num_validation=60, num_test=60)


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


def _pairs(source) -> list[tuple[str, str]]:
    return [(_text(source[i]["source"]), _text(source[i]["target"]))
            for i in range(len(source))]


@pytest.fixture(scope="module")
def sample() -> list[tuple[str, str]]:
    """4000 pairs of the default grammar (max_clauses=3)."""
    return _pairs(st.generate(num_train=4000, seed=11)["train"])


# ------------------------------------------------------ synthetic corpus --

def test_synthetic_splits_are_deterministic_and_those_of_the_former_builder():
    splits = load_source("synthetic_translation", "train", **SMALL)
    assert st.generate(**SMALL)["train"] is splits   # cached: generated once
    st.generate.cache_clear()
    again = st.generate(**SMALL)
    assert {s: _pairs(again[s]) for s in again} == {
        s: _pairs(load_source("synthetic_translation", s, **SMALL))
        for s in ("train", "validation", "test")}
    assert {s: len(p) for s, p in again.items()} == {"train": 300, "validation": 60,
                                                      "test": 60}
    assert _pairs(st.generate(seed=1, **SMALL)["train"]) != _pairs(again["train"])
    # What the tfds builder (commit 8f5ff60) stored first, in generation order.
    first = st.generate(num_train=500, num_validation=50, num_test=50, seed=3)
    assert first["train"][0] == {
        "source": "ta rosesi bosor ta dik kofak dokut rem ta poni lom ta renuri .",
        "target": "hun droglixot wyhornunt hu gloqytho jeqazo snelm xov hun trernot viz "
                  "jan skodrornae ."}
    assert first["test"][0]["source"] == ("ta rodan nu ta gifer lom mu kemuni bifis nen ta "
                                          "gipesi rek dim ta tus pes .")


def test_synthetic_splits_are_disjoint():
    # One clause only: short sentences recur, so redraws are really needed.
    splits = st.generate(num_train=3000, num_validation=500, num_test=500, max_clauses=1,
                         seed=5)
    sources = {s: [src for src, _ in _pairs(examples)] for s, examples in splits.items()}
    assert len(set(sources["train"])) < len(sources["train"])  # train repeats
    for split in ("validation", "test"):
        assert len(set(sources[split])) == len(sources[split]) == 500
    train, val, test = (set(v) for v in sources.values())
    assert not train & val and not train & test and not val & test


def test_synthetic_parameters_are_validated():
    for params, match in [(dict(max_clauses=0), "max_clauses"),
                          (dict(num_train=-1), "num_train"),
                          (dict(seed=1.5), "seed")]:
        with pytest.raises(DataError, match=f"^synthetic_translation: {match}=") as error:
            st.generate(**params)
        assert error.value.path == "synthetic_translation"


def test_synthetic_lengths_span_the_promised_range(sample):
    lengths = [len(src.split()) for src, _ in sample]
    assert min(lengths) <= 5          # "ta gak tor ." has 4
    assert max(lengths) >= 40         # a few dozen
    assert 12 <= sum(lengths) / len(lengths) <= 30
    clauses = collections.Counter(src.count(",") + 1 for src, _ in sample)
    assert set(clauses) == {1, 2, 3}  # max_clauses=3
    one = _pairs(st.generate(num_train=2000, max_clauses=1)["train"])
    assert max(len(s.split()) for s, _ in one) < max(lengths)
    assert all("," not in s for s, _ in one)


def test_synthetic_translation_is_a_function_of_the_source(sample):
    seen: dict[str, str] = {}
    repeats = 0
    for src, tgt in sample:
        repeats += src in seen
        assert seen.setdefault(src, tgt) == tgt
        assert translate(src) == tgt   # the grammar parses S one way only
    assert repeats > 0   # some short sentences recur, always with one translation


def test_synthetic_docstring_example_is_correct():
    doc = st.__doc__
    src = re.search(r"\n    S: (.*)\n", doc).group(1)
    tgt = " ".join(re.search(r"\n    T: (.*?)\n\n", doc, re.S).group(1).split())
    assert translate(src) == tgt


# The checks below parse both languages with tables built here from the
# module's lexicon (stems, suffixes, articles), not with its renderer.

def _source_lexicon():
    lex = {st.SOURCE_DEFINITE: ("det",), st.SOURCE_INDEFINITE: ("det",),
           st.SOURCE_PAST: ("past",), st.SOURCE_NP_AND: ("and",)}
    for n in st.NOUNS:
        lex[n.source] = ("noun", n.target, "sg")
        lex[n.source + st.SOURCE_PLURAL_SUFFIX] = ("noun", n.target, "pl")
    lex.update({a.source: ("adj", a.target) for a in st.ADJECTIVES})
    lex.update({v.source: ("verb", v.target) for v in st.VERBS})
    lex.update({p.source: ("prep",) for p in st.PREPOSITIONS})
    lex.update({w.source: ("sub",) for w in st.SUBORDINATORS})
    lex.update({w.source: ("conj",) for w in st.CONJUNCTIONS})
    return lex


def _target_lexicon():
    lex = {}
    for table in (st.DEFINITE_ARTICLES, st.INDEFINITE_ARTICLES):
        lex.update({w: ("det", g, n) for (g, n), w in table.items()})
    for noun in st.NOUNS:
        lex[noun.target] = ("noun", noun.target, noun.gender, "sg")
        plural = noun.target + st.TARGET_PLURAL_SUFFIX[noun.gender]
        lex[plural] = ("noun", noun.target, noun.gender, "pl")
    for adj in st.ADJECTIVES:
        for (g, n), suffix in st.ADJECTIVE_SUFFIXES.items():
            lex[adj.target + suffix] = ("adj", adj.target, g, n)
    for verb in st.VERBS:
        for (tense, n), suffix in st.VERB_SUFFIXES.items():
            lex[verb.target + suffix] = ("verb", verb.target, tense, n)
    lex.update({w.target: ("sub",) for w in st.SUBORDINATORS})
    return lex


def _clauses(sentence: str) -> list[list[str]]:
    words = sentence.split()
    assert words[-1] == "." and "." not in words[:-1]
    return [c.split() for c in " ".join(words[:-1]).split(" , ")]


def _source_clause(words, lex):
    """(subordinate, NPs as (noun, number, adjectives), verb, tense, subject
    number, verb is last, the numbers of the subject's nouns, coordinated)."""
    kinds = [lex[w][0] for w in words]
    subordinate = kinds[0] == "sub"
    v = kinds.index("verb")
    nps = []
    for i, w in enumerate(words):
        if kinds[i] == "noun":
            j = i + 1
            while j < len(words) and kinds[j] == "adj":
                j += 1
            nps.append((lex[w][1], lex[w][2], [lex[a][1] for a in words[i + 1:j]]))
    subject_nouns = [lex[w][2] for w in words[:v] if lex[w][0] == "noun"]
    coordinated = st.SOURCE_NP_AND in words[:v]
    number = "pl" if coordinated else subject_nouns[0]   # the head noun's
    tense = "past" if words[v - 1] == st.SOURCE_PAST else "present"
    return (subordinate, nps, lex[words[v]][1], tense, number, v == len(words) - 1,
            subject_nouns, coordinated)


def test_synthetic_grammar_reordering_and_agreement(sample):
    slex, tlex = _source_lexicon(), _target_lexicon()
    seen = collections.Counter()
    for src, tgt in sample:
        s_clauses, t_clauses = _clauses(src), _clauses(tgt)
        assert len(s_clauses) == len(t_clauses)
        for s_words, t_words in zip(s_clauses, t_clauses):
            (sub, s_nps, verb, tense, number, s_verb_last, s_subj,
             coordinated) = _source_clause(s_words, slex)
            t = [tlex.get(w, ("other",)) for w in t_words]
            verbs = [i for i, x in enumerate(t) if x[0] == "verb"]
            assert len(verbs) == 1, t_words
            v = verbs[0]
            # The verb: same lexeme, the tense of S's particle, the subject's number.
            assert t[v][1:] == (verb, tense, number), (src, tgt)
            # Reordering: last in a subordinate clause; after the subject otherwise.
            assert (t[0][0] == "sub") == sub
            nouns_before_verb = sum(x[0] == "noun" for x in t[:v])
            if sub:
                assert v == len(t_words) - 1, (src, tgt)
                assert nouns_before_verb == len(s_nps)
                seen["subordinate verb moved"] += not s_verb_last
            else:
                assert nouns_before_verb == len(s_subj)
            # Agreement: every T noun phrase is det adj* noun, all in the
            # noun's gender and number; nouns and adjectives as in S, reordered.
            t_nps = []
            for i, x in enumerate(t):
                if x[0] != "det":
                    continue
                j = i + 1
                while t[j][0] == "adj":
                    j += 1
                _, noun, gender, noun_number = t[j]
                assert x[1:] == (gender, noun_number), (t_words[i], t_words[j], tgt)
                for a in t[i + 1:j]:
                    assert a[2:] == (gender, noun_number), (tgt, a)
                t_nps.append((noun, noun_number, [a[1] for a in t[i + 1:j]]))
                seen[f"gender {gender} {noun_number}"] += 1
                seen["article 3 words before its noun"] += j - i == 3
            assert t_nps == s_nps, (src, tgt)
            # Hard cases the claims are about must actually occur.
            seen["coordinated singulars, plural verb"] += (
                coordinated and set(s_subj) == {"sg"})
            # "the dog near the farmers sees": the verb agrees with the head.
            seen["attractor of other number in subject"] += (
                not coordinated and len(set(s_subj)) == 2)
    for g in st.GENDERS:
        for n in st.NUMBERS:
            assert seen[f"gender {g} {n}"] > 0
    for case in ("subordinate verb moved", "article 3 words before its noun",
                 "coordinated singulars, plural verb",
                 "attractor of other number in subject"):
        assert seen[case] > 50, (case, seen)


# -------------------------------------------------- parallel_text builder --

SRC, TGT = "xx", "yy"   # invented language codes; hand-written lines below


def _write(directory, name, lines):
    """Writes lines (str, joined with newlines) or raw bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    if not isinstance(lines, bytes):
        lines = "".join(f"{line}\n" for line in lines).encode()
    (directory / name).write_bytes(lines)
    return str(directory / name)


def _corpus(root, n_train=5):
    corpus = root / "corpus"
    _write(corpus, f"train.{SRC}", [f"kalo mitu {i} ä" for i in range(n_train)])
    _write(corpus, f"train.{TGT}", [f"zin vaqu {i} é" for i in range(n_train)])
    _write(corpus, f"val.{SRC}", ["kalo val 0", "kalo val 1"])
    _write(corpus, f"val.{TGT}", ["zin val 0", "zin val 1"])
    _write(corpus, f"test.{SRC}", ["kalo test 0"])
    _write(corpus, f"test.{TGT}", ["zin test 0"])
    _write(corpus, "README.md", ["not a split"])
    return corpus


def _build(corpus, data_dir, src=SRC, tgt=TGT, **kw):
    """The builder and its splits as lists of (source, target)."""
    builder = ParallelText(path=corpus, source_language=src, target_language=tgt,
                           data_dir=data_dir, **kw)
    prepare(builder)
    return builder, {s: _pairs(load_source(builder, s)) for s in builder.info.splits}


def test_parallel_text_builds_aligned_pairs(tmp_path):
    corpus = _corpus(tmp_path)
    # Windows line ends, a byte-order mark and surrounding blanks are tolerated.
    _write(corpus, f"test.{SRC}", "\ufeff  kalo test 0 \r\n".encode())
    builder, splits = _build(corpus, tmp_path / "tfds")
    assert set(splits) == {"train", "validation", "test"}
    assert splits["train"] == [(f"kalo mitu {i} ä", f"zin vaqu {i} é")
                               for i in range(5)]
    assert splits["validation"] == [("kalo val 0", "zin val 0"),
                                    ("kalo val 1", "zin val 1")]
    assert splits["test"] == [("kalo test 0", "zin test 0")]
    name = builder.builder_config.name
    assert name.startswith(f"corpus_{SRC}-{TGT}_")
    assert builder.data_dir.startswith(str(tmp_path / "tfds"))
    assert builder.info.metadata["skipped_empty_pairs"] == {}

    # The other direction, and by name through load_source with explicit splits.
    _, back = _build(corpus, tmp_path / "tfds", src=TGT, tgt=SRC)
    assert back["train"] == [(t, s) for s, t in splits["train"]]
    only = load_source("parallel_text", "validation", tmp_path / "tfds", path=corpus,
                       source_language=SRC, target_language=TGT,
                       splits={"validation": "test"})
    assert _pairs(only) == splits["test"]


def test_parallel_text_split_discovery(tmp_path):
    d = tmp_path / "d"
    for stem in ("train", "dev", "test_2016_flickr", "news.2014", "mono"):
        _write(d, f"{stem}.{SRC}", ["a"])
        if stem != "mono":
            _write(d, f"{stem}.{TGT}", ["b"])
    assert dict(discover_splits(str(d), SRC, TGT)) == {
        "train": "train", "validation": "dev", "test": "test_2016_flickr",
        "news_2014": "news.2014"}
    # When the standard name is taken by a stem of its own, aliases step back.
    _write(d, f"test.{SRC}", ["a"])
    _write(d, f"test.{TGT}", ["b"])
    _write(d, f"val.{SRC}", ["a"])
    _write(d, f"val.{TGT}", ["b"])
    assert dict(discover_splits(str(d), SRC, TGT)) == {
        "train": "train", "dev": "dev", "val": "val", "test": "test",
        "test_2016_flickr": "test_2016_flickr", "news_2014": "news.2014"}


def _error_corpus(tmp_path, case):
    corpus = _corpus(tmp_path)
    src, tgt = str(corpus / f"train.{SRC}"), str(corpus / f"train.{TGT}")
    if case == "misaligned":
        _write(corpus, f"train.{TGT}", ["zin 0", "zin 1", "zin 2"])
        return corpus, [src, tgt]
    if case == "empty line":
        _write(corpus, f"train.{TGT}", ["zin 0", "zin 1", "   ", "zin 3", "zin 4"])
        return corpus, [f"{tgt}:3:", "skip_empty"]
    if case == "empty source line":
        _write(corpus, f"train.{SRC}", ["", "kalo 1", "kalo 2", "", "kalo 4"])
        return corpus, [f"{src}:1:", "skip_empty"]
    if case == "invalid utf-8":
        _write(corpus, f"train.{SRC}", b"kalo 0\nkalo 1\nkalo \xff 2\nkalo 3\nkalo 4\n")
        return corpus, [f"{src}:3:", "UTF-8"]
    raise ValueError(case)


@pytest.mark.parametrize("case", ["misaligned", "empty line", "empty source line",
                                  "invalid utf-8"])
def test_parallel_text_content_errors_name_file_and_line(tmp_path, case):
    corpus, expected = _error_corpus(tmp_path, case)
    builder = ParallelText(path=corpus, source_language=SRC, target_language=TGT,
                           data_dir=tmp_path / "tfds")
    with pytest.raises(DataError) as info:
        load_source(builder, "validation")
    for text in expected:
        assert text in str(info.value)
    assert not os.path.exists(builder.data_dir)   # nothing half-built is left
    assert not any("incomplete" in p for _, dirs, _ in os.walk(tmp_path / "tfds")
                   for p in dirs)


def test_parallel_text_skip_empty_drops_and_reports(tmp_path):
    corpus, _ = _error_corpus(tmp_path, "empty line")
    _write(corpus, f"val.{SRC}", ["", "kalo val 1"])
    builder, splits = _build(corpus, tmp_path / "tfds", skip_empty=True)
    assert [s for s, _ in splits["train"]] == [f"kalo mitu {i} ä" for i in (0, 1, 3, 4)]
    assert splits["validation"] == [("kalo val 1", "zin val 1")]
    assert builder.info.metadata["skipped_empty_pairs"] == {
        "train": {"count": 1, "first_lines": [3]},
        "validation": {"count": 1, "first_lines": [1]}}
    reopened = tfds.builder_from_directory(builder.data_path)
    assert reopened.info.metadata["skipped_empty_pairs"]["train"]["count"] == 1
    plain = ParallelText(path=corpus, source_language=SRC, target_language=TGT)
    assert plain.builder_config.name != builder.builder_config.name


def test_parallel_text_construction_errors(tmp_path):
    corpus = _corpus(tmp_path)
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "nowhere"))):
        ParallelText(path=tmp_path / "nowhere", source_language=SRC, target_language=TGT)
    with pytest.raises(DataError) as info:
        ParallelText(path=corpus, source_language="de", target_language=TGT)
    assert info.value.path == str(corpus)
    assert "md (1 file), xx (3 files), yy (3 files)" in str(info.value)  # the suffixes
    with pytest.raises(FileNotFoundError, match=re.escape(str(corpus / f"dev.{TGT}"))):
        ParallelText(path=corpus, source_language=SRC, target_language=TGT,
                     splits={"train": "train", "validation": "dev"})
    with pytest.raises(ValueError, match="source_language"):
        ParallelText(path=corpus, target_language=TGT)
    with pytest.raises(DataError, match="both 'xx'") as error:
        parallel_text_config(corpus, SRC, SRC)
    assert error.value.path == str(corpus.resolve()) and error.value.fix == "give two languages"


def test_parallel_text_changed_corpus_is_rebuilt(tmp_path):
    corpus = _corpus(tmp_path)
    data_dir = tmp_path / "tfds"
    old, old_splits = _build(corpus, data_dir)
    again = ParallelText(path=corpus, source_language=SRC, target_language=TGT,
                         data_dir=data_dir)
    assert again.builder_config is old.builder_config   # unchanged: same folder

    _write(corpus, f"val.{TGT}", ["zin val 0 new", "zin val 1"])   # other size
    new, new_splits = _build(corpus, data_dir)
    assert new.builder_config.name != old.builder_config.name
    assert new.data_dir != old.data_dir
    assert new_splits["validation"][0] == ("kalo val 0", "zin val 0 new")
    assert _pairs(load_source(old, "validation")) == old_splits["validation"]

    # Same size, another mtime: also a new config.
    path = corpus / f"val.{TGT}"
    path.write_text("zin val 0 NEW\nzin val 1\n")
    st_ = os.stat(path)
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 10**9))
    newer = ParallelText(path=corpus, source_language=SRC, target_language=TGT,
                         data_dir=data_dir)
    assert newer.builder_config.name not in (old.builder_config.name,
                                             new.builder_config.name)
    # A file changed between construction and build is refused.
    os.utime(path, ns=(st_.st_atime_ns, st_.st_mtime_ns + 2 * 10**9))
    with pytest.raises(DataError, match=re.escape(str(path))):
        load_source(newer, "validation")


# ------------------------------------------------------- Multi30k (shared) --

@pytest.fixture(scope="module")
def multi30k(shared_data, tmp_path_factory):
    """Multi30k built de->en and en->de into a temp dir (read in place)."""
    path = shared_data / "multi30k"
    data_dir = tmp_path_factory.mktemp("multi30k_tfds")
    return {(src, tgt): {split: load_source(
                ParallelText(path=path, source_language=src, target_language=tgt,
                             data_dir=data_dir), split)
                for split in ("train", "validation", "test")}
            for src, tgt in (("de", "en"), ("en", "de"))}


@pytest.mark.slow
def test_multi30k_splits_and_both_directions(multi30k, shared_data):
    for pair, splits in multi30k.items():
        assert {s: len(v) for s, v in splits.items()} == {
            "train": 29000, "validation": 1014, "test": 1000}, pair
    de_en, en_de = multi30k["de", "en"], multi30k["en", "de"]
    for split in ("train", "validation", "test"):
        for i in (0, len(de_en[split]) // 2, len(de_en[split]) - 1):
            a, b = de_en[split][i], en_de[split][i]
            assert _text(a["source"]) == _text(b["target"]) != ""
            assert _text(a["target"]) == _text(b["source"]) != ""
    # Stored in file order: the last pair is the files' last lines.
    last_de = (shared_data / "multi30k" / "val.de").read_text("utf-8").splitlines()[-1]
    assert _text(de_en["validation"][1013]["source"]) == last_de.strip()


# ----------------------------------------------- tfds catalog, mocked WMT --

def test_wmt14_catalog_path_under_mock_data(tmp_path):
    # Catalog datasets register when their module is imported; mock_data
    # cannot find `wmt14_translate` otherwise.
    import tensorflow_datasets.translate.wmt14  # noqa: F401
    with tfds.testing.mock_data(num_examples=4):
        source = load_source("wmt14_translate/de-en", "train", tmp_path)
        assert len(source) == 4
        for i in range(len(source)):
            assert set(source[i]) == {"de", "en"}
            assert all(isinstance(v, (str, bytes)) for v in source[i].values())
