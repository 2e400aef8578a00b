"""A tokenizer's vocabulary as data: each token id → the exact bytes it adds to the output, or a special token."""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from constrain.errors import InternalError, TokenizerError

__all__ = ["QWEN3_ADDED_TOKENS", "TokenizerError", "Vocabulary", "qwen3_vocabulary"]

_SPACE_MARK = "\u2581"  # SentencePiece's "▁", which stands for a space inside a piece


class Vocabulary:
    """Token id → exact output bytes for one tokenizer; immutable, hashable and picklable.

    Guarantee: for every id `i` that is not in `special_ids` or `eos_ids`, emitting `i` appends exactly
    `token_bytes[i]` to the decoded output (byte-level BPE alphabet undone, SentencePiece `▁` turned into a space,
    `<0xNN>` byte pieces turned into that byte; a piece of a UTF-8 character stays raw, never U+FFFD). Id holes
    have `b""`. Special tokens (control, added, unknown, unused, GGUF user-defined) keep their text (e.g.
    `b"<|im_end|>"`) in `token_bytes`, but emitting one is not that text: a grammar names it by id, and the index
    never walks its bytes.

    Attributes:
        token_bytes: one `bytes` per token id, `n_tokens` of them.
        special_ids: ids of the control/special tokens.
        eos_ids: the ids that end generation, sorted.
        vocab_size: the width of the logits (>= `n_tokens`); ids in `[n_tokens, vocab_size)` are never allowed.
        prefix_space: the tokenizer's decoder drops one leading space from the first decoded token
            (SentencePiece's dummy prefix). `token_bytes` still carry that space; the caller decides what a
            leading space at the start of the output means.
        special_tokens: special token text → id (read-only), for grammars that name special tokens.
        fingerprint: sha256 hex digest of everything above, the key for caches.
    """

    __slots__ = ("token_bytes", "special_ids", "eos_ids", "vocab_size", "prefix_space", "special_tokens",
                 "fingerprint")

    token_bytes: tuple[bytes, ...]
    special_ids: frozenset[int]
    eos_ids: tuple[int, ...]
    vocab_size: int
    prefix_space: bool
    special_tokens: Mapping[str, int]
    fingerprint: str

    def __init__(
        self,
        token_bytes: Sequence[bytes],
        *,
        special_ids: Iterable[int] = (),
        eos_ids: Iterable[int] = (),
        vocab_size: int | None = None,
        prefix_space: bool = False,
    ):
        tokens = tuple(token_bytes)
        n_tokens = len(tokens)
        for i, data in enumerate(tokens):
            if type(data) is not bytes:
                raise TokenizerError(f"token {i} must be bytes, got {type(data).__name__} {data!r}")
        specials = frozenset(int(i) for i in special_ids)
        eos = tuple(sorted({int(i) for i in eos_ids}))
        for what, ids in (("special", specials), ("eos", eos)):
            bad = sorted(i for i in ids if not 0 <= i < n_tokens)
            if bad:
                raise TokenizerError(f"{what} token ids {bad[:5]} are outside [0, {n_tokens})")
        width = n_tokens if vocab_size is None else int(vocab_size)
        if width < n_tokens:
            raise TokenizerError(f"vocab_size {width} is smaller than the tokenizer's n_tokens {n_tokens}")
        names: dict[str, int] = {}
        for i in sorted(specials):
            # The first id wins when two special tokens share a text (GGUF padding slots do).
            names.setdefault(tokens[i].decode("utf-8", errors="replace"), i)
        set_ = object.__setattr__
        set_(self, "token_bytes", tokens)
        set_(self, "special_ids", specials)
        set_(self, "eos_ids", eos)
        set_(self, "vocab_size", width)
        set_(self, "prefix_space", bool(prefix_space))
        set_(self, "special_tokens", MappingProxyType(names))
        set_(self, "fingerprint", self._digest())

    @classmethod
    def from_token_bytes(
        cls,
        token_bytes: Sequence[bytes],
        *,
        special_ids: Iterable[int] = (),
        eos_ids: Iterable[int] = (),
        vocab_size: int | None = None,
        prefix_space: bool = False,
    ) -> Vocabulary:
        """A vocabulary from explicit token bytes (synthetic vocabularies, or a tokenizer read by other means).

        Args:
            token_bytes: the bytes of each token id; `b""` for a token that adds nothing.
            special_ids: ids of special tokens (their bytes are their text, never walked as output bytes).
            eos_ids: ids that end generation (may be empty for an index that never stops).
            vocab_size: the logits width, default `len(token_bytes)`.
            prefix_space: see the class attribute.
        Returns:
            The Vocabulary.
        Raises:
            TokenizerError: a non-bytes token, an id outside `[0, n_tokens)`, or `vocab_size < n_tokens`.
        """
        return cls(token_bytes, special_ids=special_ids, eos_ids=eos_ids, vocab_size=vocab_size,
                   prefix_space=prefix_space)

    # ----- value semantics

    @property
    def n_tokens(self) -> int:
        """The tokenizer's token count (ids `0..n_tokens-1`)."""
        return len(self.token_bytes)

    def _digest(self) -> str:
        h = hashlib.sha256(b"constrain.Vocabulary/1")
        h.update(struct.pack("<q?", self.vocab_size, self.prefix_space))
        for data in self.token_bytes:
            h.update(struct.pack("<q", len(data)) + data)
        h.update(json.dumps([sorted(self.special_ids), list(self.eos_ids)]).encode())
        return h.hexdigest()

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Vocabulary is immutable (tried to set {name!r})")

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and other.fingerprint == self.fingerprint

    def __reduce__(self):
        return (_rebuild, (self.token_bytes, sorted(self.special_ids), self.eos_ids, self.vocab_size,
                           self.prefix_space))

    def __repr__(self) -> str:
        return (f"Vocabulary(n_tokens={self.n_tokens}, vocab_size={self.vocab_size}, "
                f"special_ids={len(self.special_ids)}, eos_ids={list(self.eos_ids)}, "
                f"prefix_space={self.prefix_space}, fingerprint={self.fingerprint[:12]})")

    def decode(self, token_ids: Iterable[int]) -> bytes:
        """The bytes that `token_ids` add to the output, concatenated.

        Args:
            token_ids: ids in `[0, n_tokens)` that are neither special nor EOS.
        Returns:
            The concatenated `token_bytes`, with no prefix-space or UTF-8 processing.
        Raises:
            InternalError: a special, EOS or out-of-range id; the caller handles special tokens itself.
        """
        out = bytearray()
        n_tokens, specials, eos = self.n_tokens, self.special_ids, self.eos_ids
        for i in token_ids:
            i = int(i)
            if not 0 <= i < n_tokens or i in specials or i in eos:
                raise InternalError(f"token {i} adds no output bytes (special, EOS or outside [0, {n_tokens}))")
            out += self.token_bytes[i]
        return bytes(out)

    # ----- constructors from real tokenizers

    @classmethod
    def from_tokenizer(
        cls, tokenizer: Any, *, eos_ids: Iterable[int] | None = None, vocab_size: int | None = None
    ) -> Vocabulary:
        """Read the vocabulary of a loaded tokenizer object.

        Supported: transformers fast tokenizers and `tokenizers.Tokenizer` (byte-level BPE, or SentencePiece-style
        `▁` pieces with byte fallback), `sentencepiece.SentencePieceProcessor`, `tiktoken.Encoding`, and
        mistral_common's `MistralTokenizer`, `Tekkenizer` and `SentencePieceTokenizer`. The spelling (byte-level or
        `▁` pieces) is read from the tokenizer's decoder, not guessed from a model name.

        Special: every added token (`"special": false` ones too, e.g. Qwen's `<tool_call>`), SentencePiece control,
        unknown and unused pieces, tiktoken special tokens, and Tekken's first `num_special_tokens` ids.

        Args:
            tokenizer: the tokenizer object.
            eos_ids: the ids that end generation; default the tokenizer's own eos id plus every special token whose
                text ends generation in llama.cpp (`<|eot_id|>`, `<|im_end|>`, ...). For other stop tokens, pass
                the full set from the generation config.
            vocab_size: the model's logits width when it is larger than the tokenizer (padded embeddings).
        Returns:
            The Vocabulary.
        Raises:
            TokenizerError: an unsupported tokenizer type or decoder, or no eos id given or found.
        """
        kind = _kind_of(tokenizer)
        if kind == "transformers":
            if not hasattr(tokenizer, "backend_tokenizer"):
                raise TokenizerError(f"transformers tokenizer {type(tokenizer).__name__} has no backend_tokenizer: "
                                     "expected a fast (tokenizers-backed) tokenizer")
            read = _from_hf_json(json.loads(tokenizer.backend_tokenizer.to_str()), len(tokenizer))
            default_eos = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
        elif kind == "tokenizers":
            read = _from_hf_json(json.loads(tokenizer.to_str()), tokenizer.get_vocab_size(with_added_tokens=True))
            default_eos = []  # a bare tokenizers.Tokenizer does not say which token ends generation
        elif kind == "sentencepiece":
            read = _from_sentencepiece(tokenizer)
            default_eos = [tokenizer.eos_id()] if tokenizer.eos_id() >= 0 else []
        elif kind == "tiktoken":
            read = _from_tiktoken(tokenizer)
            default_eos = [tokenizer.eot_token] if "<|endoftext|>" in tokenizer.special_tokens_set else []
        elif kind == "mistral":
            inner = tokenizer.instruct_tokenizer.tokenizer if hasattr(tokenizer, "instruct_tokenizer") else tokenizer
            if hasattr(inner, "id_to_byte_piece"):
                read = _from_tekken(inner)
            else:
                import sentencepiece

                read = _from_sentencepiece(sentencepiece.SentencePieceProcessor(model_file=str(inner.file_path)))
            default_eos = [inner.eos_id]
        else:
            raise TokenizerError(f"unsupported tokenizer type {type(tokenizer).__module__}.{type(tokenizer).__name__}")
        if eos_ids is None:
            eos_ids = [*default_eos, *_eog_ids(read[0], read[1])]
        return cls._from_read(read, eos_ids, vocab_size, type(tokenizer).__name__)

    @classmethod
    def from_gguf(
        cls,
        path: str | os.PathLike[str],
        *,
        eos_ids: Iterable[int] | None = None,
        vocab_size: int | None = None,
        added_tokens: Mapping[int, str] | None = None,
    ) -> Vocabulary:
        """Read the vocabulary stored in a GGUF file (full model or vocab-only), as llama.cpp decodes it.

        Token types: control, user-defined, unknown and unused → special with their text as bytes (user-defined
        tokens such as Gemma 4's `<|tool_call>` and `<|"|>` are single marker tokens that ordinary text never
        spells; a grammar names them by id); byte → `<0xNN>`'s byte; normal → the piece's bytes.
        `tokenizer.ggml.model` "gpt2" is byte-level BPE; "llama" and "gemma4" use `▁` pieces (`add_space_prefix`
        gives `prefix_space`, default true for "llama").

        Args:
            path: the .gguf file.
            eos_ids: default `tokenizer.ggml.eos_token_id` plus the eot/eom ids when the file has them, plus every
                special token whose text ends generation in llama.cpp (`<|eot_id|>`, `<|im_end|>`, `<turn|>`, ...).
            vocab_size: the logits width when larger than the token count.
            added_tokens: id → text overlaid as special tokens (a newer model's added tokens over an older
                vocabulary's placeholders, see `qwen3_vocabulary`); each id must be below the token count.
        Returns:
            The Vocabulary.
        Raises:
            TokenizerError: not a readable GGUF with a tokenizer, an unsupported `tokenizer.ggml.model` or token
                type, or no eos id given or found.
        """
        name = os.fspath(path)
        fields = _read_gguf_metadata(name)
        model, pieces = fields.get("tokenizer.ggml.model"), fields.get("tokenizer.ggml.tokens")
        if model is None or pieces is None:
            raise TokenizerError(f"GGUF file {name!r} has no tokenizer.ggml.model/tokens")
        if model == "gpt2":
            decode_piece, prefix = _byte_level_piece, False
        elif model in ("llama", "gemma4"):
            decode_piece = _metaspace_piece
            prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", model == "llama"))
        else:
            raise TokenizerError(f"unsupported tokenizer.ggml.model {model!r}: expected 'gpt2', 'llama' or 'gemma4'")
        types = fields.get("tokenizer.ggml.token_type") or [1] * len(pieces)
        tokens: list[bytes] = []
        specials: set[int] = set()
        for i, (piece, ty) in enumerate(zip(pieces, types)):
            if ty in (2, 3, 4, 5):  # unknown, control, user-defined, unused: never spelled by ordinary text
                specials.add(i)
                tokens.append(piece.encode("utf-8"))
            elif ty == 6:  # byte
                tokens.append(_byte_piece(piece, i))
            elif ty == 1:  # normal
                tokens.append(decode_piece(piece))
            else:
                raise TokenizerError(f"token {i} {piece!r} has GGUF token type {ty}: expected 1 to 6")
        for i, text in (added_tokens or {}).items():
            if not 0 <= int(i) < len(tokens):
                raise TokenizerError(f"added token {i} {text!r} is outside [0, {len(tokens)})")
            tokens[int(i)] = str(text).encode("utf-8")
            specials.add(int(i))
        if eos_ids is None:
            keys = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
            eos_ids = [fields[k] for k in keys if k in fields] + _eog_ids(tokens, specials)
        return cls._from_read((tokens, specials, prefix), eos_ids, vocab_size, name)

    @classmethod
    def from_mistral(
        cls, path: str | os.PathLike[str], *, eos_ids: Iterable[int] | None = None, vocab_size: int | None = None
    ) -> Vocabulary:
        """Read a mistral-common tokenizer file: Tekken (`tekken*.json`) or SentencePiece (`*.model*`).

        Loaded with mistral-common's own `MistralTokenizer.from_file`, then read as in `from_tokenizer`: Tekken's
        first `num_special_tokens` ids are special, the others are their raw bytes (`id_to_byte_piece`);
        SentencePiece control pieces are special and byte pieces are their byte.

        Args:
            path: the tokenizer file.
            eos_ids: default the tokenizer's `eos_id`.
            vocab_size: the logits width when larger than the token count.
        Raises:
            FileNotFoundError: no such file. TokenizerError: see `from_tokenizer`.
        """
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

        name = os.fspath(path)
        if not os.path.isfile(name):
            raise FileNotFoundError(f"no mistral-common tokenizer file at {name}")
        return cls.from_tokenizer(MistralTokenizer.from_file(name), eos_ids=eos_ids, vocab_size=vocab_size)

    @classmethod
    def _from_read(cls, read: tuple[list[bytes], set[int], bool], eos_ids: Iterable[int], vocab_size: int | None,
                   source: str) -> Vocabulary:
        tokens, specials, prefix = read
        eos = list(eos_ids)
        if not eos:
            # A real model must be able to stop; an empty set would make every mask forbid ending.
            raise TokenizerError(f"{source}: no eos token id found; pass eos_ids explicitly")
        return cls(tokens, special_ids=specials, eos_ids=eos, vocab_size=vocab_size, prefix_space=prefix)


