"""Format automata against python-jsonschema's Draft 2020-12 FormatChecker and the JSON Schema Test Suite."""

from __future__ import annotations

import json
import re
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from constrain import automaton as fa
from constrain.errors import UnsupportedSchema
from constrain.formats import SUPPORTED_FORMATS, format_expr
from constrain.schema import compile_schema
from paths import DATA  # noqa: E402

CHECKER = Draft202012Validator.FORMAT_CHECKER
SUITE = DATA / "json-schema-test-suite" / "tests.jsonl"


def test_checker_has_the_optional_format_libraries():
    # Without rfc3339-validator, isoduration, fqdn, rfc3987 the checker silently accepts everything.
    for name in SUPPORTED_FORMATS:
        assert name in CHECKER.checkers, name


@lru_cache(maxsize=None)
def dfa(name: str) -> fa.Dfa:
    return fa.compile(format_expr(name))


def accepts(name: str, value: str) -> bool:
    return dfa(name).matches(value.encode("utf-8", "surrogatepass"))


# --- documented narrowings: values the checker accepts that we reject on purpose --------------------------------

_DURATION_ABNF = re.compile(
    r"P(?:(?:\d+Y(?:\d+M(?:\d+D)?)?|\d+M(?:\d+D)?|\d+D)(?:T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S))?"
    r"|T(?:\d+H(?:\d+M(?:\d+S)?)?|\d+M(?:\d+S)?|\d+S)|\d+W)", re.ASCII)
_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_DOT_STRING = rf"{_ATEXT}(?:\.{_ATEXT})*"
_LDH_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_EMAIL_DOMAIN = rf"{_LDH_LABEL}(?:\.{_LDH_LABEL})*|\[[0-9.]+\]|\[IPv6:[0-9A-Fa-f:.]+\]"


def _email_rfc5321(value: str) -> bool:
    m = re.fullmatch(rf'(?:{_DOT_STRING}|"(?:[ !#-\[\]-~]|\\[ -~])*")@({_EMAIL_DOMAIN})', value, re.ASCII)
    if m is None:
        return False
    domain = m.group(1)
    if domain.startswith("[IPv6:"):
        return CHECKER.conforms(domain[6:-1], "ipv6")
    if domain.startswith("["):
        return CHECKER.conforms(domain[1:-1], "ipv4")
    return True


def _hostname_narrow(value: str) -> bool:
    labels = value.split(".")
    return (
        re.fullmatch(rf"{_LDH_LABEL}(?:\.{_LDH_LABEL})*", value, re.ASCII) is not None
        and len(value) <= 63
        and not any(label[2:4] == "--" for label in labels)
    )


_UCS_OR_PRIVATE = [(0xA0, 0xD7FF), (0xE000, 0xF8FF), (0xF900, 0xFDCF), (0xFDF0, 0xFFEF), (0xE1000, 0xEFFFD),
                   (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD)] + [(p << 16, (p << 16) + 0xFFFD) for p in range(1, 14)]
_VARSPEC = r"[A-Za-z0-9_](?:\.?(?:[A-Za-z0-9_]|%[0-9A-Fa-f]{2}))*(?::[1-9][0-9]{0,2}|\*)?"
_TEMPLATE_PART = re.compile(rf"[!#$&-;=?-\[\]_a-z~]|%[0-9A-Fa-f]{{2}}|\{{[+#./;?&]?{_VARSPEC}(?:,{_VARSPEC})*\}}|(.)",
                            re.ASCII)


def _uri_template_rfc6570(value: str) -> bool:
    """RFC 6570 section 2 (level 4 operators), varnames from a letter, digit or `_`, prefixes below 1000."""
    for m in _TEMPLATE_PART.finditer(value):
        if m.group(1) is not None and not any(lo <= ord(m.group(1)) <= hi for lo, hi in _UCS_OR_PRIVATE):
            return False
    return sum(len(m.group(0)) for m in _TEMPLATE_PART.finditer(value)) == len(value)


_REGEX_SPECIALS = "\\^$.|?*+()[]{}"


