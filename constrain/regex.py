"""ECMA-262 regular expressions (JSON Schema `pattern`) compiled to byte-automaton expressions.

In: a pattern string. Out: an `automaton.Expr` over the UTF-8 bytes of the strings it accepts (search or full match).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from typing import Callable

from constrain import automaton as fa
from constrain.errors import InvalidSchema, UnsupportedSchema

# Dialect (documented on `pattern_expr`): ECMA-262 with the `u` flag, which is what JSON Schema validators use
# (the JSON Schema Test Suite's optional/ecmascript-regex.json says "patterns always use unicode semantics").
# Syntax that only Annex B (non-`u`) accepts is accepted where it has a single meaning: identity escapes of
# punctuation (`\-`, `\@`), a literal `{`, `}` or `]`, and `[\w-.]` (dash literal next to a class escape).

MAX_CP = 0x10FFFF
_Ranges = tuple[tuple[int, int], ...]

_DIGIT: _Ranges = ((0x30, 0x39),)
_WORD: _Ranges = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
# ECMA WhiteSpace + LineTerminator: TAB VT FF SP NBSP ZWNBSP, Unicode Zs, LF CR LS PS.
_SPACE: _Ranges = ((0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                   (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF))
_LINE_TERMINATORS: _Ranges = ((0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029))
_SYNTAX_CHARS = set("^$\\.*+?()[]{}|/")

# General_Category values and their aliases (Unicode PropertyValueAliases.txt, as ECMA-262 table 67 allows).
_GC_ALIASES = {
    "C": ("C", "Other"), "Cc": ("Cc", "Control", "cntrl"), "Cf": ("Cf", "Format"), "Cn": ("Cn", "Unassigned"),
    "Co": ("Co", "Private_Use"), "Cs": ("Cs", "Surrogate"), "L": ("L", "Letter"), "LC": ("LC", "Cased_Letter"),
    "Ll": ("Ll", "Lowercase_Letter"), "Lm": ("Lm", "Modifier_Letter"), "Lo": ("Lo", "Other_Letter"),
    "Lt": ("Lt", "Titlecase_Letter"), "Lu": ("Lu", "Uppercase_Letter"), "M": ("M", "Mark", "Combining_Mark"),
    "Mc": ("Mc", "Spacing_Mark"), "Me": ("Me", "Enclosing_Mark"), "Mn": ("Mn", "Nonspacing_Mark"),
    "N": ("N", "Number"), "Nd": ("Nd", "Decimal_Number", "digit"), "Nl": ("Nl", "Letter_Number"),
    "No": ("No", "Other_Number"), "P": ("P", "Punctuation", "punct"), "Pc": ("Pc", "Connector_Punctuation"),
    "Pd": ("Pd", "Dash_Punctuation"), "Pe": ("Pe", "Close_Punctuation"), "Pf": ("Pf", "Final_Punctuation"),
    "Pi": ("Pi", "Initial_Punctuation"), "Po": ("Po", "Other_Punctuation"), "Ps": ("Ps", "Open_Punctuation"),
    "S": ("S", "Symbol"), "Sc": ("Sc", "Currency_Symbol"), "Sk": ("Sk", "Modifier_Symbol"),
    "Sm": ("Sm", "Math_Symbol"), "So": ("So", "Other_Symbol"), "Z": ("Z", "Separator"),
    "Zl": ("Zl", "Line_Separator"), "Zp": ("Zp", "Paragraph_Separator"), "Zs": ("Zs", "Space_Separator"),
}
_GC_BY_NAME = {alias: short for short, aliases in _GC_ALIASES.items() for alias in aliases}


# ---------------------------------------------------------------------------
# Code-point sets (sorted, disjoint, inclusive ranges)
# ---------------------------------------------------------------------------


def _normalise(ranges) -> _Ranges:
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return tuple((lo, hi) for lo, hi in out)


def _negate(ranges: _Ranges) -> _Ranges:
    out, nxt = [], 0
    for lo, hi in _normalise(ranges):
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CP:
        out.append((nxt, MAX_CP))
    return tuple(out)


@functools.cache
def _category_table() -> dict[str, _Ranges]:
    """Code-point ranges per two-letter General_Category, from this Python's `unicodedata`."""
    table: dict[str, list[tuple[int, int]]] = {}
    start, current = 0, unicodedata.category("\0")
    for cp in range(1, MAX_CP + 2):
        cat = unicodedata.category(chr(cp)) if cp <= MAX_CP else None
        if cat != current:
            table.setdefault(current, []).append((start, cp - 1))
            start, current = cp, cat
    return {cat: tuple(r) for cat, r in table.items()}