# ----- GGUF metadata (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md), read directly: the gguf
# package's reader builds one numpy view per string and took 40 s on Gemma 4's 262k tokens (this: about 1 s).

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def _read_gguf_metadata(name: str) -> dict[str, Any]:
    """The key/value section of a GGUF file (v2 or v3); tensors are not read."""
    try:
        with open(name, "rb") as f:
            data = f.read()
    except OSError as err:
        raise TokenizerError(f"cannot read GGUF file {name!r}: {err}") from err
    try:
        magic, version, _n_tensors, n_kv = struct.unpack_from("<4sIQQ", data, 0)
        if magic != b"GGUF" or version not in (2, 3):
            raise TokenizerError(f"{name!r} is not a GGUF v2/v3 file (magic {magic!r}, version {version})")
        pos = 24

        def string() -> str:
            nonlocal pos
            (n,) = struct.unpack_from("<Q", data, pos)
            pos += 8 + n
            if pos > len(data):
                raise TokenizerError(f"{name!r}: a GGUF string runs past the end of the file")
            return data[pos - n : pos].decode("utf-8")

        def value(kind: int) -> Any:
            nonlocal pos
            if kind == _GGUF_STRING:
                return string()
            if kind == _GGUF_ARRAY:
                elem, n = struct.unpack_from("<IQ", data, pos)
                pos += 12
                if elem in _GGUF_SCALARS:
                    fmt = _GGUF_SCALARS[elem]
                    out = list(struct.unpack_from(f"<{n}{fmt[1]}", data, pos))
                    pos += n * struct.calcsize(fmt)
                    return out
                return [value(elem) for _ in range(n)]
            if kind in _GGUF_SCALARS:
                (out,) = struct.unpack_from(_GGUF_SCALARS[kind], data, pos)
                pos += struct.calcsize(_GGUF_SCALARS[kind])
                return out
            raise TokenizerError(f"{name!r}: unknown GGUF value type {kind} at byte {pos}")

        fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = string()
            (kind,) = struct.unpack_from("<I", data, pos)
            pos += 4
            fields[key] = value(kind)
        return fields
    except (struct.error, UnicodeDecodeError) as err:
        raise TokenizerError(f"{name!r}: truncated or malformed GGUF metadata: {err}") from err