def _regex_subset(value: str, depth: int = 3) -> bool:
    """The documented `regex` subset, read by recursive descent (the automaton's independent twin)."""
    def char_ok(c: str, extra: str) -> bool:
        return ord(c) >= 0x80 or (c.isascii() and c.isprintable() and c not in extra)

    def klass(i: int) -> int:  # at "[": the index after "]", or -1
        i += 1
        if i < len(value) and value[i] == "^":
            i += 1
        start = i
        while i < len(value) and value[i] != "]":
            c = value[i]
            if c == "\\":
                if i + 1 >= len(value) or value[i + 1] not in _REGEX_SPECIALS + "/-dDwWsSntrfv":
                    return -1
                i += 2
            elif i + 2 < len(value) and value[i + 1] == "-" and value[i + 2] != "]":
                lo, hi = c, value[i + 2]
                if not any(a <= lo <= hi <= b for a, b in (("0", "9"), ("A", "Z"), ("a", "z"))):
                    return -1
                i += 3
            elif char_ok(c, "\\[]^-|&~"):
                i += 1
            else:
                return -1
        return i + 1 if i < len(value) and i > start else -1

    def canonical(number: str) -> bool:  # below 10,000, no leading zero
        return number.isascii() and number.isdigit() and len(number) <= 4 and (number == "0" or number[0] != "0")

    def quantifier(i: int) -> int:  # the index after an optional quantifier (and its lazy "?"), or -1
        if i < len(value) and value[i] in "*+?":
            i += 1
        elif i < len(value) and value[i] == "{":
            j = value.find("}", i)
            body = value[i + 1 : j] if j > 0 else ""
            lo, comma, hi = body.partition(",")
            if not canonical(lo) or hi and not (canonical(hi) and int(lo) <= int(hi) and (
                    len(lo) == 1 or len(lo) == 2 and (len(hi) > 2 or hi[0] > lo[0]))):
                return -1
            i = j + 1
        else:
            return i
        return i + 1 if i < len(value) and value[i] == "?" else i

    def alternation(i: int, depth: int) -> int:  # the index after a run of branches, or -1
        while i < len(value) and value[i] != ")":
            c = value[i]
            if c in "^$|":
                i += 1
                continue
            if c == "\\" and i + 1 < len(value) and value[i + 1] in "bB":
                i += 2
                continue
            if c == "\\":
                if i + 1 >= len(value) or value[i + 1] not in _REGEX_SPECIALS + "/dDwWsSntrfv":
                    return -1
                i += 2
            elif c == "[":
                i = klass(i)
            elif c == "(":
                if depth == 0:
                    return -1
                i = alternation(i + (3 if value.startswith("(?:", i) else 1), depth - 1)
                if i < 0 or i >= len(value) or value[i] != ")":
                    return -1
                i += 1
            elif c == "." or char_ok(c, _REGEX_SPECIALS):
                i += 1
            else:
                return -1
            if i < 0:
                return -1
            i = quantifier(i)
            if i < 0:
                return -1
        return i

    return alternation(0, depth) == len(value)


