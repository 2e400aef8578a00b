"""Tests for constrain/regex.py: ECMA-262 `pattern` -> byte automaton, differential against Python `re`."""

from __future__ import annotations

import functools
import random
import re
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from constrain import automaton as fa
from constrain.errors import InvalidSchema, UnsupportedSchema
from constrain.regex import pattern_expr, regex_expr

# Distinct `pattern` values from the jsonschemabench corpus (/work/shared/data/jsonschemabench), a seeded sample.
CORPUS_PATTERNS = [
    "[^a-zA-Z0-9.,()@&' -]",
    '^([a-z][0-9])+$',
    '^Recurrent tumour -',
    '^[\\w\\/\\.:-]+$',
    '^variants$',
    '^....-..-..T..:..:..((\\+|-)..:..|Z)$',
    '^\\S+@\\S+$',
    '^/[^\x00]+$',
    '^[a-z]{2}$',
    '\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}(:\\d{2})?(([+-]\\d{2}(:\\d{2})?)|Z)',
    '^[A-Z][a-zA-Z0-9_]*$',
    '^[a-z0-9A-Z-]*$',
    '/api/v1/user_identities/\\d+/exports',
    '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$',
    '^([0-9]{5})(-([0-9]{4}))?$',
    '^[a-z][a-z0-9-]{3,50}$',
    'int|float|vec2|vec3|vec4',
    '^[a-zA-Z0-9-_.]+$',
    '^[a-z]{1,2}$',
    '^data:image/(jpg|jpeg|png|svg\\+xml);base64,[0-9a-zA-Z+/=]*$',
    '^[a-z0-9]{8}-[a-z0-9]{4}-[a-z0-9]{4}-[a-z0-9]{4}-[a-z0-9]{12}$',
    '^https://ils.rero.ch/api/locations/.+?$',
    '^[A-Za-z][A-Za-z0-9_]*',
    '[0-9a-fA-F]{8}-([0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}',
    'push',
    '^[A-F0-9]+$',
    '^[0-9A-Za-z]{8}-[0-9A-Za-z]{4}-[0-9A-Za-z]{4}-[0-9A-Za-z]{4}-[0-9A-Za-z]{12}$',
    '^[a-z0-9_-]{2,}$',
    '^[^\\.]*$',
    '^[^/]+/[^/]+$',
    '^a',
    '^(IT)[0-9]{11}$',
    '^(\\d+)?$|^$',
    '^file:.+$',
    '^[a-z0-9-\\.]+$',
    '^IGF[a-zA-Z0-9-_]+$',
    '^[0-9]{16}$',
    '^(DE)[0-9]{9}$',
    '^[\\w ]+$',
    '^(9.)?([1-9].){4}[0-9]{1,2}.[0-9]{1,2}$',
    '^[(a-z)|(A-Z)|(0-9)]+$',
    'KAKEN-\\d{8}',
    '^[^/#]+/[^/#]+$',
    '^mystring-[a-zA-Z0-9]+$',
    '^brn:(\\w+):(\\w+):(\\w*):(\\*|[\\w\\-]*\\*?)$',
    '[a-fA-F0-9]{8}-[a-fA-F0-9]{4}-[a-fA-F0-9]{4}-[a-fA-F0-9]{4}-[a-fA-F0-9]{12}',
    '/api/v1/user_identities/\\d+/pdf_manager_batches',
    '/^[0-9]{4}-[0-9]{2}-[0-9]{2}$/',
    'https://example.com/docs/{ns}/{name}',
    '^Primary tumour -',
    '77',
    '[aA][12].*[zZ]',
    'b',
    '^(PT)[0-9]{9}$',
    '^[a-zA-Z][a-zA-Z0-9_]*[a-zA-Z0-9]$',
    '^[A-Za-z0-9:_\\-]+$',
    '\\d{4}-\\d{2}-\\d{2}T\\d{2}:\\d{2}:\\d{2}.\\d{6}',
    'ChainpointSHA256v2',
    '\\w+',
    '.*:.*',
    '^\\./.+$',
    '(\\w+\\.)+\\d+',
    '^[A-Za-z0-9_-]{8}[Q-T][A-Za-z0-9_-][CGKOSWaeimquy26-][A-Za-z0-9_-]{10}[AQgw]$',
    '^file:.+\\.geodatabase?$',
    '^all|tags$',
    '^/?(([a-z0-9]|[a-z0-9][a-z0-9\\-]*[a-z0-9])\\.)*([a-z0-9]|[a-z0-9][a-z0-9\\-]*[a-z0-9])$',
    '^pkg:',
    '^(BE)0[0-9]{9}$',
    '^uk.gov.ons.edc.eq:feedback$',
    '^[a-f0-9]*$',
    '^[a-zA-Z0-9]([a-zA-Z0-9-]+[a-zA-Z0-9])?$',
    '^[-a-zA-Z0-9]+$',
    '^-',
    '[A-Fa-f0-9]{64}',
    '^(\\w\\w\\d)+$',
    '^c(\\d+)m(\\d+)$',
    '^(?:0|[1-9][0-9]*)(?:\\.(?:0|[1-9][0-9]*))*$',
    '1111111111111111111',
    'y$',
    '^[a-z_A-Z0-9]+$',
    '^[0-9]+\\.[0-9]+\\.[0-9]+$',
    '^[0-9A-F]*$',
    '^[a-f0-9]{40}$',
    '^[0-9a-zA-Z_-]+$',
    '^[A-Za-z0-9]{2}(:[A-Za-z0-9]{2}){5}$',
    '(https?://([-\\w\\.]+)+(:\\d+)?(/([\\w/_\\.]*(\\?\\S+)?)?)?)',
    '^[0-9]*$',
    '^(SI)[0-9]{8}$',
    'normal|bold',
    '^[A-Fa-f0-9]{64}$',
    '^(GB)([0-9]{9}([0-9]{3})?|(GD|HA)[0-9]{3})$',
    '^pickedProduct$',
    '^(CZ)[0-9]{8,10}$',
    '\\d{10,11}',
    '^([0-9]{1,4}.[0-9]{1,4}.[0-9]{1,4})|(test)',
    '^[ATCG]+$|^$',
    '^[a-zA-Z0-9_\\.~]+$',
    '[^/]+/.+',
    '/api/v1/user_identities/\\d+/decisions',
    '^([-a-z0-9._/])+$',
    '^([0-9]+)\\.([0-9]+)\\.([0-9]+)(?:(-[0-9A-Za-z-]+(?:\\.[0-9A-Za-z-]+)*))?(?:\\+[0-9A-Za-z-\\-\\.]+)?$',
    '^iglu:([a-zA-Z0-9-_.]+)/([a-zA-Z0-9-_]+)/([a-zA-Z0-9-_]+)/([1-9][0-9]*(?:-(?:0|[1-9][0-9]*)){2})$',
    '^(((/)|(https?://))[_0-9A-Za-z-]{1,}((/([_0-9A-Za-z-]){1,})*))*((#|~)((/([_0-9A-Za-z-]){1,})*)?)?$',
    '^azure-samples/src/main/java/com/microsoft/azure/management/([a-zA-Z]+)/samples/([a-zA-Z0-9]+).java$',
    '^[+-]?(\\d\\d\\d\\d)(-)?(\\d\\d)(-)?(\\d\\d)(T)?(\\d\\d)(:)?(\\d\\d)(:)?(\\d\\d)(\\.\\d+)?(Z|([+-])(\\d\\d)(:)?(\\d\\d))?$',
    '^[0-9]{4}-[01][0-9]-[0-3][0-9]T[0-2][0-9]:[0-5][0-9]:[0-5][0-9][.][0-9]+([+-][0-2][0-9]:[0-5][0-9]|Z)$',
]