def _category_ranges(short: str) -> _Ranges:
    table = _category_table()
    if short == "LC":
        members = ["Lu", "Ll", "Lt"]
    elif len(short) == 1:
        members = [cat for cat in table if cat[0] == short]
    else:
        members = [short]
    return _normalise(r for cat in members for r in table.get(cat, ()))


# ---------------------------------------------------------------------------
# Parser: pattern text -> tree of tuples
#   ("set", ranges) | ("seq", items) | ("alt", branches) | ("rep", node, lo, hi) | ("bol",) | ("eol",)
#   | ("look", negative, node, offset)
# ---------------------------------------------------------------------------


# Groups (and lookaheads) nest at most this deep: the parser and the automaton's builders recurse once per level, and
# past a fixed bound a pattern is refused at its offset instead of running out of Python's stack (a few hundred levels,
# fewer the deeper the caller's stack). Real patterns nest far less: at most 8 deep in every schema of ../shared/data.
MAX_GROUP_DEPTH = 64


class _Parser:
    def __init__(self, pattern: str, pointer: str):
        self.src = pattern
        self.pos = 0
        self.pointer = pointer
        self.depth = 0  # groups open around the current position

    def open_group(self, start: int) -> None:
        self.depth += 1
        if self.depth > MAX_GROUP_DEPTH:
            raise self.unsupported(f"groups nested more than {MAX_GROUP_DEPTH} deep", start)

    def invalid(self, what: str, at: int | None = None) -> InvalidSchema:
        at = self.pos if at is None else at
        return InvalidSchema(f"malformed regular expression {self.src!r}: {what} at offset {at}", pointer=self.pointer)

    def unsupported(self, what: str, at: int | None = None) -> UnsupportedSchema:
        at = self.pos if at is None else at
        return UnsupportedSchema(f"regular expression {self.src!r}: {what} at offset {at} is not supported",
                                 pointer=self.pointer)

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.src[i] if i < len(self.src) else ""

    def parse(self) -> tuple:
        node = self.disjunction()
        if self.pos < len(self.src):
            raise self.invalid("unmatched ')'")
        return node

    def disjunction(self) -> tuple:
        branches = [self.alternative()]
        while self.peek() == "|":
            self.pos += 1
            branches.append(self.alternative())
        return branches[0] if len(branches) == 1 else ("alt", tuple(branches))

    def alternative(self) -> tuple:
        items = []
        while self.pos < len(self.src) and self.src[self.pos] not in "|)":
            items.append(self.term())
        return items[0] if len(items) == 1 else ("seq", tuple(items))

    def term(self) -> tuple:
        start, c = self.pos, self.peek()
        assertion = True
        if c == "^":
            self.pos += 1
            atom: tuple = ("bol",)
        elif c == "$":
            self.pos += 1
            atom = ("eol",)
        elif c == "\\" and self.peek(1) in ("b", "B"):
            raise self.unsupported(f"word-boundary assertion \\{self.peek(1)}")
        elif self.src.startswith(("(?=", "(?!"), start):
            self.pos += 3
            self.open_group(start)
            body = self.disjunction()
            self.expect_close(start)
            atom = ("look", self.src[start + 2] == "!", body, start)
        elif self.src.startswith(("(?<=", "(?<!"), start):
            raise self.unsupported("lookbehind assertion")
        else:
            assertion = False
            atom = self.atom()
        quantifier = self.quantifier()
        if quantifier is None:
            return atom
        if assertion:
            if atom[0] == "look":
                raise self.unsupported("quantified lookahead assertion", start)
            raise self.invalid("nothing to repeat", start)
        return ("rep", atom, *quantifier)

    def expect_close(self, start: int) -> None:
        if self.peek() != ")":
            raise self.invalid("unterminated group", start)
        self.pos += 1
        self.depth -= 1

    def atom(self) -> tuple:
        start, c = self.pos, self.peek()
        if c == "(":
            if self.src.startswith("(?:", start):
                self.pos += 3
            elif self.src.startswith("(?<", start):
                m = re.compile(r"\(\?<([A-Za-z_$][A-Za-z0-9_$]*)>").match(self.src, start)
                if m is None:
                    raise self.invalid("bad group name")
                self.pos = m.end()
            elif self.peek(1) == "?":
                if re.compile(r"\(\?[a-zA-Z-]+[:)]").match(self.src, start):
                    raise self.unsupported("inline modifier group")
                raise self.invalid("invalid group")
            else:
                self.pos += 1
            self.open_group(start)
            body = self.disjunction()
            self.expect_close(start)
            return body
        if c in ("*", "+", "?"):
            raise self.invalid("nothing to repeat")
        if c == "{":
            if re.compile(r"\{\d+(,\d*)?\}").match(self.src, start):
                raise self.invalid("nothing to repeat")
            if re.compile(r"\{,\d+\}").match(self.src, start):
                # ECMA (Annex B) reads "{,n}" as literal text, Python and others as a quantifier.
                raise self.unsupported("ambiguous '{,n}'")
        if c == "[":
            return ("set", self.char_class())
        if c == ".":
            self.pos += 1
            return ("set", _negate(_LINE_TERMINATORS))
        if c == "\\":
            return self.atom_escape()
        cp = self.literal_char()
        return ("set", ((cp, cp),))

    def literal_char(self) -> int:
        cp = ord(self.src[self.pos])
        self.pos += 1
        if 0xD800 <= cp <= 0xDBFF and 0xDC00 <= ord(self.peek() or "\0") <= 0xDFFF:
            cp = 0x10000 + ((cp - 0xD800) << 10) + (ord(self.src[self.pos]) - 0xDC00)
            self.pos += 1
        return cp

    def quantifier(self) -> tuple[int, int | None] | None:
        c = self.peek()
        if c == "*":
            bounds: tuple[int, int | None] = (0, None)
            self.pos += 1
        elif c == "+":
            bounds = (1, None)
            self.pos += 1
        elif c == "?":
            bounds = (0, 1)
            self.pos += 1
        elif c == "{":
            m = re.compile(r"\{(\d+)(?:(,)(\d*))?\}").match(self.src, self.pos)
            if m is None:
                return None  # a literal '{' (Annex B); the next term reads it
            lo = int(m.group(1))
            hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if hi is not None and hi < lo:
                raise self.invalid("numbers out of order in {} quantifier")
            bounds = (lo, hi)
            self.pos = m.end()
        else:
            return None
        if self.peek() == "?":  # lazy: same language
            self.pos += 1
        return bounds

    def atom_escape(self) -> tuple:
        c = self.peek(1)
        if c in ("d", "D", "s", "S", "w", "W", "p", "P"):
            return ("set", self.class_escape())
        if c in "123456789" and c:
            raise self.unsupported("backreference")
        if c == "k":
            raise self.unsupported("named backreference \\k")
        cp = self.char_escape(in_class=False)
        return ("set", ((cp, cp),))

    def class_escape(self) -> _Ranges:
        c = self.peek(1)
        self.pos += 2
        base = {"d": _DIGIT, "s": _SPACE, "w": _WORD}.get(c.lower())
        if base is not None:
            return base if c.islower() else _negate(base)
        return self.property(negated=c == "P")

    def property(self, negated: bool) -> _Ranges:
        start = self.pos - 2
        m = re.compile(r"\{([A-Za-z0-9_]+)(?:=([A-Za-z0-9_]+))?\}").match(self.src, self.pos)
        if m is None:
            raise self.invalid("bad \\p{...} property escape", start)
        self.pos = m.end()
        name, value = m.group(1), m.group(2)
        if value is not None:
            if name not in ("General_Category", "gc"):
                raise self.unsupported(f"Unicode property {name}=", start)
            name = value
            if name not in _GC_BY_NAME:
                raise self.invalid(f"unknown General_Category value {value!r}", start)
        if name in _GC_BY_NAME:
            ranges = _category_ranges(_GC_BY_NAME[name])
        elif name == "Any":
            ranges = ((0, MAX_CP),)
        elif name == "ASCII":
            ranges = ((0, 0x7F),)
        elif name == "Assigned":
            ranges = _negate(_category_ranges("Cn"))
        else:
            raise self.unsupported(f"Unicode property {name}", start)
        return _negate(ranges) if negated else ranges

    def char_escape(self, in_class: bool) -> int:
        """One escaped code point starting at the backslash; moves past it."""
        start = self.pos
        c = self.peek(1)
        if not c:
            raise self.invalid("'\\' at end of pattern")
        self.pos += 2
        simple = {"t": 9, "n": 10, "v": 11, "f": 12, "r": 13}
        if c in simple:
            return simple[c]
        if c == "0":
            if self.peek().isdigit():
                raise self.unsupported("legacy octal escape", start)
            return 0
        if c == "c":
            letter = self.peek()
            if not ("a" <= letter.lower() <= "z"):
                raise self.unsupported("\\c not followed by a letter", start)
            self.pos += 1
            return ord(letter) % 32
        if c == "x":
            m = re.compile(r"[0-9A-Fa-f]{2}").match(self.src, self.pos)
            if m is None:
                raise self.invalid("bad \\x escape", start)
            self.pos = m.end()
            return int(m.group(), 16)
        if c == "u":
            return self.unicode_escape(start)
        if in_class and c == "b":
            return 8
        if in_class and c == "-":
            return ord("-")
        if c.isalnum():
            raise self.unsupported(f"escape \\{c} (no single meaning across regex dialects)", start)
        self.pos = start + 1
        return self.literal_char()  # identity escape of punctuation or any non-alphanumeric character

    def unicode_escape(self, start: int) -> int:
        if self.peek() == "{":
            m = re.compile(r"\{([0-9A-Fa-f]+)\}").match(self.src, self.pos)
            if m is None or int(m.group(1), 16) > MAX_CP:
                raise self.invalid("bad \\u{...} escape", start)
            self.pos = m.end()
            return int(m.group(1), 16)
        m = re.compile(r"[0-9A-Fa-f]{4}").match(self.src, self.pos)
        if m is None:
            raise self.invalid("bad \\u escape", start)
        self.pos = m.end()
        cp = int(m.group(), 16)
        trail = re.compile(r"\\u(D[C-Fc-f][0-9A-Fa-f]{2})").match(self.src, self.pos)
        if 0xD800 <= cp <= 0xDBFF and trail is not None:  # a surrogate pair written as two escapes
            self.pos = trail.end()
            cp = 0x10000 + ((cp - 0xD800) << 10) + (int(trail.group(1), 16) - 0xDC00)
        return cp

    def char_class(self) -> _Ranges:
        start = self.pos
        self.pos += 1
        negated = self.peek() == "^"
        if negated:
            self.pos += 1
        ranges: list[tuple[int, int]] = []
        while True:
            if self.pos >= len(self.src):
                raise self.invalid("unterminated character class", start)
            if self.peek() == "]":
                self.pos += 1
                break
            lo = self.class_atom()
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                dash = self.pos
                self.pos += 1
                hi = self.class_atom()
                if isinstance(lo, int) and isinstance(hi, int):
                    if lo > hi:
                        raise self.invalid("character class range out of order", dash)
                    ranges.append((lo, hi))
                    continue
                ranges.append((ord("-"), ord("-")))  # Annex B: [\w-.] is \w, '-', '.'
                for side in (lo, hi):
                    ranges.extend(side if isinstance(side, tuple) else [(side, side)])
                continue
            ranges.extend(lo if isinstance(lo, tuple) else [(lo, lo)])
        out = _normalise(ranges)
        return _negate(out) if negated else out

    def class_atom(self) -> int | _Ranges:
        if self.peek() == "\\":
            if self.peek(1) in ("d", "D", "s", "S", "w", "W", "p", "P"):
                return self.class_escape()
            if self.peek(1) in "123456789" and self.peek(1):
                raise self.unsupported("octal or backreference escape in a character class")
            return self.char_escape(in_class=True)
        return self.literal_char()


