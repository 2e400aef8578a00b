"""JSON Schema string `format`s as byte-automaton expressions over the decoded (unquoted, unescaped) UTF-8 value.

In: a format name. Out: an `automaton.Expr` whose language never exceeds python-jsonschema's Draft 2020-12 checker.
"""

from __future__ import annotations

import functools
from typing import Callable
from urllib.parse import urlsplit

from constrain import automaton as fa
from constrain.errors import UnsupportedSchema
from constrain.numbers import integer_expr


def _bytes_of(spec: str) -> fa.Expr:
    """One byte from a class written like a regex class body without escapes, e.g. `a-zA-Z0-9+.-`."""
    ranges: list[tuple[int, int]] = []
    i = 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            ranges.append((ord(spec[i]), ord(spec[i + 2])))
            i += 3
        else:
            ranges.append((ord(spec[i]), ord(spec[i])))
            i += 1
    return fa.byte_set(ranges)


def _lit(text: str) -> fa.Expr:
    return fa.literal(text.encode("ascii"))


def _one_of(texts: list[str]) -> fa.Expr:
    return fa.union(*(_lit(t) for t in texts))


def _two_digit(lo: int, hi: int) -> fa.Expr:
    return _one_of([f"{n:02d}" for n in range(lo, hi + 1)])


_DIGIT = _bytes_of("0-9")
_HEX = _bytes_of("0-9a-fA-F")
_ALPHA = _bytes_of("a-zA-Z")
_ALNUM = _bytes_of("a-zA-Z0-9")


# --- date and time (RFC 3339 section 5.6, as `rfc3339-validator` and `datetime.date` check it) ---------------

_YEAR = fa.difference(fa.repeat(_DIGIT, 4, 4), _lit("0000"))  # year 0 does not exist in `datetime`/`calendar`
# Proleptic Gregorian leap years among 0001..9999: YY divisible by 4 (not 00), or CC divisible by 4 with YY == 00.
_LEAP_YEAR = fa.union(
    fa.concat(_DIGIT, _DIGIT, _one_of([f"{n:02d}" for n in range(4, 100, 4)])),
    fa.concat(_one_of([f"{n:02d}" for n in range(4, 100, 4)]), _lit("00")),
)
_MONTH_DAY = fa.union(
    fa.concat(_one_of(["01", "03", "05", "07", "08", "10", "12"]), _lit("-"), _two_digit(1, 31)),
    fa.concat(_one_of(["04", "06", "09", "11"]), _lit("-"), _two_digit(1, 30)),
    fa.concat(_lit("02-"), _two_digit(1, 28)),
)
_DATE = fa.union(fa.concat(_YEAR, _lit("-"), _MONTH_DAY), fa.concat(_LEAP_YEAR, _lit("-02-29")))
# Seconds stop at 59: rfc3339-validator rejects every leap second (23:59:60 included).
_PARTIAL_TIME = fa.concat(
    _two_digit(0, 23), _lit(":"), _two_digit(0, 59), _lit(":"), _two_digit(0, 59),
    fa.optional(fa.concat(_lit("."), fa.repeat(_DIGIT, 1))),
)
_OFFSET = fa.union(_bytes_of("Zz"), fa.concat(_bytes_of("+-"), _two_digit(0, 23), _lit(":"), _two_digit(0, 59)))
_TIME = fa.concat(_PARTIAL_TIME, _OFFSET)
_DATE_TIME = fa.concat(_DATE, _bytes_of("Tt"), _TIME)


# --- duration (RFC 3339 appendix A ABNF) ---------------------------------------------------------------------

def _unit(letter: str) -> fa.Expr:
    return fa.concat(fa.repeat(_DIGIT, 1), _lit(letter))


def _chain(letters: str) -> fa.Expr:
    """ABNF `dur-X = 1*DIGIT "X" [dur-next]`: a contiguous run of units starting anywhere in `letters`."""
    runs = [fa.concat(*(_unit(c) for c in letters[i:j])) for i in range(len(letters)) for j in range(i + 1, len(letters) + 1)]
    return fa.union(*runs)


_DUR_TIME = fa.concat(_lit("T"), _chain("HMS"))
_DURATION = fa.concat(
    _lit("P"),
    fa.union(fa.concat(_chain("YMD"), fa.optional(_DUR_TIME)), _DUR_TIME, _unit("W")),
)