# Anchors, lookaheads, classes and code points in places where ECMA and Python agree (after `_to_python`).
TRICKY_PATTERNS = [
    "^a|b$", "(^x)?y", "a^b", "(a|^)b", "(^|x)*y", "x$|^y", "(a$)?b", "^(a|b$)*", "(?:^|,)x(?:,|$)", "(^a)+b",
    "(a|$){2}", "(^|$)", "a^", "a(^|b)", "(a|^)(^|b)c", "a($)?$", "a$b", "(a|b$)+", "(^a|b)+c", "^(?:(^a)|b)*$", "a?^b", "(^)*a", "($)*a", "(?:a|^){3}b",
    "^(?=.*\\d)(?=.*[a-z]).{3,}$", "(?!abc)", "^(?!abc)", "a(?=b)", "a(?!b)", "(?=a$)", "^(?!.*\\s).+$",
    "x(?=y|$)", "(?=(?!a)b)", "^(?:(?=x))x",
    "[^a-z]+", "^[^abc]*$", "^.*$", "a.b", "^..$", "^\\S+$", "\\s", "^[\\s\\d]+$", "^\\W+$", "^\\D\\w$",
    "^😀{2}$", "^[😀-😂]$", "^\\uD83D\\uDE00+$", "^[\\uD83D\\uDE00-\\uD83D\\uDE02]x$", "é+", "^[^é]$",
    "^\\u00e9$", "^\\x41\\t$", "[\\-\\/\\.]", "^a{2,3}?$", "^(?<year>\\d{4})-(?<m>\\d\\d)$", "^[]$", "^[^]$",
    "^\\0$", "}", "a{", "x]",
]

