#!/usr/bin/env python3
"""Writes the C program of README.md's API tour to a .c file.

    extract.py README.md tour.c

The program is the one fenced ```c block between the lines
`<!-- tour:begin -->` and `<!-- tour:end -->` of README.md. It is written as
it stands, after one `#line` directive, so that compiler messages point at
README.md's own lines. Exits non-zero naming what is wrong when the markers
or the block are missing or doubled.
"""
import sys

BEGIN, END = "<!-- tour:begin -->", "<!-- tour:end -->"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: extract.py README.md OUT.c")
    src, dst = sys.argv[1], sys.argv[2]
    lines = open(src, encoding="utf-8").read().split("\n")
    begins = [i for i, l in enumerate(lines) if l.strip() == BEGIN]
    ends = [i for i, l in enumerate(lines) if l.strip() == END]
    if len(begins) != 1 or len(ends) != 1 or ends[0] < begins[0]:
        sys.exit("%s: want one '%s' line followed by one '%s' line (found %d and %d)"
                 % (src, BEGIN, END, len(begins), len(ends)))
    section = lines[begins[0] + 1:ends[0]]
    opens = [i for i, l in enumerate(section) if l.strip() == "```c"]
    closes = [i for i, l in enumerate(section) if l.strip() == "```"]
    if len(opens) != 1 or len(closes) != 1 or closes[0] < opens[0]:
        sys.exit("%s: want exactly one ```c block between the tour markers" % src)
    first = begins[0] + 1 + opens[0] + 1  # 0-based index of the block's first line
    code = section[opens[0] + 1:closes[0]]
    with open(dst, "w", encoding="utf-8") as f:
        f.write('#line %d "README.md"\n' % (first + 1))
        f.write("\n".join(code) + "\n")


if __name__ == "__main__":
    main()