# Each entry: format -> (reason, predicate that holds for every value we do accept). A checker-valid value that we
# reject must fail the predicate, so the allowlist cannot hide an unexplained rejection.
NARROWINGS = {
    "date": ("ASCII only, no trailing newline", lambda v: v.isascii() and "\n" not in v),
    "time": ("no trailing newline; ASCII only", lambda v: v.isascii() and "\n" not in v),
    "date-time": ("no trailing newline; ASCII only", lambda v: v.isascii() and "\n" not in v),
    "duration": ("RFC 3339 appendix A ABNF only", lambda v: _DURATION_ABNF.fullmatch(v) is not None),
    "email": ("RFC 5321 Mailbox only (checker: any string with '@')", _email_rfc5321),
    "hostname": ("LDH, <= 63 bytes, no trailing dot, no '??--' label", _hostname_narrow),
    "ipv4": ("exact", lambda v: True),
    "ipv6": ("exact", lambda v: True),
    "uuid": ("canonical 8-4-4-4-12 hex", lambda v: re.fullmatch(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}", v) is not None),
    "uri": (
        "no trailing newline; no leading-zero octets in bracketed IPv4",
        lambda v: "\n" not in v and re.search(r"\[[^\]]*[:.]0\d", v) is None,
    ),
    **{name: ("no trailing newline; no leading-zero octets in bracketed IPv4",
              lambda v: "\n" not in v and re.search(r"\[[^\]]*[:.]0\d", v) is None)
       for name in ("uri-reference", "iri", "iri-reference")},
    "regex": ("the documented subset (`formats._regex`); the checker compiles any Python pattern", _regex_subset),
    "json-pointer": ("exact", lambda v: True),
    "relative-json-pointer": ("ASCII digits; an integer with no digit after a 0",
                              lambda v: re.match(r"(?:0|[1-9]+0?)(?![0-9])", v, re.ASCII) is not None),
    "uri-template": ("RFC 6570 only (checker: any literal but braces, the `,` operator, trailing joiners, defaults)",
                     _uri_template_rfc6570),
}


def check_agrees(name: str, value: str) -> None:
    ours = accepts(name, value)
    theirs = CHECKER.conforms(value, name)
    if ours:
        assert theirs, f"false accept: {name} {value!r}"
    elif theirs:
        reason, holds = NARROWINGS[name]
        assert not holds(value), f"unexplained reject: {name} {value!r} (narrowing: {reason})"


# --- JSON Schema Test Suite table ---------------------------------------------------------------------------------

def _suite_cases() -> list[tuple[str, str, bool]]:
    cases = []
    with SUITE.open() as f:
        for line in f:
            row = json.loads(line)
            if row["draft"] != "draft2020-12" or not row["keyword_group"].startswith("optional/format/"):
                continue
            name = row["schema"].get("format")
            if name not in SUPPORTED_FORMATS:
                continue
            cases += [(name, t["data"], t["valid"]) for t in row["tests"] if isinstance(t["data"], str)]
    return cases


# Suite-valid values we reject, with the reason (the checker rejects the first group too).
SUITE_NARROWINGS = {
    ("date-time", "1998-12-31T23:59:60Z"): "leap second: the checker rejects it",
    ("date-time", "1998-12-31T15:59:60.123-08:00"): "leap second: the checker rejects it",
    ("time", "23:59:60Z"): "leap second: the checker rejects it",
    ("time", "23:59:60+00:00"): "leap second: the checker rejects it",
    ("time", "01:29:60+01:30"): "leap second: the checker rejects it",
    ("time", "23:29:60+23:30"): "leap second: the checker rejects it",
    ("time", "15:59:60-08:00"): "leap second: the checker rejects it",
    ("time", "00:29:60-23:30"): "leap second: the checker rejects it",
    ("hostname", "xn--9n2bp8q.xn--9t4b11yi5a"): "A-labels are not checked, so none is accepted",
    ("hostname", "xn--zca29lwxobi7a"): "A-label",
    ("hostname", "xn--qmbc"): "A-label",
    ("hostname", "xn--ll-0ea"): "A-label",
    ("hostname", "xn--wva3je"): "A-label",
    ("hostname", "xn--4dbc5h"): "A-label",
    ("hostname", "xn--4dbc8h"): "A-label",
    ("hostname", "xn--k8j5u"): "A-label",
    ("hostname", "xn--bck0j"): "A-label",
    ("hostname", "xn--vek778f"): "A-label",
    ("hostname", "xn--ngba1o"): "A-label",
    ("hostname", "xn--0-gyc"): "A-label",
    ("hostname", "xn--11b2ezcw70k"): "A-label",
    ("hostname", "xn--11b2ezcs70k"): "A-label",
    ("hostname", "xn--ngba5hb2804a"): "A-label",
    ("hostname", "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyzabcdefghijk.com"): "longer than 63 bytes",
    ("iri", "http://[V1.fe]"): "IPvFuture with an uppercase V: the checker (rfc3987) rejects it",
    ("relative-json-pointer", "100"): "a digit after a 0: the checker rejects it",
    ("uri-template", "{%41}"): "a varname from a pct-encoded octet: the checker (uri-template) rejects it",
    ("uri-template", "{v:1000}"): "a 4-digit prefix length: the checker (uri-template) rejects it",
}


@pytest.mark.parametrize(("name", "value", "valid"), _suite_cases())
def test_suite_case(name, value, valid):
    check_agrees(name, value)
    ours = accepts(name, value)
    if (name, value) in SUITE_NARROWINGS:
        assert valid and not ours
    else:
        assert ours == valid


# --- own edge cases -------------------------------------------------------------------------------------------------

EDGES = {
    "date": (["2000-02-29", "2400-02-29", "0004-02-29", "9996-02-29", "0001-01-01", "9999-12-31", "2023-02-28"],
             ["1900-02-29", "0000-01-01", "2023-02-29", "2023-04-31", "2023-1-01", "2023-01-01\n", "２023-01-01"]),
    "time": (["00:00:00Z", "23:59:59.999+23:59", "12:00:00-00:00", "12:00:00z"],
             ["23:59:60Z", "12:00:00", "12:00:00+24:00", "12:00:00.Z", "12:00:00Z\n", "12:00Z"]),
    "date-time": (["2000-02-29t00:00:00z", "1970-01-01T00:00:00.0+01:00"],
                  ["1970-01-01 00:00:00Z", "2001-02-29T00:00:00Z", "1970-01-01T00:00:00"]),
    "duration": (["P1Y", "P1Y2M", "P1Y2M3DT4H5M6S", "PT5S", "P3W", "PT1H1M", "P0D"],
                 ["P", "PT", "P1Y2D", "PT1H2S", "P1.5D", "P1W1D", "-P1D", "P1YT", "p1Y"]),
    "email": (["a@b", "a.b@c.d", '"a b"@c', "x@[1.2.3.4]", "x@[IPv6:::1]", "!#$%&'*+/=?^_`{|}~-@x"],
              ["a@", "@a", "a..b@c", "a@b-", "a@[1.2.3.256]", "a@b@c", "a@[x:y]", "a@-b"]),
    "hostname": (["a", "a.b", "a-b", "a--b", "1.2.3.4", "x" * 63],
                 ["", "a.", ".a", "a..b", "-a", "a-", "ab--c", "x" * 64, "a_b", "a b"]),
    "ipv4": (["0.0.0.0", "255.255.255.255", "1.22.199.249"],
             ["01.1.1.1", "256.1.1.1", "1.1.1", "1.1.1.1.", "1.1.1.1\n", "1.1.1.１"]),
    "ipv6": (["::", "::1", "1::", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7::", "::2:3:4:5:6:7:8", "0000:0:0:0:0:0:0:0",
              "::ffff:1.2.3.4", "1:2:3:4:5:6:1.2.3.4", "::1.2.3.4", "1::1.2.3.4", "ABCD:ef::"],
             ["1:2:3:4:5:6:7:8:9", ":::", "1:::2", "1::2::3", "12345::", "::1.2.3", "::1.2.3.04", "1:2:3:4:5:6:7:1.2.3.4",
              "::1%eth0", "::1%", "g::"]),
    "uuid": (["00000000-0000-0000-0000-000000000000", "ABCDEF01-2345-6789-abcd-ef0123456789"],
             ["{00000000-0000-0000-0000-000000000000}", "00000000-0000-0000-0000-00000000000", "0000000000000000000000000000000-0"]),
    "uri": (["a:", "a:b", "http://x", "http://[::1]:80/p?q#f", "http://[v1.x]", "x://u:p@h:8/%aF", "a+b.c-d:/"],
            ["a", ":", "1a:", "http://[::1", "http://x/%", "http://x/%g0", "http://x/ ", "a:\n"]),
    "uri-reference": (["", "a", "a/b:c", "/", "/a/b", "//h", "//u@h:8/p?q#f", "?q", "#f", "../x", "a:b", "http://[::1]/",
                       "%41/b", "@x", "a;b=c"],
                      [":", ":a", "1a:b", "a b", "//[::1", "%g0", "/%", "#f#", "a\n", "\\x", "[x]"]),
    "iri": (["a:é", "http://résumé.example/ü?q=€&p=\ue000#f", "x://[::1]/\U00010000", "a:b"],
            ["é:x", "http://x/\ue000", "a:\u00a0\n", "http://[é]", "a:\x7f", "a:\ufffe", "a"]),
    "iri-reference": (["", "é", "/ü/x?\ue000", "//hôte/p", "#€", "a:é"],
                      [":é", "\ue000", "#\ue000", "é é", "%zz"]),
    "regex": (["", "^[a-z]+$", "(a|b)*", "\\d{2,3}", "[^\\]]", "[\\-]", "(((a)))", "\\/", "a{2,5}", "a{12,}", "(?:x)+?",
               "[a-z0-9_]", "\\b\\w+\\b", "é+", "x|", "a{0}", "[.$]", "^$", "[A-Fa-f0-9]{8}", "^[a-zA-Z0-9_]{3,16}$",
               "a{0,9999}", "a{12,25}", "a{90,100}"],
              ["((((a))))", "a{3,2}", "[z-a]", "^*", "a**", "(", ")", "[", "a]", "\\", "\\e", "(?=a)", "(?P<n>a)", "\\1",
               "a{,3}", "[]", "[^]]", "[a|b]", "[a-]", "\\b*", "a[", "\\-", "a{05}", "a{10000}", "a{12,15}", "a{100,200}",
               "a{19,10}"]),
    "json-pointer": (["", "/", "//", "/a~0b~1c", "/ü/\x00/\U0001f600", "/~01", "/-"],
                     ["a", "#", "#/a", "/~", "/~2", "/a~", "~0", " /a"]),
    "relative-json-pointer": (["0", "1", "0#", "12#", "10/a", "120/b~1c", "0/", "3//"],
                              ["", "#", "/a", "01", "01#", "100", "101/a", "-1/a", "+1/a", "0##", "1#/a", "1a", "0~0"]),
    "uri-template": (["", "http://example.com/", "{var}", "{+path}/here", "{#x,hello,y}", "X{.list*}", "{/var:3}",
                      "{;x,y}", "/search{?q,lang}", "{&x}", "{a.b_c}", "{a%41.b}", "é\ue000{x}", "{x:999}", "%7B{x}",
                      "a'b"],
                     ["{", "}", "{}", "{=x}", "{,x}", "{x y}", "{x.}", "{.x.}", "{x..y}", "{x:0}", "{x:1000}", "a b",
                      "{x}}", "{x*:3}", "%zz", "{%41}", "{x", "a\"b", "{|x}", "<x>", "a\\b", "a^b", "a`b"]),
}


@pytest.mark.parametrize("name", SUPPORTED_FORMATS)
def test_edge_cases(name):
    good, bad = EDGES[name]
    for value in good:
        assert accepts(name, value), value
        check_agrees(name, value)
    for value in bad:
        assert not accepts(name, value), value
        check_agrees(name, value)


def test_unknown_format_is_refused_with_pointer():
    with pytest.raises(UnsupportedSchema) as info:
        format_expr("color", pointer="/properties/x/format")
    assert info.value.pointer == "/properties/x/format"


def test_state_counts_are_bounded():
    # Not a pinned number: a guard against an accidental blow-up (the hostname length product is the known risk).
    for name in SUPPORTED_FORMATS:
        assert 0 < dfa(name).n_states < 1000, name


# --- Hypothesis: mutated valid values ---------------------------------------------------------------------------

SEEDS = {name: good for name, (good, _) in EDGES.items()}
MUTATION_ALPHABET = "0123456789abcdefxABCDEFTZtz:-.+@[]/%?#\"\\ _\nPYMWDHSv~!é{},*;&="


@st.composite
def mutated(draw):
    name = draw(st.sampled_from(SUPPORTED_FORMATS))
    value = draw(st.sampled_from(SEEDS[name]))
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["insert", "delete", "replace", "duplicate"]))
        i = draw(st.integers(0, len(value)))
        c = draw(st.sampled_from(MUTATION_ALPHABET))
        if op == "insert":
            value = value[:i] + c + value[i:]
        elif op == "delete":
            value = value[:i] + value[i + 1:]
        elif op == "replace":
            value = value[:i] + c + value[i + 1:]
        else:
            j = draw(st.integers(i, len(value)))
            value = value[:j] + value[i:j] + value[j:]
    return name, value


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutations_agree_with_checker(case):
    check_agrees(*case)