_ECMA_SPACE = "\\t\\n\\x0b\\x0c\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"
_ALPHABET = "abcxyzABZ019_-.,:/@ \n\r\t\u00a0\u2028é😀😁中\x00"


class _NoOracle(Exception):
    pass


def _to_python(pattern: str) -> str:
    """The same language for Python `re` (with re.ASCII): ECMA `.`, `$`, `\\s`, `[]`, `(?<n>` spelled for Python."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1]
            if nxt in "cpPk" or pattern.startswith("u{", i + 1):
                raise _NoOracle(pattern)
            m = re.match(r"\\u(D[89AB][0-9A-F]{2})\\u(D[C-F][0-9A-F]{2})", pattern[i:], re.I)
            if m:
                hi, lo = int(m.group(1), 16), int(m.group(2), 16)
                out.append(re.escape(chr(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00))))
                i += m.end()
                continue
            if nxt in "sS":
                if in_class and nxt == "S":
                    raise _NoOracle(pattern)
                out.append(_ECMA_SPACE if in_class else f"[{'^' if nxt == 'S' else ''}{_ECMA_SPACE}]")
            else:
                out.append(pattern[i : i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
            out.append(c)
        elif c == "[":
            if pattern.startswith("[]", i):
                out.append("(?!)")
                i += 2
                continue
            if pattern.startswith("[^]", i):
                out.append("[\\s\\S]")
                i += 3
                continue
            in_class = True
            out.append(c)
            if pattern.startswith("[^", i):
                out.append("^")
                i += 1
        elif c == ".":
            out.append("[^\\n\\r\\u2028\\u2029]")
        elif c == "$":
            out.append("\\Z")
        elif pattern.startswith("(?<", i) and pattern[i + 3] not in "=!":
            out.append("(?P<")
            i += 3
            continue
        else:
            out.append(c)
        i += 1
    return "".join(out)


@functools.cache
def _oracle(pattern: str) -> re.Pattern | None:
    try:
        translated = _to_python(pattern)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return re.compile(translated, re.ASCII)
    except (_NoOracle, re.error):
        return None


@functools.cache
def _search_dfa(pattern: str) -> fa.Dfa:
    return fa.compile(pattern_expr(pattern))


@functools.cache
def _full_dfa(pattern: str) -> fa.Dfa:
    return fa.compile(regex_expr(pattern))


def _sample(dfa: fa.Dfa, rng: random.Random, max_steps: int = 60) -> bytes | None:
    """A random accepted string (random walk; None if the walk ran out of steps)."""
    if dfa.is_empty:
        return None
    members: dict[int, list[int]] = {}
    for byte in range(256):
        members.setdefault(int(dfa.class_of[byte]), []).append(byte)
    rows, state, out = dfa.rows(), dfa.start, bytearray()
    for _ in range(max_steps):
        if dfa.accepting[state] and rng.random() < 0.25:
            return bytes(out)
        moves = [(cls, t) for cls, t in enumerate(rows[state]) if t >= 0 and cls in members]
        if not moves:
            break
        cls, state = rng.choice(moves)
        out.append(rng.choice(members[cls]))
    return bytes(out) if dfa.accepting[state] else None


def _candidates(pattern: str, seed: int) -> list[str]:
    """Strings near the pattern's language: samples from both automata, their mutations, and random text."""
    rng = random.Random(seed)
    alphabet = sorted(set(_ALPHABET) | {c for c in pattern if not 0xD800 <= ord(c) <= 0xDFFF})
    out = ["", "\n"]
    for dfa in (_full_dfa(pattern), _search_dfa(pattern)):
        for _ in range(12):
            data = _sample(dfa, rng)
            if data is not None:
                text = data.decode("utf-8")  # the automaton only spells valid UTF-8
                out.append(text)
                if text:
                    k = rng.randrange(len(text))
                    out.append(text[:k] + text[k + 1 :])
                    out.append(text[:k] + rng.choice(alphabet) + text[k:])
                    out.append(text + "\n")
    out.extend("".join(rng.choice(alphabet) for _ in range(rng.randrange(8))) for _ in range(10))
    return out