# --- IP addresses (Python's `ipaddress`) ---------------------------------------------------------------------

_OCTET = fa.union(
    _DIGIT,
    fa.concat(_bytes_of("1-9"), _DIGIT),
    fa.concat(_lit("1"), _DIGIT, _DIGIT),
    fa.concat(_lit("2"), _bytes_of("0-4"), _DIGIT),
    fa.concat(_lit("25"), _bytes_of("0-5")),
)
_IPV4 = fa.concat(_OCTET, fa.repeat(fa.concat(_lit("."), _OCTET), 3, 3))
_H16 = fa.repeat(_HEX, 1, 4)


def _ipv6() -> fa.Expr:
    """RFC 3986 `IPv6address`: 8 hextets (the last two may be a dotted quad), `::` standing for one or more."""
    h16c = fa.concat(_H16, _lit(":"))
    ls32 = fa.union(fa.concat(_H16, _lit(":"), _H16), _IPV4)
    forms = [fa.concat(fa.repeat(h16c, 6, 6), ls32)]
    # `left` hextets before "::", `right` hextets after; the tail is ls32 when it covers two hextets.
    for right in range(0, 8):
        if right >= 2:
            tail = fa.concat(fa.repeat(h16c, right - 2, right - 2), ls32)
        elif right == 1:
            tail = _H16
        else:
            tail = fa.EMPTY
        max_left = 7 - right
        head = fa.optional(fa.concat(fa.repeat(h16c, 0, max_left - 1), _H16)) if max_left > 0 else fa.EMPTY
        forms.append(fa.concat(head, _lit("::"), tail))
    return fa.union(*forms)


_IPV6 = _ipv6()


def _uuid() -> fa.Expr:
    groups = [fa.repeat(_HEX, n, n) for n in (8, 4, 4, 4, 12)]
    return fa.sequence_of(groups, _lit("-"))


# --- hostname (the `fqdn` package, min_labels=1) and email (RFC 5321 Mailbox) --------------------------------

_ANY_BYTE = fa.byte_set([(0, 255)])
_LDH = fa.union(_ALNUM, _lit("-"))
_LABEL = fa.difference(
    fa.concat(_ALNUM, fa.optional(fa.concat(fa.repeat(_LDH, 0, 61), _ALNUM))),
    fa.concat(_ANY_BYTE, _ANY_BYTE, _lit("--"), fa.repeat(_ANY_BYTE, 0)),  # RFC 5891 4.2.3.1 reserved "??--"
)
_HOSTNAME_LABELS = fa.concat(_LABEL, fa.repeat(fa.concat(_lit("."), _LABEL), 0))
# The checker's cap on the whole name (253 bytes) in the automaton costs ~24,000 states (the product of total and
# label positions: ~10 ms to compile, but a row per state for the index). Where the schema compiler can count the
# string's characters beside the automaton (`counted_format`: a plain JSON string outside `not`), the labels alone
# are the automaton (125 states) and the cursor counts to 253; elsewhere the name is capped at 63 bytes (410
# states; the 63-byte label cap then implied).
HOSTNAME_MAX_BYTES = 253
_HOSTNAME_NARROW_BYTES = 63
_HOSTNAME = fa.intersect(_HOSTNAME_LABELS, fa.repeat(_ANY_BYTE, 1, _HOSTNAME_NARROW_BYTES))

_ATOM = fa.repeat(_bytes_of("a-zA-Z0-9!#$%&'*+/=?^_`{|}~-"), 1)
_QUOTED = fa.concat(
    _lit('"'),
    fa.repeat(fa.union(fa.byte_set([(32, 33), (35, 91), (93, 126)]), fa.concat(_lit("\\"), fa.byte_set([(32, 126)]))), 0),
    _lit('"'),
)
_SUB_DOMAIN = fa.concat(_ALNUM, fa.optional(fa.concat(fa.repeat(_LDH, 0), _ALNUM)))
_EMAIL = fa.concat(
    fa.union(fa.concat(_ATOM, fa.repeat(fa.concat(_lit("."), _ATOM), 0)), _QUOTED),
    _lit("@"),
    fa.union(
        fa.concat(_SUB_DOMAIN, fa.repeat(fa.concat(_lit("."), _SUB_DOMAIN), 0)),
        fa.concat(_lit("["), _IPV4, _lit("]")),
        fa.concat(_lit("[IPv6:"), _IPV6, _lit("]")),
    ),
)