def random_walk(automaton: fa.Dfa, draw) -> bytes:
    """A random accepted string: follow live transitions, stop at an accepting state when the coin says so."""
    rows = automaton.rows()
    members: dict[int, list[int]] = {}
    for b in range(256):
        members.setdefault(int(automaton.class_of[b]), []).append(b)
    state, out = automaton.start, bytearray()
    while True:
        moves = [(c, t) for c, t in enumerate(rows[state]) if t >= 0 and c in members]
        if not moves or (automaton.accepting[state] and draw(st.integers(0, 3)) == 0) or len(out) > 200:
            if automaton.accepting[state]:
                return bytes(out)
            moves = moves or []
        if not moves:
            return bytes(out)  # unreachable for a trimmed automaton; caught by the assertion below
        c, state = draw(st.sampled_from(moves))
        out.append(draw(st.sampled_from(members[c])))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SUPPORTED_FORMATS), st.data())
def test_random_accepted_values_pass_the_checker(name, data):
    automaton = dfa(name)
    raw = random_walk(automaton, data.draw)
    assert automaton.matches(raw)
    try:
        value = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise AssertionError(f"{name}: accepted bytes are not UTF-8: {raw!r}") from err
    assert CHECKER.conforms(value, name), value


def test_regex_values_are_the_documented_subset_and_compile_without_warnings():
    """Seeded random walks of the `regex` automaton: every value is in the subset `_regex_subset` reads (an
    independent recursive-descent twin of the grammar) and compiles with Python's `re` without a FutureWarning."""
    import random
    import warnings

    automaton = dfa("regex")
    rows = automaton.rows()
    members: dict[int, list[int]] = {}
    for b in range(256):
        members.setdefault(int(automaton.class_of[b]), []).append(b)
    rng = random.Random(5)
    checked = 0
    for _ in range(3000):
        state, out = automaton.start, bytearray()
        while not (automaton.accepting[state] and (rng.random() < 0.1 or len(out) > 60)):
            c, state = rng.choice([(c, t) for c, t in enumerate(rows[state]) if t >= 0 and c in members])
            out.append(rng.choice(members[c]))
        value = out.decode("utf-8")
        assert _regex_subset(value), value
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            re.compile(value)
        checked += "(" in value and "{" in value
    assert checked > 100


