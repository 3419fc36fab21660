"""BERT's WordPiece vocabulary and tokenization, on the Rust `tokenizers` library.

    vocab = WordPiece.from_vocab_file("bert-base-uncased/vocab.txt")
    vocab.tokenize("Café naïve!")          # ['cafe', 'naive', '!']
    ids, offsets = vocab.encode_with_offsets(context)  # SQuAD: spans -> text
    ids, word_ids = vocab.encode_words(["U.S.", "based"])  # tagging labels

A vocabulary is a `vocab.txt` (google-research/bert's and Hugging Face's),
id = line number, holding `[PAD] [UNK] [CLS] [SEP] [MASK]` anywhere. `encode`
adds no special tokens: the input pipelines frame `[CLS] a [SEP] b [SEP]`.

Tokenization is BERT's (google-research/bert `tokenization.py`, as
`transformers`' `BertTokenizer`): (1) normalize: drop NUL, U+FFFD and control
characters, whitespace to spaces, spaces around CJK ideographs, NFC; uncased
also lower-cases and strips accents; (2) split at whitespace and at every
punctuation character (Unicode P*, and ``$+<=>^`|~``); (3) greedy
longest-match-first WordPiece, `##` continuations; a word without a
segmentation, or over 100 characters, is one `[UNK]`. The library's
`BertNormalizer` and `BertPreTokenizer` do most of it; `_normalizer` and
`_pre_tokenizer` close the gaps a test against the Python reference found:
Greek final sigma (Python gives 'ς' word-finally, the Rust per-character
lower-casing 'σ'), characters newer than the library's Unicode tables, and the
CJK code points U+2B820-U+2B91F its CJK test skips.

Deliberate differences from `transformers.BertTokenizer`: special-token
strings in text are text ("[SEP]" in a document cannot inject a separator);
unassigned code points (Cn) are kept, so their word is `[UNK]`, as in
google-research/bert; the 16 code points (e.g. U+0890, U+166D) whose category
differs between Python's `unicodedata` and the Rust tables follow the Rust ones.

`WordPiece.train` uses the library's `WordPieceTrainer`, made deterministic:
the trainer numbers the `##c` characters in hash order, which breaks ties
between equally frequent merges differently per run, so a first pass without
merges lists them and the real pass receives them sorted. `limit_alphabet`
keeps the corpus's most frequent characters only (the library's option, as
`BertWordPieceTokenizer.train`, whose default is 1,000): a word with another
character is one `[UNK]`, and the vocabulary's room goes to word pieces. The
characters are counted here (ties broken by code point) and handed to the
trainer as its alphabet, since its own cut breaks ties in hash order.

A workdir's vocabulary is trained once and saved there, so ids never change
under a checkpoint (`load_or_train`).
"""

from __future__ import annotations

import os
from collections import Counter, defaultdict
from typing import Callable, Iterable, Sequence

from tokenizers import Encoding, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from bert_jax.data.vocabulary import missing_under_checkpoints
from bert_jax.errors import DataError, MissingFileError
from bert_jax.file_io import read_json, write_atomically, write_json

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)  # the ids of a trained vocabulary: 0..4
CONTINUATION = "##"
MAX_CHARS_PER_WORD = 100  # longer words are one [UNK] (as in BERT)
VOCAB_DIR = "vocab"
VOCAB_FILE = "vocab.txt"
SETTINGS_FILE = "wordpiece.json"

# Python's str.lower() rule for a capital sigma (Unicode "Final_Sigma"): it
# becomes 'ς' when the nearest non-case-ignorable character before it is cased
# and none after it is.
_FINAL_SIGMA = (r"(?<=[\p{Cased}&&\P{Case_Ignorable}]\p{Case_Ignorable}*)Σ"
                r"(?!\p{Case_Ignorable}*[\p{Cased}&&\P{Case_Ignorable}])")
# Punctuation the library's older Unicode tables miss, and the CJK code points
# U+2B820-U+2B91F its ideograph test skips: each is a word of its own.
_EXTRA_SPLITS = r"[\p{P}\x{2B820}-\x{2B91F}]"


