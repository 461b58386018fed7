"""Word count in Python: the count of every word in the lines pushed so far,
kept up to date as lines are added and deleted.

The same circuit as examples/wordcount (Rust): the same words (split on
white space, punctuation trimmed from both ends, lower-cased), the same
output records ``{"word": …, "count": …}``.
"""

import sluice


def trim(w):
    """``w`` without what is not a letter or digit at either end."""
    start, end = 0, len(w)
    while start < end and not w[start].isalnum():
        start += 1
    while end > start and not w[end - 1].isalnum():
        end -= 1
    return w[start:end]


def words(line):
    """The line's words: split on white space, trimmed of what is not a
    letter or digit at both ends, lower-cased; empty ones dropped."""
    out = []
    for w in line.split():
        if not w.isalnum():
            w = trim(w)
            if not w:
                continue
        out.append(w.lower())
    return out


def build(c):
    (
        c.input("lines")
        .flat_map(words)
        .count_by(lambda word: word)
        .map(lambda pair: {"word": pair[0], "count": pair[1]})
        .output("counts")
    )


Circuit = sluice.export(build)