def _check(pattern: str, texts: list[str]) -> None:
    oracle = _oracle(pattern)
    assert oracle is not None, pattern
    search, full = _search_dfa(pattern), _full_dfa(pattern)
    for text in texts:
        data = text.encode("utf-8")
        assert search.matches(data) == (oracle.search(text) is not None), (pattern, text)
        assert full.matches(data) == (oracle.fullmatch(text) is not None), (pattern, text)


def test_enough_corpus_patterns_have_an_oracle():
    assert sum(_oracle(p) is not None for p in CORPUS_PATTERNS) >= 60


@pytest.mark.parametrize("pattern", [p for p in CORPUS_PATTERNS if _oracle(p) is not None])
def test_corpus_pattern_agrees_with_python_re(pattern):
    _check(pattern, _candidates(pattern, seed=len(pattern)))


@pytest.mark.parametrize("pattern", TRICKY_PATTERNS)
def test_tricky_pattern_agrees_with_python_re(pattern):
    _check(pattern, _candidates(pattern, seed=len(pattern)))


_ORACLE_PATTERNS = [p for p in CORPUS_PATTERNS + TRICKY_PATTERNS if _oracle(p) is not None]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(_ORACLE_PATTERNS), st.text(alphabet=st.sampled_from(_ALPHABET), max_size=12))
def test_random_text_agrees_with_python_re(pattern, text):
    _check(pattern, [text])


_RANDOM_ATOMS = ["a", "b", ".", "[ab]", "[^a]", "\\d", "^", "$", "(?:)", "é"]
_RANDOM_PATTERNS = st.recursive(
    st.sampled_from(_RANDOM_ATOMS),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map("".join),
        st.tuples(inner, inner).map(lambda t: f"(?:{t[0]}|{t[1]})"),
        st.tuples(inner, st.sampled_from(["*", "+", "?", "{2}", "{0,2}", "{1,3}", "{2,}"])).map(lambda t: f"(?:{t[0]}){t[1]}"),
    ),
    max_leaves=7,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_RANDOM_PATTERNS, st.lists(st.text(alphabet="ab\né1", max_size=6), min_size=1, max_size=8))
def test_random_patterns_with_anchors_agree_with_python_re(pattern, texts):
    _check(pattern, texts)