# ----- end of generation, Qwen3's added tokens

# Texts of special tokens that end generation besides the declared EOS: the same policy as llama.cpp's EOG list
# (src/llama-vocab.cpp, `special_eog_ids`), so masks stop where engines stop (Llama 3's `<|eot_id|>`, Gemma 4's
# `<turn|>` and `<|tool_response>`). Only tokens that are already special are matched.
_EOG_TEXTS = frozenset({
    "<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<|return|>",
    "<|call|>", "<end_of_turn>", "</s>", "<EOT>", "[EOS]", "[EOT]", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "<end_of_utterance>",
})


def _eog_ids(tokens: Sequence[bytes], specials: Iterable[int]) -> list[int]:
    return [i for i in sorted(specials) if tokens[i].decode("utf-8", errors="replace") in _EOG_TEXTS]


# Qwen3's added tokens (tokenizer_config.json `added_tokens_decoder`, ids 151643-151668; see
# /work/shared/reference/tool-call-formats.md §1). `<tool_call>`, `<think>` etc. have `"special": false` there but
# are single added tokens: they are special here, so only a grammar that names them by id produces them.
QWEN3_ADDED_TOKENS: Mapping[int, str] = MappingProxyType({
    151643: "<|endoftext|>", 151644: "<|im_start|>", 151645: "<|im_end|>", 151646: "<|object_ref_start|>",
    151647: "<|object_ref_end|>", 151648: "<|box_start|>", 151649: "<|box_end|>", 151650: "<|quad_start|>",
    151651: "<|quad_end|>", 151652: "<|vision_start|>", 151653: "<|vision_end|>", 151654: "<|vision_pad|>",
    151655: "<|image_pad|>", 151656: "<|video_pad|>", 151657: "<tool_call>", 151658: "</tool_call>",
    151659: "<|fim_prefix|>", 151660: "<|fim_middle|>", 151661: "<|fim_suffix|>", 151662: "<|fim_pad|>",
    151663: "<|repo_name|>", 151664: "<|file_sep|>", 151665: "<tool_response>", 151666: "</tool_response>",
    151667: "<think>", 151668: "</think>",
})
QWEN3_EOS_IDS = (151645, 151643)  # <|im_end|>, <|endoftext|>
QWEN3_VOCAB_SIZE = 151936


