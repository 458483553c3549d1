"""A plain GBNF recognizer (llama.cpp's grammar format), independent of the server's grammar
engine: `accepts(grammar_text, output)` says whether the whole output is a sentence of the
grammar. It reads rules, alternatives, literals with escapes, character classes (ranges,
negation), groups and the `* + ? {m} {m,} {m,n}` repetitions, and matches by backtracking
over every way each item can end (memoized by item and position)."""
import re
import sys

_ESC = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "-": "-", "^": "^", "/": "/"}


class _Parser:
    def __init__(self, text):
        # comments run from # to the end of the line (outside literals and classes)
        self.s = text
        self.i = 0

    def ws(self, newlines=True):
        while self.i < len(self.s):
            c = self.s[self.i]
            if c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.i += 1
            elif c in " \t" or (newlines and c in "\r\n"):
                self.i += 1
            else:
                break

    def char(self):
        c = self.s[self.i]
        if c != "\\":
            self.i += 1
            return c
        e = self.s[self.i + 1]
        if e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            v = int(self.s[self.i + 2:self.i + 2 + n], 16)
            self.i += 2 + n
            return chr(v)
        self.i += 2
        return _ESC[e]

    def name(self):
        m = re.compile(r"[A-Za-z0-9_-]+").match(self.s, self.i)
        if not m:
            raise ValueError(f"name expected at {self.i}: {self.s[self.i:self.i + 20]!r}")
        self.i = m.end()
        return m.group()

    def rules(self):
        rules = {}
        self.ws()
        while self.i < len(self.s):
            n = self.name()
            self.ws()
            assert self.s.startswith("::=", self.i), f"::= expected after {n}"
            self.i += 3
            rules[n] = self.alternatives(top=True)
            self.ws()
        return rules

    def alternatives(self, top=False):
        alts = [self.sequence(top)]
        while self.i < len(self.s) and self.s[self.i] == "|":
            self.i += 1
            alts.append(self.sequence(top))
        return ("alt", alts)

    def at_rule_start(self):
        return re.compile(r"[A-Za-z0-9_-]+\s*::=").match(self.s, self.i) is not None

    def sequence(self, top):
        items = []
        while True:
            self.ws()
            if self.i >= len(self.s) or self.s[self.i] in "|)" or (top and self.at_rule_start()):
                return ("seq", items)
            item = self.atom()
            self.ws(newlines=False)
            while self.i < len(self.s) and self.s[self.i] in "*+?{":
                c = self.s[self.i]
                if c == "{":
                    j = self.s.index("}", self.i)
                    parts = self.s[self.i + 1:j].split(",")
                    lo = int(parts[0])
                    hi = lo if len(parts) == 1 else (int(parts[1]) if parts[1].strip() else None)
                    self.i = j + 1
                else:
                    lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                    self.i += 1
                item = ("rep", item, lo, hi)
            items.append(item)

    def atom(self):
        c = self.s[self.i]
        if c == '"':
            self.i += 1
            out = ""
            while self.s[self.i] != '"':
                out += self.char()
            self.i += 1
            return ("lit", out)
        if c == "[":
            self.i += 1
            neg = self.s[self.i] == "^"
            if neg:
                self.i += 1
            ranges = []
            while self.s[self.i] != "]":
                a = self.char()
                b = a
                if self.s[self.i] == "-" and self.s[self.i + 1] != "]":
                    self.i += 1
                    b = self.char()
                ranges.append((a, b))
            self.i += 1
            return ("cls", neg, ranges)
        if c == "(":
            self.i += 1
            alt = self.alternatives()
            assert self.s[self.i] == ")", "unclosed group"
            self.i += 1
            return alt
        return ("ref", self.name())


def accepts(grammar, text, root="root", prefix=False):
    """Whether `text` is a sentence of the grammar; with `prefix`, whether it is the start of
    one (a generation cut off by its length limit)."""
    rules = _Parser(grammar).rules()
    end = len(text)
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))
    memo = {}

    def ends(item, pos):
        key = (id(item), pos)
        if key in memo:
            return memo[key]
        memo[key] = set()  # no left recursion in the grammars checked; guards against loops
        kind = item[0]
        out = set()
        if kind == "lit":
            if text.startswith(item[1], pos):
                out.add(pos + len(item[1]))
            elif prefix and item[1].startswith(text[pos:]):
                out.add(end)
        elif kind == "cls":
            if prefix and pos == end:
                out.add(end)
            elif pos < len(text):
                ch = text[pos]
                hit = any(a <= ch <= b for a, b in item[2])
                if hit != item[1]:
                    out.add(pos + 1)
        elif kind == "ref":
            out = ends(rules[item[1]], pos)
        elif kind == "alt":
            for a in item[1]:
                out |= ends(a, pos)
        elif kind == "seq":
            cur = {pos}
            for it in item[1]:
                nxt = set()
                for p in cur:
                    nxt |= ends(it, p)
                cur = nxt
                if not cur:
                    break
            out = cur
        elif kind == "rep":
            _, inner, lo, hi = item
            cur, n = {pos}, 0
            if lo == 0:
                out |= cur
            seen = set(cur)
            while cur and (hi is None or n < hi):
                nxt = set()
                for p in cur:
                    nxt |= ends(inner, p)
                n += 1
                if n >= lo:
                    out |= nxt
                cur = nxt - seen if hi is None else nxt
                seen |= nxt
        memo[key] = out
        return out

    return len(text) in ends(rules[root], 0)


if __name__ == "__main__":
    g = open(sys.argv[1], encoding="utf-8").read()
    print(accepts(g, open(sys.argv[2], encoding="utf-8").read()))