def _normalizer(lowercase: bool) -> normalizers.Normalizer:
    """Stage 1: clean-up, CJK spacing, NFC; lower-casing and accents if uncased."""
    steps = [normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                        strip_accents=False, lowercase=False),
             normalizers.NFC()]
    if lowercase:  # lower-case, then NFD and drop non-spacing marks (BERT's order)
        steps += [normalizers.Replace(Regex(_FINAL_SIGMA), "ς"),
                  normalizers.Lowercase(),
                  normalizers.BertNormalizer(clean_text=False, handle_chinese_chars=False,
                                             strip_accents=True, lowercase=False),
                  normalizers.Replace(Regex(r"\p{Mn}"), "")]
    return normalizers.Sequence(steps)


def _pre_tokenizer() -> pre_tokenizers.PreTokenizer:
    """Stage 2: whitespace and punctuation splitting."""
    return pre_tokenizers.Sequence([
        pre_tokenizers.BertPreTokenizer(),
        pre_tokenizers.Split(Regex(_EXTRA_SPLITS), behavior="isolated")])


def _pipeline(model: models.Model, lowercase: bool) -> Tokenizer:
    """A `tokenizers.Tokenizer` with BERT's stages around `model`; no special
    tokens are registered (so none is matched in text) and none is added."""
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = _normalizer(lowercase)
    tokenizer.pre_tokenizer = _pre_tokenizer()
    return tokenizer


def _check_tokens(tokens: Sequence[str], source: str) -> None:
    """Raises a DataError naming `source` for an empty vocabulary, duplicate
    tokens (with their 1-based lines) or a missing special token."""
    if not tokens:
        raise DataError(source, "empty", "a vocabulary has one token a line, "
                        f"{' '.join(SPECIAL_TOKENS)} among them")
    lines: dict[str, list[int]] = defaultdict(list)
    for line, token in enumerate(tokens, start=1):
        lines[token].append(line)
    duplicates = [(token, where) for token, where in lines.items() if len(where) > 1]
    if duplicates:
        shown = "; ".join(f"{token!r} on lines {', '.join(map(str, where))}"
                          for token, where in duplicates[:10])
        more = f" (and {len(duplicates) - 10} more)" if len(duplicates) > 10 else ""
        raise DataError(source, f"duplicate tokens {shown}{more}",
                        "remove the repeats (a token's id is its line)")
    missing = [token for token in SPECIAL_TOKENS if token not in lines]
    if missing:
        raise DataError(source, f"no special token(s) {' '.join(missing)}",
                        "add them, one a line, or train one with WordPiece.train")


def _read_vocab_file(path: str) -> list[str]:
    """The tokens of a `vocab.txt`, in id order (only the line ends stripped)."""
    if not os.path.isfile(path):
        raise MissingFileError(f"{path}: no such vocabulary file; check the path")
    with open(path, encoding="utf-8") as f:
        tokens = f.read().split("\n")
    return tokens[:-1] if tokens[-1] == "" else tokens   # a final newline opens no token