def qwen3_vocabulary(path: str | os.PathLike[str] | None = None) -> Vocabulary:
    """Qwen3's vocabulary: a GGUF with Qwen's 151k base tokens, with Qwen3's added tokens overlaid as special.

    The qwen2 vocab GGUF holds the same base tokens but placeholder (`[PAD…]`) added tokens from 151646 on.
    EOS = `<|im_end|>` 151645 and `<|endoftext|>` 151643; vocab_size 151936 (Qwen3's logits width).

    Args:
        path: the GGUF; default the cached `ggml-vocab-qwen2.gguf` (`python -m constrain.assets fetch`).
    Raises:
        FileNotFoundError: the default GGUF is not cached. TokenizerError: see `Vocabulary.from_gguf`.
    """
    if path is None:
        from constrain.assets import gguf_path

        path = gguf_path("qwen2")
    return Vocabulary.from_gguf(path, eos_ids=QWEN3_EOS_IDS, vocab_size=QWEN3_VOCAB_SIZE,
                                added_tokens=QWEN3_ADDED_TOKENS)


def _rebuild(tokens, special_ids, eos_ids, vocab_size, prefix_space) -> Vocabulary:
    return Vocabulary(tokens, special_ids=special_ids, eos_ids=eos_ids, vocab_size=vocab_size,
                      prefix_space=prefix_space)