# --- uri, uri-reference (RFC 3986 `URI`, `URI-reference`) ---------------------------------------------------------

# RFC 3987 `ucschar` and `iprivate`: the code points an IRI adds to a URI's unreserved characters (and, private use,
# to its query)
_UCSCHAR = fa.chars([(0xA0, 0xD7FF), (0xF900, 0xFDCF), (0xFDF0, 0xFFEF)]
                    + [(plane << 16, (plane << 16) + 0xFFFD) for plane in range(1, 14)] + [(0xE1000, 0xEFFFD)])
_IPRIVATE = fa.chars([(0xE000, 0xF8FF), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD)])


def _uri_pieces(iri: bool = False) -> dict[str, fa.Expr]:
    """The parts of RFC 3986's URI grammar, or with `iri` of RFC 3987's IRI grammar (`iunreserved` takes `ucschar`,
    `iquery` also `iprivate`)."""
    ascii_unreserved = _bytes_of("a-zA-Z0-9._~-")
    unreserved = fa.union(ascii_unreserved, _UCSCHAR) if iri else ascii_unreserved
    sub_delims = _bytes_of("!$&'()*+,;=")
    pct = fa.concat(_lit("%"), _HEX, _HEX)
    pchar = fa.union(unreserved, pct, sub_delims, _bytes_of(":@"))
    segment = fa.repeat(pchar, 0)
    segment_nz = fa.repeat(pchar, 1)
    scheme = fa.concat(_ALPHA, fa.repeat(_bytes_of("a-zA-Z0-9+.-"), 0))
    userinfo = fa.repeat(fa.union(unreserved, pct, sub_delims, _lit(":")), 0)
    # IPvFuture: a lowercase "v" only, as rfc3987 reads the ABNF (the RFC's string literals ignore case)
    ip_future = fa.concat(_lit("v"), fa.repeat(_HEX, 1), _lit("."), fa.repeat(fa.union(ascii_unreserved, sub_delims, _lit(":")), 1))
    host = fa.union(
        fa.concat(_lit("["), fa.union(_IPV6, ip_future), _lit("]")),
        _IPV4,
        fa.repeat(fa.union(unreserved, pct, sub_delims), 0),
    )
    authority = fa.concat(fa.optional(fa.concat(userinfo, _lit("@"))), host, fa.optional(fa.concat(_lit(":"), fa.repeat(_DIGIT, 0))))
    path_abempty = fa.repeat(fa.concat(_lit("/"), segment), 0)
    tail = fa.repeat(fa.union(pchar, _bytes_of("/?")), 0)
    query = fa.repeat(fa.union(pchar, _bytes_of("/?"), _IPRIVATE), 0) if iri else tail
    return {
        "scheme": scheme,
        "net_path": fa.concat(_lit("//"), authority, path_abempty),  # "//" authority path-abempty
        "path_absolute": fa.concat(_lit("/"), fa.optional(fa.concat(segment_nz, path_abempty))),
        "path_rootless": fa.concat(segment_nz, path_abempty),
        # segment-nz-nc: a first segment without ':' (else it would read as a scheme)
        "path_noscheme": fa.concat(fa.repeat(fa.union(unreserved, pct, sub_delims, _lit("@")), 1), path_abempty),
        "query_fragment": fa.concat(fa.optional(fa.concat(_lit("?"), query)), fa.optional(fa.concat(_lit("#"), tail))),
    }


def _uri(iri: bool = False) -> fa.Expr:
    p = _uri_pieces(iri)
    hier_part = fa.union(p["net_path"], p["path_absolute"], p["path_rootless"], fa.EMPTY)
    return fa.concat(p["scheme"], _lit(":"), hier_part, p["query_fragment"])


def _uri_reference(iri: bool = False) -> fa.Expr:
    p = _uri_pieces(iri)
    relative_part = fa.union(p["net_path"], p["path_absolute"], p["path_noscheme"], fa.EMPTY)
    return fa.union(_uri(iri), fa.concat(relative_part, p["query_fragment"]))


