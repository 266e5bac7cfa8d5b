#!/usr/bin/env python3
"""Builds the tokenizer fixtures for tests/inference/test_tokenizer.c.

Trains three small BPE tokenizers with Hugging Face `tokenizers` (the library
behind transformers' fast tokenizers) on a slice of tinyshakespeare plus some
Unicode text, saves their tokenizer.json files, and records the ids HF gives
for a test corpus (and HF's decode of them):

  gpt2_bpe.json   byte-level BPE, GPT-2 pre-tokenizer regex (ByteLevel use_regex)
  llama3_bpe.json byte-level BPE, Llama-3 Split regex + ByteLevel, ignore_merges
  sp_bpe.json     SentencePiece-style BPE as Llama-2 ships it: Prepend/Replace
                  normalizer, byte fallback <0xXX> tokens, Strip decoder
  sp_metaspace_bpe.json  the same model with a Metaspace pre-tokenizer
                  (prepend_scheme "first"), as newer conversions ship it

Output: tests/inference/fixtures/{*.json, tokenizer_expected.json}.
Run: python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers
     /tmp/tokvenv/bin/python tests/ref/tokenizer_ref.py
"""
import json
import os

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "inference", "fixtures")
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

UNICODE_TRAIN = [
    "Café déjà vu, naïve façade, crème brûlée, Straße, Ærø, señor, São Paulo.",
    "Ελληνικά γράμματα και Кириллица тоже.",
    "Zürich, Österreich, Göteborg, Øresund, Łódź.",
    "The year 2024 had 366 days; 3.14159 is pi; 1,000,000 is a million.",
]

CORPUS = [
    "Hello world",
    "First Citizen:\nBefore we proceed any further, hear me speak.",
    "  leading spaces and trailing spaces   ",
    "tabs\tand\ttabs\t\tdouble",
    "Line one\nLine two\n\nLine four\r\nwindows line\n",
    "I'm sure you'll see they've done it; she'd say it's 'quoted' and WE'LL SHOUT IT'S done.",
    "Numbers: 0 7 42 123 4567 89012 3.14159 1,000,000 and 2024-11-29.",
    "Punctuation!!! Really??? (yes) [no] {maybe} <tag> a+b=c; x*y/z %% $5.00 #1 @user ~tilde^ `code` |pipe|",
    "Café déjà vu: naïve façade, crème brûlée, Straße, Ærø, señor.",
    "Ελληνικά και Кириллица mixed with English.",
    "Emoji: 😀 🚀🚀 👍🏽 and ❤️ done.",
    "CJK text: 日本語のテキスト and 中文。",
    "whitespace    runs \n\n\n   before newline\n    indented code",
    "a",
    "",
    " ",
    "\n",
    "Special <|endoftext|> token in the middle<|endoftext|>",
    "ROMEO:\nBut, soft! what light through yonder window breaks?\nIt is the east, and Juliet is the sun.",
    "ümlaut at start, and ending with ümlaut",
    "<s>Hello</s> world <s> again</s>",
]


def random_corpus(n=40, seed=1234):
    """Random mixes of the character classes the pre-tokenizer regexes care
    about (letters, digits, apostrophes, spaces, tabs, CR/LF, punctuation,
    accented letters, emoji), so regex edge cases come up by chance."""
    import random
    rng = random.Random(seed)
    alphabet = list("abcXYZ") + list("0123456789") + ["'", "'s", "'LL", "'d"] + [" ", " ", "  ", "\t", "\n", "\r\n", "\n\n"] + \
        list(".,;!?-()$%") + ["é", "Ü", "ß", "ñ", "Ω", "ж", "😀", "🚀", "²", "½"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 30))) for _ in range(n)]


CORPUS = CORPUS + random_corpus()


def training_text():
    with open(os.path.join(ROOT, "data", "tinyshakespeare.txt"), encoding="utf-8") as f:
        text = f.read()[:200000]
    lines = text.split("\n") + UNICODE_TRAIN * 20
    return lines


def byte_level(pattern):
    tok = Tokenizer(models.BPE(ignore_merges=pattern is not None))
    if pattern is None:
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    return tok


def sentencepiece_like():
    """Trains on Metaspace-split words (SentencePiece never merges across
    spaces), then rewrites the file into Llama-2's layout: <unk> <s> </s>,
    256 byte tokens, then the learned pieces; normalizer Prepend + Replace."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], limit_alphabet=90,
                                  show_progress=False)
    tok.train_from_iterator(training_text(), trainer)
    spec = json.loads(tok.to_str())
    learned = sorted(spec["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab["<0x%02X>" % b] = len(vocab)
    for piece, _ in learned:
        if piece not in vocab:
            vocab[piece] = len(vocab)
    spec["model"]["vocab"] = vocab
    spec["added_tokens"] = [
        {"id": vocab[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True} for t in ("<unk>", "<s>", "</s>")]
    spec["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    spec["pre_tokenizer"] = None
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return Tokenizer.from_str(json.dumps(spec))


def metaspace_variant(sp):
    """The same model in the newer Llama/Mistral layout (transformers'
    legacy=False conversion): no normalizer, a Metaspace pre-tokenizer that
    prepends only at the start of the text and does not split."""
    spec = json.loads(sp.to_str())
    spec["normalizer"] = None
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    return Tokenizer.from_str(json.dumps(spec))


def main():
    os.makedirs(OUT, exist_ok=True)
    sp = sentencepiece_like()
    built = {"gpt2_bpe.json": byte_level(None), "llama3_bpe.json": byte_level(LLAMA3_PATTERN), "sp_bpe.json": sp,
             "sp_metaspace_bpe.json": metaspace_variant(sp)}
    expected = {"tokenizers_version": tokenizers.__version__, "corpus": CORPUS, "files": {}}
    for name, tok in built.items():
        path = os.path.join(OUT, name)
        tok.save(path)
        tok = Tokenizer.from_file(path)  # what the C reader sees
        ids = [tok.encode(text, add_special_tokens=False).ids for text in CORPUS]
        decoded = [tok.decode(i, skip_special_tokens=False) for i in ids]
        expected["files"][name] = {"ids": ids, "decoded": decoded, "vocab_size": tok.get_vocab_size()}
        print("%s: vocab %d, %d corpus tokens" % (name, tok.get_vocab_size(), sum(len(i) for i in ids)))
    # The pre-tokenizer regexes alone, as Hugging Face splits (no byte mapping).
    expected["pieces"] = {}
    for name, pattern in (("gpt2", GPT2_PATTERN), ("llama3", LLAMA3_PATTERN),
                          ("qwen2", LLAMA3_PATTERN.replace(r"\p{N}{1,3}", r"\p{N}"))):
        split = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
        expected["pieces"][name] = [[p for p, _ in split.pre_tokenize_str(text)] for text in CORPUS]
    with open(os.path.join(OUT, "tokenizer_expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=0)


if __name__ == "__main__":
    main()