def _kind_of(tokenizer: Any) -> str | None:
    # Check by module name so that constrain imports none of these optional packages itself.
    for klass in type(tokenizer).__mro__:
        root = klass.__module__.split(".")[0]
        if root in ("transformers", "tokenizers", "sentencepiece", "tiktoken", "mistral_common"):
            return "mistral" if root == "mistral_common" else root
    return None


# ----- piece spellings

def _byte_alphabet() -> dict[str, int]:
    # GPT-2's byte-level alphabet: printable Latin-1 bytes stand for themselves, the others for U+0100 onwards.
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    table = {chr(b): b for b in printable}
    table.update({chr(0x100 + n): b for n, b in enumerate(others)})
    return table


_BYTE_OF_CHAR = _byte_alphabet()


def _byte_level_piece(piece: str) -> bytes:
    # Same rule as the tokenizers ByteLevel decoder: a piece made only of alphabet characters is mapped back to
    # bytes; any other piece (an added token such as "<tool call>", with a space) is emitted as its UTF-8.
    try:
        return bytes(_BYTE_OF_CHAR[c] for c in piece)
    except KeyError:
        return piece.encode("utf-8")


def _metaspace_piece(piece: str) -> bytes:
    return piece.replace(_SPACE_MARK, " ").encode("utf-8")