class WordPiece:
    """A WordPiece vocabulary: text <-> ids with BERT's tokenization.

    `tokens` in id order; `lowercase` must match the vocabulary (True for
    bert-base-uncased); `requested_size`: the `vocab_size` it was trained for
    (None when read from a file), `size` may be smaller on a small corpus;
    `limit_alphabet`: the most characters it was trained to keep (0: all).
    """

    def __init__(self, tokens: Sequence[str], *, lowercase: bool = True,
                 path: str | None = None, requested_size: int | None = None,
                 limit_alphabet: int = 0):
        _check_tokens(tokens, path or "the vocabulary")
        self.path = path
        self.lowercase = bool(lowercase)
        self.requested_size = requested_size
        self.limit_alphabet = limit_alphabet
        self._tokens = list(tokens)
        self._ids = {token: i for i, token in enumerate(self._tokens)}
        self._tokenizer = _pipeline(
            models.WordPiece(self._ids, unk_token=UNK, continuing_subword_prefix=CONTINUATION,
                             max_input_chars_per_word=MAX_CHARS_PER_WORD), self.lowercase)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            self._ids[token] for token in SPECIAL_TOKENS)
        self.special_ids: frozenset[int] = frozenset(self._ids[t] for t in SPECIAL_TOKENS)

    def __repr__(self) -> str:
        case = "uncased" if self.lowercase else "cased"
        return f"WordPiece(size={self.size}, {case}, path={self.path!r})"

    # -- construction ----------------------------------------------------------

    @classmethod
    def from_vocab_file(cls, path: str, *, lowercase: bool = True) -> WordPiece:
        """Loads a `vocab.txt`, e.g. a Hugging Face BERT checkpoint's."""
        return cls(_read_vocab_file(path), lowercase=lowercase, path=path)

    @classmethod
    def train(cls, texts: Iterable[str] | Callable[[], Iterable[str]], *, vocab_size: int,
              lowercase: bool = True, min_frequency: int = 2,
              limit_alphabet: int = 0) -> WordPiece:
        """A vocabulary of at most `vocab_size` tokens trained on `texts`: the
        special tokens (ids 0-4), the corpus's characters (the `limit_alphabet`
        most frequent if > 0), their `##` forms, then the merges in learned
        order, until `vocab_size` or no pair occurs `min_frequency` times.
        Deterministic. `texts` is read twice (three times with a limit): a
        callable is called per pass and streamed (the trainer keeps only word
        counts), an iterator is listed first.
        """
        if not callable(texts):
            texts = (lambda listed: lambda: listed)(list(texts))
        alphabet = _most_frequent_characters(texts, limit_alphabet, lowercase)
        # Pass 1, no merges: the alphabet and the continuation characters.
        base = _train_pass(texts, 0, lowercase, min_frequency, SPECIAL_TOKENS, alphabet)
        continuations = sorted(t for t in base if t.startswith(CONTINUATION)
                               and t not in SPECIAL_TOKENS)
        if vocab_size < len(base):
            raise ValueError(f"vocab_size={vocab_size} cannot hold the special tokens and "
                             f"the corpus's characters; use at least {len(base)}")
        # Pass 2: the continuation characters numbered in sorted order.
        vocab = _train_pass(texts, vocab_size, lowercase, min_frequency,
                            SPECIAL_TOKENS + tuple(continuations), alphabet)
        # Its order: specials, continuations, alphabet, merges; shown as
        # specials, alphabet, continuations, merges.
        n, c = len(SPECIAL_TOKENS), len(continuations)
        if vocab[n:n + c] != continuations:
            raise RuntimeError("the tokenizers WordPieceTrainer no longer numbers special tokens "
                               "first: bert_jax.data.wordpiece.train needs updating.")
        tokens = vocab[:n] + vocab[n + c:len(base)] + continuations + vocab[len(base):]
        return cls(tokens, lowercase=lowercase, requested_size=vocab_size,
                   limit_alphabet=limit_alphabet)

    # -- files -----------------------------------------------------------------

    def save(self, directory: str) -> str:
        """Writes `vocab.txt` and its options (`wordpiece.json`) atomically into
        `directory`, `vocab.txt` last; returns its path."""
        os.makedirs(directory, exist_ok=True)
        settings = {"lowercase": self.lowercase, "size": self.size,
                    "requested_size": self.requested_size,
                    "limit_alphabet": self.limit_alphabet}
        write_json(os.path.join(directory, SETTINGS_FILE), settings)
        path = os.path.join(directory, VOCAB_FILE)
        write_atomically(path, "".join(token + "\n" for token in self._tokens))
        self.path = path
        return path

    @classmethod
    def load(cls, directory: str) -> WordPiece:
        """Reads back what `save(directory)` wrote."""
        settings_path = os.path.join(directory, SETTINGS_FILE)
        if not os.path.isfile(settings_path):
            raise MissingFileError(f"{settings_path}: no such file; for a bare vocab.txt "
                                   "use WordPiece.from_vocab_file")
        settings = read_json(settings_path)
        path = os.path.join(directory, VOCAB_FILE)
        vocab = cls(_read_vocab_file(path), lowercase=settings["lowercase"], path=path,
                    requested_size=settings.get("requested_size"),
                    limit_alphabet=settings.get("limit_alphabet", 0))
        if vocab.size != settings["size"]:
            raise DataError(path, f"{vocab.size} tokens, {settings['size']} in "
                            f"{settings_path}", "it was edited after it was saved")
        return vocab

    # -- ids -------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Number of tokens (the model's vocabulary size)."""
        return len(self._tokens)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str]:
        """Tokens of `ids` (any ints, numpy included); raises on an unknown id."""
        ids = [int(i) for i in ids]
        outside = [i for i in ids if not 0 <= i < self.size]
        if outside:
            raise ValueError(f"id {outside[0]} is outside the vocabulary [0, {self.size})")
        return [self._tokens[i] for i in ids]

    def convert_tokens_to_ids(self, tokens: Iterable[str]) -> list[int]:
        """Ids of whole tokens ('##ing' included); unknown tokens give `unk_id`."""
        return [self._ids.get(token, self.unk_id) for token in tokens]

    # -- text -> ids -----------------------------------------------------------

    def tokenize(self, text: str) -> list[str]:
        """Sub-word tokens of `text`, e.g. ['un', '##aff', '##able']."""
        return self._encode(text).tokens

    def encode(self, text: str) -> list[int]:
        """Ids of `text`, `[len(tokenize(text))]`; no [CLS]/[SEP] added."""
        return self._encode(text).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """`[encode(t) for t in texts]`, in parallel in Rust (no offsets kept)."""
        encode = getattr(self._tokenizer, "encode_batch_fast", self._tokenizer.encode_batch)
        return [e.ids for e in encode(list(texts), add_special_tokens=False)]

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """Ids and, for each, its `(start, end)` offsets in `text`: the piece
        before normalization (a `##` piece: its characters only)."""
        encoding = self._encode(text)
        return encoding.ids, [tuple(offset) for offset in encoding.offsets]

    def word_ids(self, text: str) -> list[int]:
        """For each id of `encode(text)`, the index of its pre-tokenized word
        (every punctuation character is a word: 'U.S.' is 4 words)."""
        return list(self._encode(text).word_ids)

    def encode_words(self, words: Sequence[str]) -> tuple[list[int], list[int]]:
        """Ids of already split `words` (a tagging dataset's) and, for each, the
        index of its word, for first-sub-token labels; a word that normalizes
        to nothing (only control characters) gives no id."""
        encoding = self._tokenizer.encode(list(words), is_pretokenized=True,
                                          add_special_tokens=False)
        return encoding.ids, list(encoding.word_ids)

    def _encode(self, text: str) -> Encoding:
        if not isinstance(text, str):
            raise TypeError(f"expected a str, got {type(text).__name__}: decode bytes first.")
        return self._tokenizer.encode(text, add_special_tokens=False)

    # -- ids -> text -----------------------------------------------------------

    def decode(self, ids: Iterable[int], *, skip_framing: bool = True) -> str:
        """BERT's detokenization (case, accents and spacing are not restored);
        `[PAD]`, `[CLS]` and `[SEP]` dropped unless `skip_framing=False`."""
        ids = [int(i) for i in ids]
        tokens = self.convert_ids_to_tokens(ids)
        if skip_framing:
            framing = (self.pad_id, self.cls_id, self.sep_id)
            tokens = [token for token, i in zip(tokens, ids) if i not in framing]
        return " ".join(tokens).replace(" " + CONTINUATION, "").strip()