# ---------------------------------------------------------------------------
# Languages. A "piece" is a function (a, b) -> (eps, full): the strings a subpattern can match, given whether
# the match starts at the start of the input (a) and ends at its end (b); eps says whether "" is among them.
# That is how ^ and $ anywhere, and lookaheads at the top of a branch, stay exact under search semantics.
# ---------------------------------------------------------------------------

_Lang = tuple[bool, fa.Expr]
_ANY = fa.chars([(0, MAX_CP)])
_ANY_STAR = fa.repeat(_ANY, 0)
_ANY_PLUS = fa.repeat(_ANY, 1)


class _Piece:
    __slots__ = ("fn", "uses_a", "uses_b", "cache")

    def __init__(self, fn: Callable[[bool, bool], _Lang], uses_a: bool, uses_b: bool):
        self.fn, self.uses_a, self.uses_b, self.cache = fn, uses_a, uses_b, {}

    def __call__(self, a: bool, b: bool) -> _Lang:
        key = (a and self.uses_a, b and self.uses_b)
        if key not in self.cache:
            self.cache[key] = self.fn(a, b)
        return self.cache[key]

    @property
    def anchored(self) -> bool:
        return self.uses_a or self.uses_b


def _const(lang: _Lang) -> _Piece:
    return _Piece(lambda a, b: lang, False, False)


