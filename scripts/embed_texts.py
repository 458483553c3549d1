#!/usr/bin/env python3
"""Writes the texts the embedding-model tests compare against llama.cpp (one per line): 200
texts of 1 to about 500 tokens, cut from tests/fixtures/text/gpl-3.txt at seeded random places
and lengths, with the strings tokenizers get wrong mixed in (accents, CJK, emoji, punctuation
runs, odd whitespace, very long words, numbers, code). Deterministic: the same file every run.
Usage: scripts/embed_texts.py OUT.txt"""
import random
import re
import sys
from pathlib import Path

ADVERSARIAL = [
    "Café naïve résumé façade Ångström Øresund Straße",
    "ÉCOLE DES BEAUX-ARTS à Paris, où l'on étudie",
    "日本語のテキストと中文字符，混合 English words",
    "한국어 문장과 ภาษาไทย และ العربية",
    "emoji 😀🎉👩‍👩‍👧 and flags 🇫🇷🇯🇵",
    "!!!???...,,,;;;:::---___***",
    "tabs\tand\t\tmultiple     spaces\u00a0no-break\u3000ideographic",
    "Pneumonoultramicroscopicsilicovolcanoconiosis antidisestablishmentarianism",
    "a" * 120,
    "x" + "yz" * 60 + " end",
    "3.14159 2,718 1e-10 0x1F 42% $9.99 €5 ¥100",
    "fn main() { println!(\"{}\", v[i] + 1); } // code",
    "https://example.com/path?q=a+b&x=1#frag user@example.org",
    "ALL CAPS SENTENCE WITH MIXED cAsE wOrDs",
    "ﬁﬂ ligatures, Ⅻ numerals, ① circled, ｆｕｌｌｗｉｄｔｈ",
    "Ελληνικά κείμενα και русский текст",
    "[CLS] [SEP] [MASK] [UNK] [PAD] look like special tokens",
    "don't won't I'm you're it's can't",
    "a",
    "?",
]


def main(out: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    words = re.sub(r"\s+", " ", (root / "tests/fixtures/text/gpl-3.txt").read_text()).split(" ")
    rng = random.Random(20261129)
    texts = []
    for i in range(200):
        if i % 5 == 4:
            # an adversarial string alone or inside prose
            s = ADVERSARIAL[(i // 5) % len(ADVERSARIAL)]
            if rng.random() < 0.5:
                at = rng.randrange(len(words) - 40)
                s = " ".join(words[at : at + rng.randrange(1, 30)]) + " " + s
        else:
            # lengths spread from one word to about 500 tokens, short ones more often
            n = max(1, int(360 * rng.random() ** 2))
            at = rng.randrange(len(words) - n)
            s = " ".join(words[at : at + n])
        texts.append(s.replace("\n", " "))
    out.write_text("\n".join(texts) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