_LOOKAHEAD_PATTERNS = st.tuples(
    _RANDOM_PATTERNS, st.sampled_from(["(?=", "(?!"]), _RANDOM_PATTERNS, _RANDOM_PATTERNS, _RANDOM_PATTERNS
).map(lambda t: f"{t[0]}{t[1]}{t[2]}){t[3]}|{t[4]}")


@settings(max_examples=100, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_LOOKAHEAD_PATTERNS, st.lists(st.text(alphabet="ab\né1", max_size=6), min_size=1, max_size=8))
def test_random_top_level_lookaheads_agree_with_python_re(pattern, texts):
    _check(pattern, texts)


# JSON Schema Test Suite, draft2020-12 optional/ecmascript-regex.json and non-bmp-regex.json (string instances).
SUITE_TABLE = [
    ("^abc$", "abc\n", False), ("^abc$", "abc", True),
    ("^\\t$", "\\t", False), ("^\\t$", "\t", True),
    ("^\\cC$", "\\cC", False), ("^\\cC$", "\x03", True), ("^\\cc$", "\x03", True),
    ("^\\d$", "0", True), ("^\\d$", "\u07c0", False), ("^\\D$", "0", False), ("^\\D$", "\u07c0", True),
    ("^\\w$", "a", True), ("^\\w$", "é", False), ("^\\W$", "a", False), ("^\\W$", "é", True),
    *[("^\\s$", ws, True) for ws in " \t\x0b\x0c\xa0\ufeff\n\u2029\u2003"], ("^\\s$", "\x01", False),
    *[("^\\s$", ws, True) for ws in "\r\u1680\u2000\u200a\u2028\u202f\u205f\u3000"], ("^\\s$", "\u200b", False), ("^\\s$", "–", False),
    *[("^\\S$", ws, False) for ws in " \t\x0b\x0c\xa0\ufeff\n\u2029\u2003"], ("^\\S$", "\x01", True), ("^\\S$", "–", True),
    ("\\p{Letter}cole", "l'ecole", True), ("\\p{Letter}cole", "l'école", True), ("\\p{Letter}cole", "L'ÉCOLE", False),
    ("\\wcole", "l'ecole", True), ("\\wcole", "l'école", False), ("[a-z]cole", "l'école", False),
    ("^\\d+$", "42", True), ("^\\d+$", "-%#", False), ("^\\d+$", "৪২", False),
    ("^\\p{digit}+$", "42", True), ("^\\p{digit}+$", "-%#", False), ("^\\p{digit}+$", "৪২", True),
    ("^🐲*$", "", True), ("^🐲*$", "🐲", True), ("^🐲*$", "🐲🐲", True), ("^🐲*$", "🐉", False),
    ("^🐲*$", "🐉🐉", False), ("^🐲*$", "D", False), ("^🐲*$", "DD", False),
    ("^a*$", "aaa", True), ("^a*$", "abc", False), ("a+", "xxaayy", True), ("a+", "xx", False),
    ("^\\u{1F600}$", "😀", True), ("^\\P{L}$", "é", False), ("^\\P{L}$", "1", True), ("^\\p{Lu}$", "É", True),
    ("^\\p{gc=Nd}$", "٣", True), ("^[\\p{N}x]$", "x", True), ("^\\p{ASCII}+$", "abc~", True), ("^\\p{ASCII}$", "é", False),
]


@pytest.mark.parametrize(("pattern", "text", "valid"), SUITE_TABLE)
def test_suite_table(pattern, text, valid):
    assert _search_dfa(pattern).matches(text.encode("utf-8")) is valid


def test_full_match_semantics():
    assert _full_dfa("abc").matches(b"abc")
    assert not _full_dfa("abc").matches(b"xabc")
    assert not _full_dfa("a|b").matches(b"ab")
    assert _full_dfa("^abc$").matches(b"abc")
    assert not _full_dfa("^(?=.*1)[a-z0-9]+$").matches(b"abc")