# --- uri-template (RFC 6570, level 4) ----------------------------------------------------------------------------


def _uri_template() -> fa.Expr:
    """RFC 6570 section 2: literals and expressions `{` [operator] varspec *( `,` varspec ) `}`, where the operators
    are the level 2-4 ones (`+#./;?&`; the reserved `=,!@|` are not written), a varname is varchars (`ALPHA`,
    `DIGIT`, `_`, pct-encoded) joined by single dots, and a varspec may end in `*` or `:` and a length. Narrower than
    the RFC where the `uri-template` package (python-jsonschema's checker) is: a varname starts with `ALPHA`,
    `DIGIT` or `_` (not pct-encoded) and a prefix length has 1-3 digits (the RFC's 4th is refused there)."""
    pct = fa.concat(_lit("%"), _HEX, _HEX)
    # every ASCII character but CTL, SP, DQUOTE, "%", "<", ">", "\\", "^", "`", "{", "|", "}" (the RFC's ABNF also
    # leaves out "'", a sub-delim of URIs, which the test suite and the checker take)
    literal = fa.union(_bytes_of("!#$&-;=?-[]_a-z~"), _UCSCHAR, _IPRIVATE, pct)
    first = _bytes_of("a-zA-Z0-9_")
    varname = fa.concat(first, fa.repeat(fa.concat(fa.optional(_lit(".")), fa.union(first, pct)), 0))
    prefix = fa.concat(_lit(":"), _bytes_of("1-9"), fa.repeat(_DIGIT, 0, 2))
    varspec = fa.concat(varname, fa.optional(fa.union(prefix, _lit("*"))))
    expression = fa.concat(_lit("{"), fa.optional(_bytes_of("+#./;?&")), varspec,
                           fa.repeat(fa.concat(_lit(","), varspec), 0), _lit("}"))
    return fa.repeat(fa.union(literal, expression), 0)


# --- json-pointer (RFC 6901), relative-json-pointer --------------------------------------------------------------


def _json_pointer() -> fa.Expr:
    """RFC 6901: reference tokens, each after a `/`, of any characters but `/` and `~`, or `~0` / `~1`."""
    unescaped = fa.chars([(0, 0x2E), (0x30, 0x7D), (0x7F, fa.MAX_UNICODE)])
    token = fa.repeat(fa.union(unescaped, fa.concat(_lit("~"), _bytes_of("01"))), 0)
    return fa.repeat(fa.concat(_lit("/"), token), 0)


def _relative_json_pointer() -> fa.Expr:
    """A non-negative integer, then `#` or a JSON pointer (draft-handrews-relative-json-pointer-01, as python-jsonschema
    reads it, no index adjustment). Its checker rejects a digit after a `0` anywhere in the integer (`100`, `101`:
    its leading-zero test looks at every digit), so the integer is `0` or has its one `0` last (`10`, `120`)."""
    integer = fa.union(_lit("0"), fa.concat(_bytes_of("1-9"), fa.repeat(_bytes_of("1-9"), 0), fa.optional(_lit("0"))))
    return fa.concat(integer, fa.union(_lit("#"), _json_pointer()))


# --- regex (the subset of ECMA-262 patterns that Python's `re` reads alike) -------------------------------------

# Groups nest at most this deep in a `format: regex` value: the language of balanced parentheses is not regular.
REGEX_GROUP_DEPTH = 3