# --- formats per draft: a format the schema's draft does not define is an annotation, as python-jsonschema has it --


def test_draft_of_follows_python_jsonschema_meta_schema_lookup():
    from jsonschema.validators import validator_for

    from constrain.formats import draft_of

    names = {"Draft3Validator": "draft3", "Draft4Validator": "draft4", "Draft6Validator": "draft6",
             "Draft7Validator": "draft7", "Draft201909Validator": "draft2019-09", "Draft202012Validator": "draft2020-12"}
    for uri in ["http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-04/schema",
                "http://json-schema.org/draft-06/schema#", "http://json-schema.org/draft-07/schema",
                "https://json-schema.org/draft/2019-09/schema#", "https://json-schema.org/draft/2020-12/schema",
                "https://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#/",
                "http://json-schema.org/draft-04/schema##", "http://json-schema.org/schema#", "urn:x", ""]:
        schema = {"$schema": uri}
        assert draft_of(schema) == names[validator_for(schema, default=Draft202012Validator).__name__], uri
    assert draft_of({}) == draft_of(True) == draft_of({"$schema": 4}) == "draft2020-12"


@pytest.mark.parametrize("name", SUPPORTED_FORMATS)
@pytest.mark.parametrize("draft", ["draft4", "draft6", "draft7", "draft2019-09", "draft2020-12"])
def test_asserted_formats_are_the_ones_the_drafts_checker_checks(name, draft):
    import jsonschema

    from constrain.formats import is_asserted

    cls = {"draft4": jsonschema.Draft4Validator, "draft6": jsonschema.Draft6Validator, "draft7": jsonschema.Draft7Validator,
           "draft2019-09": jsonschema.Draft201909Validator, "draft2020-12": jsonschema.Draft202012Validator}[draft]
    assert is_asserted(name, draft) == (name in cls.FORMAT_CHECKER.checkers)