def test_dot_and_negated_classes_span_all_code_points():
    for pattern in ("^.$", "^[^a]$", "^\\W$", "^[^\\s]$", "^\\P{Cn}$"):
        dfa = _search_dfa(pattern)
        for ch in ("é", "中", "😀", "\U0010fffd", "\x7f"):
            assert dfa.matches(ch.encode("utf-8")), (pattern, ch)
    for line_end in ("\n", "\r", "\u2028", "\u2029"):
        assert not _search_dfa("^.$").matches(line_end.encode("utf-8"))


def test_never_spells_surrogates_or_invalid_utf8():
    dfa = _search_dfa("^[\\uD800-\\uDFFF]$|^\\uDC00$")
    assert dfa.is_empty
    rng = random.Random(3)
    for pattern in ("^[^a]{1,4}$", "^.+$", "\\P{L}"):
        for _ in range(50):
            data = _sample(_full_dfa(pattern), rng)
            if data is not None:
                data.decode("utf-8")


def test_lookahead_that_never_holds_gives_the_empty_language():
    assert _search_dfa("(?!a*)").is_empty
    assert _search_dfa("x(?=$)y").is_empty


def test_big_bounded_quantifier_compiles():
    dfa = fa.compile(regex_expr("a{1,1000}"))
    assert dfa.matches(b"a" * 1000) and not dfa.matches(b"a" * 1001)


@pytest.mark.parametrize("pattern", [
    "(a)\\1", "(?<n>a)\\k<n>", "(?<=a)b", "(?<!a)b", "\\bfoo", "a\\Bb", "(a(?=b))*", "(?:a|(?=b))c", "(?=a)*",
    "\\p{Script=Greek}", "\\p{Alphabetic}", "\\a", "(?i)abc", "(?i:abc)", "\\0123", "a{,5}", "[\\1]", "\\c1",
])
def test_unsupported_constructs(pattern):
    with pytest.raises(UnsupportedSchema) as info:
        pattern_expr(pattern, pointer="/properties/x/pattern")
    assert info.value.pointer == "/properties/x/pattern"
    with pytest.raises(UnsupportedSchema):
        regex_expr(pattern, pointer="/p")


@pytest.mark.parametrize("pattern", [
    "(", ")", "a)", "[a", "a**", "*a", "+", "a{3,2}", "[z-a]", "\\", "\\x4", "\\u12", "\\u{110000}",
    "(?<1a>x)", "(?P<n>x)", "^*", "{2}", "\\p{L", "\\p{gc=Nope}", "(?",
])
def test_malformed_patterns(pattern):
    with pytest.raises(InvalidSchema) as info:
        pattern_expr(pattern, pointer="/items/pattern")
    assert info.value.pointer == "/items/pattern"
    assert not isinstance(info.value, UnsupportedSchema)


def test_groups_nest_at_most_max_group_depth():
    """Group nesting is bounded (the parser and the builders recurse per level): past `MAX_GROUP_DEPTH` a pattern
    is refused at the offset of the first group too deep, whatever the caller's stack; at the bound it compiles."""
    from constrain.regex import MAX_GROUP_DEPTH

    at_bound = "(a" * MAX_GROUP_DEPTH + ")" * MAX_GROUP_DEPTH
    dfa = fa.compile(regex_expr(at_bound))
    assert dfa.matches(b"a" * MAX_GROUP_DEPTH) and not dfa.matches(b"a" * (MAX_GROUP_DEPTH - 1))
    for pattern in ("(" * 3000 + "a" + ")" * 3000, "(?:" * 100 + "a" + ")" * 100, "(?=" * 100 + "a" + ")" * 100):
        with pytest.raises(UnsupportedSchema, match=f"groups nested more than {MAX_GROUP_DEPTH} deep at offset") as info:
            regex_expr(pattern, pointer="/pattern")
        assert info.value.pointer == "/pattern"
    with pytest.raises(UnsupportedSchema, match=f"at offset {MAX_GROUP_DEPTH * 3}"):
        regex_expr("(?:" * 100 + "a" + ")" * 100)