def _regex() -> fa.Expr:
    """Patterns valid both as ECMA-262 (with the `u` flag) and for Python's `re.compile` (python-jsonschema's
    checker), from a subset: literal characters (printable ASCII but the syntax characters and a lone `]` or `}`;
    any non-ASCII character), `.`, escapes of the syntax characters and `/`, `\\d\\D\\w\\W\\s\\S\\n\\t\\r\\f\\v`,
    classes `[...]`/`[^...]` of such characters (also `\\-`; no `[`, `^` after the first, `|`, `&` or `~`, whose
    doubles Python reads as future set operations) and of ranges inside `0-9`, `A-Z` or `a-z` in order, the anchors
    `^`, `$`, `\\b`, `\\B` (never quantified), groups `(...)` and `(?:...)` nested up to `REGEX_GROUP_DEPTH`,
    alternation, and one quantifier an atom (`*`, `+`, `?`, `{n}`, `{n,}`, `{n,m}`: numbers below 10,000 without
    leading zeros, n <= m with n of one digit, or of two and m of more digits or a larger first one), lazy or not.
    No backreferences, lookaround, named groups, flags or Unicode property escapes."""
    specials = "\\^$.|?*+()[]{}"
    non_ascii = fa.chars([(0x80, fa.MAX_UNICODE)])
    literal = fa.union(_bytes_of(" !\"#%&',-/0-9:;<=>@A-Z_`a-z~"), non_ascii)
    escaped = fa.concat(_lit("\\"), fa.byte_set([(ord(c), ord(c)) for c in specials + "/"]))
    class_escape = fa.concat(_lit("\\"), _bytes_of("dDwWsSntrfv"))
    ranges = fa.union(*(fa.concat(_lit(chr(lo)), _lit("-"), fa.byte_set([(lo, end)]))
                        for first, end in ((0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A)) for lo in range(first, end + 1)))
    member = fa.union(_bytes_of(" !\"#$%'()*+,./0-9:;<=>?@A-Z_`a-z{}"), non_ascii, escaped, _lit("\\-"), class_escape,
                      ranges)
    char_class = fa.concat(_lit("["), fa.optional(_lit("^")), fa.repeat(member, 1), _lit("]"))
    count = integer_expr(0, 9999)
    # n <= m: a one-digit n, or a two-digit n and an m of more digits or with a larger first digit (comparing whole
    # two-digit pairs would keep 100 states for every depth of group)
    ordered = fa.union(*(fa.concat(_lit(f"{n},"), integer_expr(n, 9999)) for n in range(10)),
                       *(fa.concat(_lit(str(d)), _DIGIT, _lit(","),
                                   fa.union(integer_expr(100, 9999), fa.concat(_bytes_of(f"{d + 1}-9"), _DIGIT)))
                         for d in range(1, 9)),
                       fa.concat(_lit("9"), _DIGIT, _lit(","), integer_expr(100, 9999)))
    bounds = fa.union(fa.concat(count, fa.optional(_lit(","))), ordered)
    quantifier = fa.concat(fa.union(_bytes_of("*+?"), fa.concat(_lit("{"), bounds, _lit("}"))), fa.optional(_lit("?")))
    anchor = fa.union(_bytes_of("^$"), fa.concat(_lit("\\"), _bytes_of("bB")))
    atom = fa.union(literal, escaped, class_escape, _lit("."), char_class)
    alternation = None
    for _ in range(REGEX_GROUP_DEPTH + 1):
        if alternation is not None:
            atom = fa.union(atom, fa.concat(fa.union(_lit("("), _lit("(?:")), alternation, _lit(")")))
        branch = fa.repeat(fa.union(fa.concat(atom, fa.optional(quantifier)), anchor), 0)
        alternation = fa.concat(branch, fa.repeat(fa.concat(_lit("|"), branch), 0))
    return alternation


_FORMATS: dict[str, Callable[[], fa.Expr]] = {
    "date": lambda: _DATE,
    "time": lambda: _TIME,
    "date-time": lambda: _DATE_TIME,
    "duration": lambda: _DURATION,
    "email": lambda: _EMAIL,
    "hostname": lambda: _HOSTNAME,
    "ipv4": lambda: _IPV4,
    "ipv6": lambda: _IPV6,
    "uuid": _uuid,
    "uri": _uri,
    "uri-reference": _uri_reference,
    "iri": lambda: _uri(iri=True),
    "iri-reference": lambda: _uri_reference(iri=True),
    "uri-template": _uri_template,
    "json-pointer": _json_pointer,
    "relative-json-pointer": _relative_json_pointer,
    "regex": _regex,
}

SUPPORTED_FORMATS: tuple[str, ...] = tuple(_FORMATS)