class _Builder:
    def __init__(self, parser: _Parser):
        self.parser = parser
        self.nonempty: dict[int, tuple[fa.Expr, fa.Expr]] = {}
        self.anchor_memo: dict[int, tuple[bool, bool]] = {}

    def ne(self, lang: _Lang) -> fa.Expr:
        eps, full = lang
        if not eps:
            return full
        key = id(full)
        if key not in self.nonempty:  # memoised: the automaton caches a difference by identity
            self.nonempty[key] = (full, fa.difference(full, fa.EMPTY))
        return self.nonempty[key][1]

    def anchors(self, node: tuple) -> tuple[bool, bool]:
        key = id(node)
        if key not in self.anchor_memo:
            kind = node[0]
            if kind == "bol":
                result = (True, False)
            elif kind == "eol":
                result = (False, True)
            elif kind == "set":
                result = (False, False)
            elif kind == "look":
                result = (True, False)
            else:
                children = node[1] if kind in ("seq", "alt") else (node[1],)
                flags = [self.anchors(child) for child in children]
                result = (any(f[0] for f in flags), any(f[1] for f in flags))
            self.anchor_memo[key] = result
        return self.anchor_memo[key]

    def piece(self, node: tuple) -> _Piece:
        kind = node[0]
        uses_a, uses_b = self.anchors(node)
        if kind == "set":
            ranges = node[1]
            return _const((False, fa.chars(ranges) if ranges else fa.NOTHING))
        if kind == "bol":
            return _Piece(lambda a, b: (a, fa.EMPTY if a else fa.NOTHING), True, False)
        if kind == "eol":
            return _Piece(lambda a, b: (b, fa.EMPTY if b else fa.NOTHING), False, True)
        if kind == "look":
            raise self.parser.unsupported("lookahead inside a group, alternation or quantifier", node[3])
        if kind == "alt":
            parts = [self.piece(branch) for branch in node[1]]

            def alt(a: bool, b: bool) -> _Lang:
                langs = [p(a, b) for p in parts]
                return any(e for e, _ in langs), fa.union(*(f for _, f in langs))
            return _Piece(alt, uses_a, uses_b)
        if kind == "seq":
            return self.sequence(list(node[1]), _const((True, fa.EMPTY)), top=False)
        if kind == "rep":
            return self.repetition(self.piece(node[1]), node[2], node[3])
        raise AssertionError(f"unknown regex node {kind}")

    def sequence(self, items: list[tuple], tail: _Piece, top: bool) -> _Piece:
        """items followed by tail, folded from the right; lookaheads only when tail runs to the input end (top)."""
        acc = tail
        run: list[tuple] = []  # anchor-free items, concatenated without case analysis

        def flush(acc: _Piece) -> _Piece:
            if not run:
                return acc
            langs = [self.piece(item)(False, False) for item in reversed(run)]
            run.clear()
            lang = (all(e for e, _ in langs), fa.concat(*(f for _, f in langs)))
            return self.concat(_const(lang), acc)

        for item in reversed(items):
            if item[0] == "look":
                if not top:
                    raise self.parser.unsupported("lookahead inside a group, alternation or quantifier", item[3])
                acc = flush(acc)
                acc = self.intersect(acc, self.lookahead(item))
            elif item[0] == "seq":
                acc = flush(acc)
                acc = self.sequence(list(item[1]), acc, top)
            elif self.anchors(item) == (False, False):
                run.append(item)
            else:
                acc = flush(acc)
                acc = self.concat(self.piece(item), acc)
        return flush(acc)

    def lookahead(self, node: tuple) -> _Piece:
        """The suffixes of the input, from this position on, that satisfy the assertion."""
        _, negative, body, _ = node
        inner = self.search_suffix(body)

        def look(a: bool, b: bool) -> _Lang:
            eps, full = inner(a, True)
            return (not eps, fa.difference(_ANY_STAR, full)) if negative else (eps, full)
        return _Piece(look, True, False)

    def search_suffix(self, node: tuple, tail: _Piece | None = None) -> _Piece:
        """Strings that start with a match of node (lookaheads allowed at branch level) and run to the input end."""
        tail = _const((True, _ANY_STAR)) if tail is None else tail
        branches = node[1] if node[0] == "alt" else (node,)
        parts = [self.sequence(list(br[1]) if br[0] == "seq" else [br], tail, top=True) for br in branches]
        if len(parts) == 1:
            return parts[0]

        def alt(a: bool, b: bool) -> _Lang:
            langs = [p(a, b) for p in parts]
            return any(e for e, _ in langs), fa.union(*(f for _, f in langs))
        return _Piece(alt, any(p.uses_a for p in parts), any(p.uses_b for p in parts))

    def concat(self, p1: _Piece, p2: _Piece) -> _Piece:
        if not p1.anchored and not p2.anchored:
            (e1, f1), (e2, f2) = p1(False, False), p2(False, False)
            return _const((e1 and e2, fa.concat(f1, f2)))

        def cat(a: bool, b: bool) -> _Lang:
            (e1, _), (e2, _) = p1(a, b), p2(a, b)
            parts = [fa.EMPTY] if e1 and e2 else []
            if p1(a, False)[0]:  # p1 matches "" here and p2 something non-empty
                parts.append(self.ne(p2(a, b)))
            if p2(False, b)[0]:
                parts.append(self.ne(p1(a, b)))
            parts.append(fa.concat(self.ne(p1(a, False)), self.ne(p2(False, b))))
            return e1 and e2, fa.union(*parts)
        return _Piece(cat, p1.uses_a or p2.uses_a, p1.uses_b or p2.uses_b)

    def intersect(self, p1: _Piece, p2: _Piece) -> _Piece:
        def both(a: bool, b: bool) -> _Lang:
            (e1, f1), (e2, f2) = p1(a, b), p2(a, b)
            return e1 and e2, fa.intersect(f1, f2)
        return _Piece(both, p1.uses_a or p2.uses_a, p1.uses_b or p2.uses_b)

    def repetition(self, body: _Piece, lo: int, hi: int | None) -> _Piece:
        if hi == 0:
            return _const((True, fa.EMPTY))
        if not body.anchored:
            eps, full = body(False, False)
            return _const((lo == 0 or eps, fa.repeat(full, lo, hi)))

        def rep(a: bool, b: bool) -> _Lang:
            # m non-empty iterations; the other lo - m (if m < lo) match "" before, between or after them.
            front, back, middle = body(a, False)[0], body(False, b)[0], body(False, False)[0]
            one_ok = lo <= 1 or front or back
            many_from = 2 if (front or back or middle) else max(lo, 2)
            eps = lo == 0 or body(a, b)[0]
            parts = [fa.EMPTY] if eps else []
            if one_ok:
                parts.append(self.ne(body(a, b)))
            if hi is None or hi >= many_from:
                inner = fa.repeat(self.ne(body(False, False)), many_from - 2, None if hi is None else hi - 2)
                parts.append(fa.concat(self.ne(body(a, False)), inner, self.ne(body(False, b))))
            return eps, fa.union(*parts)
        return _Piece(rep, body.uses_a, body.uses_b)