def _most_frequent_characters(texts: Callable[[], Iterable[str]], limit: int,
                              lowercase: bool) -> list[str]:
    """The `limit` most frequent characters of `texts()` after normalization
    (ties: lower code point first); [] when `limit` is 0 (all of them)."""
    if not limit:
        return []
    raw: Counter[str] = Counter()
    for text in texts():
        raw.update(text)
    # Normalizing each distinct character instead of the text (fast) differs
    # only for a letter followed by combining accents, which NFC would compose:
    # here the letter and the accents count apart.
    normalize = _normalizer(lowercase).normalize_str
    counts: Counter[str] = Counter()
    for char, count in raw.items():
        for normalized in normalize(char):
            if not normalized.isspace():
                counts[normalized] += count
    return sorted(counts, key=lambda char: (-counts[char], char))[:limit]


def _train_pass(texts: Callable[[], Iterable[str]], vocab_size: int, lowercase: bool,
                min_frequency: int, special_tokens: Sequence[str],
                alphabet: Sequence[str] = ()) -> list[str]:
    """One run of the library's WordPiece trainer over `texts()`: the tokens in
    id order. `alphabet`: the only characters kept (all when empty)."""
    tokenizer = _pipeline(models.WordPiece(unk_token=UNK), lowercase)
    limit = dict(initial_alphabet=list(alphabet), limit_alphabet=len(alphabet)) if alphabet else {}
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
        special_tokens=list(special_tokens), continuing_subword_prefix=CONTINUATION, **limit)
    tokenizer.train_from_iterator(texts(), trainer)
    vocab = tokenizer.get_vocab(with_added_tokens=False)
    return sorted(vocab, key=vocab.__getitem__)