# The meta-schema URIs python-jsonschema 4.26 recognises in `$schema` (`validators._META_SCHEMAS`, compared after
# `urlsplit(uri).geturl()`, which drops an empty fragment), and per draft the supported formats its FORMAT_CHECKER
# asserts (`Draft*Validator.FORMAT_CHECKER.checkers`). A format a draft does not define is an annotation there.
_META_SCHEMAS = {
    "http://json-schema.org/draft-03/schema": "draft3",
    "http://json-schema.org/draft-04/schema": "draft4",
    "http://json-schema.org/draft-06/schema": "draft6",
    "http://json-schema.org/draft-07/schema": "draft7",
    "https://json-schema.org/draft/2019-09/schema": "draft2019-09",
    "https://json-schema.org/draft/2020-12/schema": "draft2020-12",
}
_EARLY = frozenset({"date-time", "email", "hostname", "ipv4", "ipv6", "uri", "regex"})
_ASSERTED = {
    # draft 3 checks `time` as strptime("%H:%M:%S") (no offset), not RFC 3339: see `is_asserted`
    "draft3": frozenset({"date", "date-time", "email", "ipv6", "time", "uri", "regex"}),
    "draft4": _EARLY,
    "draft6": _EARLY | {"uri-reference", "uri-template", "json-pointer"},
    "draft7": _EARLY | {"date", "time", "uri-reference", "iri", "iri-reference", "uri-template", "json-pointer",
                        "relative-json-pointer"},
    "draft2019-09": frozenset(SUPPORTED_FORMATS),
    "draft2020-12": frozenset(SUPPORTED_FORMATS),
}


# Per draft, every format name that draft's specification defines, plus those python-jsonschema 4.26 checks under it
# beyond the specification (`regex` and `idn-email` in drafts 3-6). A name in none of them is a custom format, which
# JSON Schema leaves to the application: validators ignore it, and so does constrain (see `is_asserted`).
_DRAFT4_NAMES = frozenset({"date-time", "email", "hostname", "ipv4", "ipv6", "uri", "regex", "idn-email"})
_DRAFT6_NAMES = _DRAFT4_NAMES | {"uri-reference", "uri-template", "json-pointer"}
_DRAFT7_NAMES = _DRAFT6_NAMES | {"date", "time", "iri", "iri-reference", "idn-hostname", "relative-json-pointer"}
_DEFINED = {
    "draft3": frozenset({"date-time", "date", "time", "utc-millisec", "regex", "color", "style", "phone", "uri", "email",
                         "ip-address", "ipv6", "host-name", "idn-email"}),
    "draft4": _DRAFT4_NAMES,
    "draft6": _DRAFT6_NAMES,
    "draft7": _DRAFT7_NAMES,
    "draft2019-09": _DRAFT7_NAMES | {"duration", "uuid"},
    "draft2020-12": _DRAFT7_NAMES | {"duration", "uuid"},
}


def draft_of(schema: object) -> str:
    """The draft python-jsonschema validates `schema` under: its `$schema` when it names a known meta-schema, else
    Draft 2020-12 (`validator_for`'s default, and the oracle's)."""
    uri = schema.get("$schema") if isinstance(schema, dict) else None
    if not isinstance(uri, str):
        return "draft2020-12"
    try:
        normal = urlsplit(uri).geturl()
    except ValueError:
        return "draft2020-12"
    return _META_SCHEMAS.get(normal, "draft2020-12")


def is_asserted(name: str, draft: str, *, pointer: str = "") -> bool:
    """Whether `format: name` asserts anything under `draft` (see `draft_of`).

    A supported format that the draft does not define (draft 4 and 6: date, time, duration, uuid; draft 7: duration,
    uuid) is an annotation under that draft, as python-jsonschema treats it: False. So is a custom format, one that no
    specification of the draft defines (`url`, `byte`, `semver`, ...: JSON Schema leaves those to the application,
    and validators pass every value). A name the draft defines that constrain does not support (`idn-hostname`,
    `idn-email`, ...) is True, so that `format_expr` refuses it.

    Raises:
        UnsupportedSchema: draft 3's `time` (a different language: `HH:MM:SS` without offset).
    """
    if name not in _FORMATS:
        return name in _DEFINED.get(draft, _DEFINED["draft2020-12"])
    if draft == "draft3" and name == "time":
        raise UnsupportedSchema("format 'time' under draft 3 (HH:MM:SS) is not supported", pointer=pointer)
    return name in _ASSERTED.get(draft, _ASSERTED["draft2020-12"])