@pytest.mark.parametrize("draft", ["draft3", "draft4", "draft6", "draft7", "draft2019-09", "draft2020-12"])
def test_formats_left_as_annotations_are_ones_the_drafts_checker_does_not_check(draft):
    # no false accept against python-jsonschema: what constrain does not enforce, the oracle does not check either
    import jsonschema

    from constrain.formats import _DEFINED, is_asserted

    cls = {"draft3": jsonschema.Draft3Validator, "draft4": jsonschema.Draft4Validator,
           "draft6": jsonschema.Draft6Validator, "draft7": jsonschema.Draft7Validator,
           "draft2019-09": jsonschema.Draft201909Validator, "draft2020-12": jsonschema.Draft202012Validator}[draft]
    names = set(cls.FORMAT_CHECKER.checkers) | set().union(*_DEFINED.values()) | {"url", "byte", "semver", "URI", "topic"}
    for name in sorted(names - {"time"} if draft == "draft3" else names):
        if not is_asserted(name, draft):
            assert name not in cls.FORMAT_CHECKER.checkers, name


@pytest.mark.parametrize("name", ["url", "byte", "semver", "topic", "URI", "datetime"])
def test_custom_format_is_an_annotation_reported_in_ignored_keywords(name):
    compiled = compile_schema({"type": "object", "properties": {"x": {"type": "string", "format": name}}})
    assert compiled.dfa.matches(b'{"x":"any text at all"}')
    assert compiled.ignored_keywords == ["/properties/x/format"]