def load_or_train(workdir: str, texts: Iterable[str] | Callable[[], Iterable[str]],
                  vocab_size: int, *, lowercase: bool,
                  vocab_file: str = "", min_frequency: int = 2, limit_alphabet: int = 0,
                  is_writer: bool = True, checkpointed: bool = False) -> WordPiece:
    """The vocabulary of a run: `vocab_file` (a checkpoint's; a settings file
    beside it must not declare the other casing), else the workdir's (its
    saved options must match), else trained on `texts` and saved there by the
    writer (process 0; the others wait behind a barrier). `checkpointed`: the
    workdir holds checkpoints trained with it, so an absent one is an error."""
    if vocab_file:
        _check_declared_casing(vocab_file, lowercase)
        return WordPiece.from_vocab_file(vocab_file, lowercase=lowercase)
    directory = os.path.join(workdir, VOCAB_DIR)
    path = os.path.join(directory, VOCAB_FILE)
    requested = {"lowercase": bool(lowercase), "vocab_size": vocab_size}
    if os.path.isfile(path):
        vocab = WordPiece.load(directory)
        saved = {"lowercase": vocab.lowercase,
                 "vocab_size": vocab.requested_size or vocab.size}
        if limit_alphabet or vocab.limit_alphabet:
            requested["limit_alphabet"] = limit_alphabet
            saved["limit_alphabet"] = vocab.limit_alphabet
        if saved != requested:
            raise DataError(path, f"made with {saved}, config.data asks for {requested}",
                            "use the workdir's config or a new workdir")
        return vocab
    if checkpointed:
        raise missing_under_checkpoints(path, workdir)
    if not is_writer:
        raise FileNotFoundError(f"{path}: missing; process 0 trains it first")
    vocab = WordPiece.train(texts, vocab_size=vocab_size, lowercase=lowercase,
                            min_frequency=min_frequency, limit_alphabet=limit_alphabet)
    vocab.save(directory)
    return vocab


def declared_casings(folder: str) -> list[tuple[str, str, bool]]:
    """`(file, key, lowercase)` of each casing a settings file in `folder`
    declares: bert_jax's `wordpiece.json` ("lowercase"), then Hugging Face's
    `tokenizer_config.json` ("do_lower_case")."""
    found = []
    for name, key in ((SETTINGS_FILE, "lowercase"), ("tokenizer_config.json", "do_lower_case")):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            declared = read_json(path).get(key)
            if declared is not None:
                found.append((path, key, bool(declared)))
    return found


def _check_declared_casing(vocab_file: str, lowercase: bool) -> None:
    """Raises if a settings file beside `vocab_file` declares the other casing."""
    for settings_path, key, declared in declared_casings(os.path.dirname(vocab_file)):
        if declared != bool(lowercase):
            raise DataError(settings_path, f"{key}={declared}, but lowercase={lowercase} "
                            f"was asked for {vocab_file}", f"use lowercase={bool(declared)}")