def _parse(pattern: str, pointer: str) -> tuple[_Parser, tuple]:
    if not isinstance(pattern, str):
        raise InvalidSchema(f"a regular expression must be a string, got {type(pattern).__name__}", pointer=pointer)
    parser = _Parser(pattern, pointer)
    return parser, parser.parse()


def pattern_expr(pattern: str, *, pointer: str = "") -> fa.Expr:
    """The strings that JSON Schema's `pattern` keyword accepts (a search: unanchored unless `^`/`$` say so).

    Dialect: ECMA-262 with the `u` flag (code points, not UTF-16 units), no other flags: `.` excludes only
    \\n \\r \\u2028 \\u2029; `\\d` `\\w` are ASCII; `\\s` is ECMA white space; `\\u{...}` is a code point and
    `\\uD83D\\uDE00` one code point; `\\p{...}` supports General_Category values (Unicode of this Python's
    `unicodedata`) and Any/ASCII/Assigned. Lookaheads are exact at the top level of an alternative. Annex B
    leniencies with one meaning are accepted (`\\-`, literal `{`, `[\\w-.]`).

    Args:
        pattern: the regular expression text.
        pointer: JSON Pointer of the pattern, reported in errors.
    Returns:
        An expression for the UTF-8 bytes of every accepted string (never a surrogate, never invalid UTF-8).
    Raises:
        InvalidSchema: the pattern is malformed.
        UnsupportedSchema: backreferences, lookbehind, `\\b`/`\\B`, nested lookaheads, ambiguous escapes,
            other Unicode properties; the message names the construct and its offset.
    """
    parser, node = _parse(pattern, pointer)
    suffix = _Builder(parser).search_suffix(node)
    at_start, elsewhere = suffix(True, True), suffix(False, True)
    if not suffix.uses_a:
        return fa.concat(_ANY_STAR, at_start[1])
    return fa.union(at_start[1], fa.concat(_ANY_PLUS, elsewhere[1]))


def regex_expr(pattern: str, *, pointer: str = "") -> fa.Expr:
    """The strings that `pattern` matches in full (as if wrapped in `^(?:...)$`); dialect as in `pattern_expr`.

    Args:
        pattern: the regular expression text.
        pointer: JSON Pointer of the pattern, reported in errors.
    Returns:
        An expression for the UTF-8 bytes of every string the whole of which the pattern matches.
    Raises:
        InvalidSchema: the pattern is malformed.
        UnsupportedSchema: as for `pattern_expr`.
    """
    parser, node = _parse(pattern, pointer)
    return _Builder(parser).search_suffix(node, _const((True, fa.EMPTY)))(True, True)[1]