@pytest.mark.parametrize("name", ["idn-hostname", "idn-email"])
def test_format_the_draft_defines_but_constrain_cannot_enforce_is_refused(name):
    with pytest.raises(UnsupportedSchema) as info:
        compile_schema({"type": "string", "format": name})
    assert info.value.pointer == "/format"
    # draft 4 does not define `idn-hostname`: there it is a custom format (python-jsonschema checks `idn-email` there)
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "string", "format": name}
    if name == "idn-email":
        with pytest.raises(UnsupportedSchema):
            compile_schema(draft4)
    else:
        assert compile_schema(draft4).ignored_keywords == ["/format"]


def test_draft3_time_is_refused():
    from constrain.formats import is_asserted

    with pytest.raises(UnsupportedSchema) as info:
        is_asserted("time", "draft3", pointer="/format")
    assert info.value.pointer == "/format"


@pytest.mark.parametrize("uri,name,value", [
    ("http://json-schema.org/draft-04/schema#", "uuid", "not-a-uuid"),
    ("http://json-schema.org/draft-04/schema", "date", "2019-12-32"),
    ("http://json-schema.org/draft-06/schema#", "time", "noon"),
    ("http://json-schema.org/draft-07/schema#", "duration", "P1Y2D"),
    ("http://json-schema.org/draft-07/schema#", "uuid", "x"),
])
def test_format_outside_the_schemas_draft_is_an_annotation(uri, name, value):
    import jsonschema

    from constrain.schema import compile_schema

    schema = {"$schema": uri, "type": "object", "properties": {"v": {"type": "string", "format": name}}}
    oracle = jsonschema.validators.validator_for(schema)
    assert oracle(schema, format_checker=oracle.FORMAT_CHECKER).is_valid({"v": value})
    compiled = compile_schema(schema)
    assert compiled.dfa.matches(json.dumps({"v": value}, separators=(",", ":")).encode())
    assert compiled.ignored_keywords == ["/properties/v/format"]
    # inside `not` too: an annotation asserts nothing, so the operand is just a string
    negated = compile_schema({"$schema": uri, "not": {"type": "string", "format": name}})
    assert not negated.dfa.matches(json.dumps(value).encode()) and negated.dfa.matches(b"1")


def test_format_of_the_schemas_draft_is_enforced():
    from constrain.schema import compile_schema

    for uri, name, bad in [("http://json-schema.org/draft-04/schema#", "date-time", '"2019-12-32T00:00:00Z"'),
                           ("http://json-schema.org/draft-07/schema#", "date", '"2019-12-32"'),
                           ("https://json-schema.org/draft/2019-09/schema", "uuid", '"x"'),
                           ("urn:unknown", "uuid", '"x"')]:
        compiled = compile_schema({"$schema": uri, "type": "string", "format": name})
        assert not compiled.dfa.matches(bad.encode()) and compiled.ignored_keywords == [], (uri, name)
