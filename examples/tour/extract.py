#!/usr/bin/env python3
"""Writes one C block of README.md to a .c file, so the README's code is
the code that is built.

    extract.py README.md OUT.c [NAME [WRAP]]

The block is the one fenced ```c block between the lines
`<!-- NAME:begin -->` and `<!-- NAME:end -->` of README.md (NAME: "tour"
by default). It is written as it stands, after one `#line` directive, so
that compiler messages point at README.md's own lines. A fragment (not a
whole program) is compiled inside a function: WRAP is a C file whose line
holding `@SNIPPET@` (a comment, so clang-format leaves it) is replaced by
the block. Exits non-zero naming what is wrong
when the markers or the block are missing or doubled.
"""
import sys


def main():
    if len(sys.argv) not in (3, 4, 5):
        sys.exit("usage: extract.py README.md OUT.c [NAME [WRAP]]")
    src, dst = sys.argv[1], sys.argv[2]
    name = sys.argv[3] if len(sys.argv) > 3 else "tour"
    begin, end = "<!-- %s:begin -->" % name, "<!-- %s:end -->" % name
    lines = open(src, encoding="utf-8").read().split("\n")
    begins = [i for i, l in enumerate(lines) if l.strip() == begin]
    ends = [i for i, l in enumerate(lines) if l.strip() == end]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        sys.exit("%s: want one '%s' line followed by one '%s' line (found %d and %d)"
                 % (src, begin, end, len(begins), len(ends)))
    section = lines[begins[0] + 1:ends[0]]
    opens = [i for i, l in enumerate(section) if l.strip() == "```c"]
    closes = [i for i, l in enumerate(section) if l.strip() == "```"]
    if len(opens) != 1 or len(closes) != 1 or closes[0] < opens[0]:
        sys.exit("%s: want exactly one ```c block between the %s markers" % (src, name))
    first = begins[0] + 1 + opens[0] + 1  # 0-based index of the block's first line
    code = ['#line %d "README.md"' % (first + 1)] + section[opens[0] + 1:closes[0]]
    if len(sys.argv) == 5:
        wrap = open(sys.argv[4], encoding="utf-8").read().split("\n")
        at = [i for i, l in enumerate(wrap) if "@SNIPPET@" in l]
        if len(at) != 1:
            sys.exit("%s: want one @SNIPPET@ line" % sys.argv[4])
        code = (['#line 1 "%s"' % sys.argv[4]] + wrap[:at[0]] + code +
                ['#line %d "%s"' % (at[0] + 2, sys.argv[4])] + wrap[at[0] + 1:])
    with open(dst, "w", encoding="utf-8") as f:
        f.write("\n".join(code) + "\n")


if __name__ == "__main__":
    main()
