#!/usr/bin/env python3
"""Generate the compact Unicode tables the tokenizer's pre-tokenizers use, in place in llm.hpp.

Usage: python3 scripts/gen-unicode-tables.py [HEADER]   (default: llm.hpp)

The tables sit between the lines "// BEGIN generated unicode tables" and "// END generated unicode
tables"; everything between them is replaced.

Everything comes from Python's own `unicodedata` module, so the Unicode version is the one of the
Python that runs this script (it is written into the header of the output). Tables:

- kUnicodeRanges: sorted run-length table over all code points. Entry = (first << 8) | flags and covers
  first .. next entry's first - 1. flags bits 0-2 = category class (see UCAT_* below; the general
  categories the pre-tokenizer regexes test with \\p{..}), bit 3 = White_Space (the Unicode property,
  which is what the reference tokenizer's `\\s` means; note it differs from str.isspace(), which also
  accepts U+001C..U+001F).
- kUnicodeLower: (code point, lowercase) pairs where they differ, the first code point of Python's
  str.lower() (as the reference's unicode_tolower).
- kUnicodeNfdFirst: inclusive (first, last, base) runs: the first code point of each code point's NFD
  decomposition where it differs (the reference's WordPiece normalizer keeps only that one).
- kDeepseekLetterRanges: the cased-letter class of DeepSeek LLM's pre-tokenizer regex, as inclusive
  [lo, hi] pairs. The class is data of that model's tokenizer (tokenizer.json), so it is transcribed below
  rather than derived from categories (it was made from an older Unicode version).
"""
import sys
import unicodedata

MAX_CP = 0x110000

# Category classes; must match the UCat enum in llm.hpp (section 10, tokenizer).
UCAT_OTHER, UCAT_NUMBER, UCAT_LETTER, UCAT_MARK, UCAT_PUNCT, UCAT_SYMBOL, UCAT_CONTROL = range(7)
WS_BIT = 0x08


def category_class(cp):
    c = unicodedata.category(chr(cp))
    first = c[0]
    if first == "N":
        return UCAT_NUMBER
    if first == "L":
        return UCAT_LETTER
    if first == "M":
        return UCAT_MARK
    if first == "P":
        return UCAT_PUNCT
    if first == "S":
        return UCAT_SYMBOL
    if c in ("Cc", "Cf", "Co", "Cs"):
        return UCAT_CONTROL
    return UCAT_OTHER  # Cn (unassigned) and Z* (all of Z* is White_Space anyway)


# The White_Space property (PropList.txt); stable since Unicode 6.3.
WHITE_SPACE = set(range(0x09, 0x0E)) | {0x20, 0x85, 0xA0, 0x1680} | set(range(0x2000, 0x200B)) | \
    {0x2028, 0x2029, 0x202F, 0x205F, 0x3000}

# DeepSeek LLM pre-tokenizer, second regex "\s?[A-Za-zµÀ-ÖØ-öø-ƺ...]+": its character class as code point ranges
# (single code points as 1-tuples). Kept in hex on purpose: some of its characters (U+1F7D, U+1FBE, U+1FD3,
# U+1FDB, U+2126, U+212A) have canonical equivalents that an NFC-normalizing editor would silently swap in.
DEEPSEEK_LETTERS = [
    (0x0041, 0x005A), (0x0061, 0x007A), (0x00B5,), (0x00C0, 0x00D6), (0x00D8, 0x00F6),
    (0x00F8, 0x01BA), (0x01BC, 0x01BF), (0x01C4, 0x0293), (0x0295, 0x02AF), (0x0370, 0x0373),
    (0x0376,), (0x0377,), (0x037B, 0x037D), (0x037F,), (0x0386,), (0x0388, 0x038A), (0x038C,),
    (0x038E, 0x03A1), (0x03A3, 0x03F5), (0x03F7, 0x0481), (0x048A, 0x052F), (0x0531, 0x0556),
    (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59,), (0x1F5B,), (0x1F5D,),
    (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE,), (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC), (0x1FF2, 0x1FF4),
    (0x1FF6, 0x1FFC), (0x2102,), (0x2107,), (0x210A, 0x2113), (0x2115,), (0x2119, 0x211D),
    (0x2124,), (0x2126,), (0x2128,), (0x212A, 0x212D), (0x212F, 0x2134), (0x2139,),
    (0x213C, 0x213F), (0x2145, 0x2149), (0x214E,), (0x2183,), (0x2184,), (0x2C00, 0x2C7B),
    (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE), (0x2CF2,), (0x2CF3,), (0xA640, 0xA66D), (0xA680, 0xA69B),
    (0xA722, 0xA76F), (0xA771, 0xA787), (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06),
    (0xFB13, 0xFB17), (0xFF21, 0xFF3A), (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3),
    (0x104D8, 0x104FB), (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
]


def merge_ranges(items):
    """Sorted, merged inclusive (lo, hi) pairs from (lo, hi) / (cp,) tuples."""
    out = sorted((t[0], t[-1]) for t in items)
    merged = []
    for lo, hi in out:
        assert lo <= hi
        if merged and lo <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(hi, merged[-1][1]))
        else:
            merged.append((lo, hi))
    return merged