def _is_byte_piece(piece: str) -> bool:
    return (len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")
            and all(c in "0123456789ABCDEFabcdef" for c in piece[3:5]))


def _byte_piece(piece: str, token_id: int) -> bytes:
    if not _is_byte_piece(piece):
        raise TokenizerError(f"byte token {token_id} is {piece!r}: expected the form <0xNN>")
    return bytes([int(piece[3:5], 16)])


# ----- tokenizers / transformers (tokenizer.json)

def _decoder_steps(decoder: dict | None) -> list[dict]:
    if decoder is None:
        # With no decoder, tokenizers joins the pieces with spaces: not a byte concatenation.
        raise TokenizerError("tokenizer.json has no decoder: expected ByteLevel or a ▁/ByteFallback sequence")
    if decoder["type"] == "Sequence":
        return [step for sub in decoder["decoders"] for step in _decoder_steps(sub)]
    return [decoder]


def _from_hf_json(spec: dict, n_tokens: int) -> tuple[list[bytes], set[int], bool]:
    model = spec["model"]
    if model["type"] in ("BPE", "WordLevel"):
        pieces_by_id = {i: piece for piece, i in model["vocab"].items()}
    elif model["type"] == "Unigram":
        pieces_by_id = {i: entry[0] for i, entry in enumerate(model["vocab"]) if i != model.get("unk_id")}
    else:
        raise TokenizerError(f"unsupported tokenizer model {model['type']!r}: expected BPE, Unigram or WordLevel")

    byte_level = byte_fallback = prefix = False
    for step in _decoder_steps(spec.get("decoder")):
        kind = step["type"]
        if kind == "ByteLevel":
            byte_level = True
        elif kind == "ByteFallback":
            byte_fallback = True
        elif kind == "Fuse":
            pass  # joins pieces into one string; the bytes are unchanged
        elif kind == "Replace" and step["pattern"] == {"String": _SPACE_MARK} and step["content"] == " ":
            pass
        elif kind == "Metaspace" and step.get("replacement", _SPACE_MARK) == _SPACE_MARK:
            scheme = step.get("prepend_scheme", "always" if step.get("add_prefix_space", True) else "never")
            prefix = prefix or scheme != "never"
        elif kind == "Strip" and step["content"] == " " and step["start"] <= 1 and step["stop"] == 0:
            prefix = prefix or step["start"] == 1
        else:
            raise TokenizerError(f"unsupported decoder step {json.dumps(step)}: its output is not a byte "
                                 "concatenation of the tokens")
    if byte_level and byte_fallback:
        raise TokenizerError("decoder mixes ByteLevel and ByteFallback: expected one of them")

    added = {entry["id"]: entry for entry in spec.get("added_tokens", [])}
    n = max([n_tokens, *(i + 1 for i in pieces_by_id), *(i + 1 for i in added)])
    tokens = [b""] * n
    specials: set[int] = set()
    for i in range(n):
        entry = added.get(i)
        # Every added token is special, `"special": false` ones too (Qwen's `<tool_call>`, `<think>`): the
        # tokenizer matches them in plain text before BPE, so they are markers that a grammar names by id.
        if entry is not None:
            specials.add(i)
            tokens[i] = entry["content"].encode("utf-8")
            continue
        piece = pieces_by_id.get(i)
        if piece is None:
            continue  # a hole in the ids, or <unk>: adds nothing
        if byte_level:
            tokens[i] = _byte_level_piece(piece)
        elif byte_fallback and _is_byte_piece(piece):
            tokens[i] = _byte_piece(piece, i)
        else:
            tokens[i] = _metaspace_piece(piece)
    return tokens, specials, prefix