def format_expr(name: str, *, pointer: str = "") -> fa.Expr:
    """The decoded string values valid for JSON Schema `format: name`, as an automaton expression.

    Guarantee: every accepted value is accepted by python-jsonschema 4.26's Draft 2020-12 FormatChecker (with
    `rfc3339-validator`, `isoduration`, `fqdn` and `rfc3987` installed). Where the checker's language is wider than
    the standard or irregular, this is narrower, never wider:
      - date-time/time: only ASCII digits, no trailing newline (the checker's `$` allows one); `t`/`z` allowed;
        no leap second (the checker rejects second 60 always).
      - duration: RFC 3339 appendix A only (digits, contiguous Y-M-D / H-M-S runs, weeks alone); the checker
        also takes signs, decimals, exponents, gaps such as `P1Y2D`, `P1WT1H`.
      - email: RFC 5321 `Mailbox` (dot-atom or quoted local part; LDH domain, `[IPv4]` or `[IPv6:...]`),
        no general address literals; the checker takes any string containing `@`.
      - hostname: ASCII LDH labels, 1-63 bytes in all here (the checker allows 253, which costs ~24k states in
        the automaton; a JSON string the schema compiler counts takes 253: `counted_format`), no trailing dot, no
        label with `--` at positions 3-4 (so no `xn--` A-labels: Punycode validity is not checked); the checker
        also takes a trailing dot or newline, Unicode digits, case-folded letters (Kelvin).
      - uuid: 8-4-4-4-12 hex digits only; the checker's `UUID()` also takes extra hyphens, `_`, `0x`, ...
      - uri, uri-reference, iri, iri-reference: RFC 3986 `URI`, `URI-reference`, RFC 3987 `IRI`, `IRI-reference`
        (dec-octet without leading zeros in IPv4 inside brackets); no trailing newline.
      - uri-template: RFC 6570 level 4 (`_uri_template`), a varname starting with a letter, digit or `_`, prefix
        lengths below 1000; the checker (the `uri-template` package) takes any literal but `{` and `}`, and the
        reserved operator `,`, defaults and `/keys` in varspecs.
      - regex: the subset `_regex` describes (groups nested at most `REGEX_GROUP_DEPTH` deep), valid for ECMA-262
        and for Python's `re`, which the checker compiles with.
      - json-pointer: exact (RFC 6901, any Unicode scalar value in a token).
      - relative-json-pointer: ASCII digits, and an integer with its one `0` last or `0` alone (the checker rejects
        `100`, `101`, ...: see `_relative_json_pointer`); no `+`/`-` index adjustment (the checker takes none).
    The caller adds JSON quoting and escaping.

    Args:
        name: the format name.
        pointer: JSON Pointer of the `format` keyword, for errors.
    Returns:
        An expression over the UTF-8 bytes of the decoded value.
    Raises:
        UnsupportedSchema: `name` is not one of `SUPPORTED_FORMATS`.
    """
    if name not in _FORMATS:
        raise UnsupportedSchema(f"format {name!r} is not supported; supported: {', '.join(SUPPORTED_FORMATS)}", pointer=pointer)
    return _built(name)


def counted_format(name: str) -> tuple[fa.Expr, int, int] | None:
    """`(expression, cap, narrow)` for a format whose value is a regular language cut at a length its automaton
    cannot hold cheaply: the language without the cut, the most characters a value has (the caller counts them
    beside the automaton, or bounds them in a product where the bounds it has are near), and the length
    `format_expr` narrows it to instead; None for the others (`format_expr` is then the whole format). hostname: LDH
    labels of at most 63 bytes, at most `HOSTNAME_MAX_BYTES` in all (ASCII: a byte a character), narrowed to 63."""
    return (_HOSTNAME_LABELS, HOSTNAME_MAX_BYTES, _HOSTNAME_NARROW_BYTES) if name == "hostname" else None


@functools.lru_cache(maxsize=None)
def _built(name: str) -> fa.Expr:
    """A format's expression, built once per process (expressions are immutable: one object serves every schema,
    and the compiler's caches, keyed by it, then hit: `regex`'s, 1,068 states in a string, took 64 ms to rebuild and
    describe on every compile)."""
    return _FORMATS[name]()