def emit(lines, entries, per_line, fmt):
    """Appends `entries` formatted with fmt, per_line to a row."""
    for i in range(0, len(entries), per_line):
        lines.append("    " + " ".join(fmt % e for e in entries[i:i + per_line]))


def lowercase_pairs():
    return [(cp, ord(chr(cp).lower()[0])) for cp in range(MAX_CP) if ord(chr(cp).lower()[0]) != cp]


def nfd_first_runs():
    runs = []
    for cp in range(MAX_CP):
        base = ord(unicodedata.normalize("NFD", chr(cp))[0])
        if base == cp:
            continue
        if runs and runs[-1][1] == cp - 1 and runs[-1][2] == base:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp, base])
    return [tuple(r) for r in runs]


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "llm.hpp"
    ranges = []
    prev = None
    for cp in range(MAX_CP):
        f = category_class(cp) | (WS_BIT if cp in WHITE_SPACE else 0)
        if f != prev:
            ranges.append((cp, f))
            prev = f
    letters = merge_ranges(DEEPSEEK_LETTERS)

    lines = []
    lines.append("// Generated by scripts/gen-unicode-tables.py from Python %s's unicodedata (Unicode %s)."
                 % (sys.version.split()[0], unicodedata.unidata_version))
    lines.append("// Do not edit; rerun the script instead.")
    lines.append("")
    lines.append("// (first code point << 8) | flags; a run lasts until the next entry's first code point.")
    lines.append("// flags: bits 0-2 UCat (other, number, letter, mark, punct, symbol, control), bit 3 White_Space.")
    lines.append("static const uint32_t kUnicodeRanges[] = {")
    emit(lines, [((cp << 8) | f,) for cp, f in ranges], 8, "0x%07X,")
    lines.append("};")
    lines.append("")
    lines.append("// DeepSeek LLM pre-tokenizer letter class, inclusive [lo, hi] pairs.")
    lines.append("static const uint32_t kDeepseekLetterRanges[][2] = {")
    emit(lines, letters, 5, "{0x%05X, 0x%05X},")
    lines.append("};")
    lines.append("")
    lines.append("// (code point, lowercase code point) where they differ, sorted.")
    lines.append("static const uint32_t kUnicodeLower[][2] = {")
    lower = lowercase_pairs()
    emit(lines, lower, 6, "{0x%05X, 0x%05X},")
    lines.append("};")
    lines.append("")
    lines.append("// Inclusive runs [first, last] of code points whose NFD decomposition starts with `base`, sorted.")
    lines.append("static const uint32_t kUnicodeNfdFirst[][3] = {")
    nfd = nfd_first_runs()
    emit(lines, nfd, 4, "{0x%05X, 0x%05X, 0x%05X},")
    lines.append("};")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    begin = text.index("// BEGIN generated unicode tables")
    begin = text.index("\n", begin) + 1
    end = text.index("// END generated unicode tables")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text[:begin] + "\n".join(lines) + "\n" + text[end:])
    print("wrote %s: %d ranges, %d letter ranges, %d lowercase pairs, %d NFD runs"
          % (path, len(ranges), len(letters), len(lower), len(nfd)))


if __name__ == "__main__":
    main()