# ----- sentencepiece, tiktoken, tekken

def _from_sentencepiece(sp: Any) -> tuple[list[bytes], set[int], bool]:
    tokens: list[bytes] = []
    specials: set[int] = set()
    for i in range(sp.get_piece_size()):
        piece = sp.id_to_piece(i)
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i):
            specials.add(i)
            tokens.append(piece.encode("utf-8"))
        elif sp.is_byte(i):
            tokens.append(_byte_piece(piece, i))
        else:
            tokens.append(_metaspace_piece(piece))
    # The dummy prefix is a normalizer setting that the Python API does not expose; it shows in how "a" encodes.
    first = sp.encode("a", out_type=str)
    return tokens, specials, bool(first) and first[0].startswith(_SPACE_MARK)


def _from_tiktoken(enc: Any) -> tuple[list[bytes], set[int], bool]:
    names = {enc.encode_single_token(name): name for name in enc.special_tokens_set}
    tokens: list[bytes] = []
    for i in range(enc.n_vocab):
        if i in names:
            tokens.append(names[i].encode("utf-8"))
            continue
        try:
            tokens.append(enc.decode_single_token_bytes(i))
        except KeyError:
            tokens.append(b"")  # a hole between the ranks and the special tokens
    return tokens, set(names), False


def _from_tekken(tek: Any) -> tuple[list[bytes], set[int], bool]:
    # Tekken puts its special tokens first: ids [0, num_special_tokens), then the byte ranks.
    n_special = tek.num_special_tokens
    tokens = [tek.id_to_piece(i).encode("utf-8") for i in range(n_special)]
    tokens += [tek.id_to_byte_piece(i) for i in range(n_special, tek.n_words)]
    return tokens, set(range(n_special)), False
