"""Test assets: real tokenizer files (llama.cpp vocab-only GGUFs, chat templates, mistral-common data) in a local cache.

`python -m constrain.assets fetch` fills the cache from the llama-cpp-python sdist on PyPI; lookups never download.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
_SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# The vocabularies the tests rely on, pinned: a changed file would silently change every real-tokenizer test.
PINNED_GGUF_SHA256 = {
    "llama-bpe": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
    "qwen2": "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
    "gemma-4": "58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65",
    "gpt-2": "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
    "phi-3": "967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326",
    "llama-spm": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
}
_FETCH_HINT = "run `python -m constrain.assets fetch` to fill the asset cache"

# Members of the sdist we keep, relative to its `vendor/llama.cpp/models/` folder.
# `.gguf.inp`/`.gguf.out` are llama.cpp's tokenizer test cases (texts and the token ids llama.cpp gives them),
# an exact tokenisation oracle for vocabularies that transformers cannot load.
_GGUF_MEMBER = re.compile(r"^[^/]+/vendor/llama\.cpp/models/(ggml-vocab-[A-Za-z0-9._-]+\.gguf(?:\.inp|\.out)?)$")
_TEMPLATE_MEMBER = re.compile(r"^[^/]+/vendor/llama\.cpp/models/templates/([^/]+\.jinja)$")


def cache_dir() -> Path:
    """The asset cache: `$CONSTRAIN_ASSETS` if set, else `~/.cache/constrain/assets` (not created here)."""
    env = os.environ.get("CONSTRAIN_ASSETS")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "constrain" / "assets"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _existing(path: Path, what: str) -> Path:
    if not path.is_file() or path.stat().st_size == 0:
        raise FileNotFoundError(f"{what} not found at {path}; {_FETCH_HINT}")
    return path


def gguf_path(name: str) -> Path:
    """Path of llama.cpp's vocab-only GGUF `ggml-vocab-<name>.gguf` in the cache.

    Args:
        name: the vocabulary name, e.g. "llama-bpe", "qwen2", "gemma-4", "gpt-2", "phi-3", "llama-spm".
    Returns:
        The path of an existing, non-empty file.
    Raises:
        FileNotFoundError: the file is not in the cache (the message says how to fetch it).
    """
    return _existing(cache_dir() / "gguf" / f"ggml-vocab-{name}.gguf", f"vocab GGUF {name!r}")


def gguf_test_cases(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test cases for `ggml-vocab-<name>.gguf`: (text, token ids without BOS) pairs.

    Raises:
        FileNotFoundError: the `.inp`/`.out` files are not in the cache.
        ValueError: the two files disagree on the number of cases.
    """
    inp = _existing(cache_dir() / "gguf" / f"ggml-vocab-{name}.gguf.inp", f"test inputs of {name!r}")
    out = _existing(cache_dir() / "gguf" / f"ggml-vocab-{name}.gguf.out", f"test outputs of {name!r}")
    # Same framing as llama.cpp's tests/test-tokenizer-0: cases separated by a marker line, one id line per case.
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    if texts and texts[-1] == "":
        texts.pop()
    lines = out.read_text(encoding="utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(texts) != len(lines):
        raise ValueError(f"{inp.name} has {len(texts)} cases but {out.name} has {len(lines)} lines")
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]


def template_path(name: str) -> Path:
    """Path of llama.cpp's chat template `models/templates/<name>.jinja` in the cache (`name` without `.jinja`).

    Raises:
        FileNotFoundError: the template is not in the cache.
    """
    return _existing(cache_dir() / "templates" / f"{name}.jinja", f"chat template {name!r}")


def mistral_tokenizer_path(kind: str) -> Path:
    """A tokenizer file shipped inside the installed mistral-common package data.

    Args:
        kind: "tekken" (newest `tekken_*.json`) or "sentencepiece" (newest `mistral_instruct_tokenizer_*.model.v*`).
    Returns:
        The path of an existing file.
    Raises:
        ValueError: unknown `kind`.
        FileNotFoundError: mistral-common is not installed or ships no such file.
    """
    patterns = {"tekken": "tekken_*.json", "sentencepiece": "mistral_instruct_tokenizer_*.model.v*"}
    if kind not in patterns:
        raise ValueError(f"kind must be one of {sorted(patterns)}, got {kind!r}")
    try:
        import mistral_common
    except ImportError as err:
        raise FileNotFoundError("mistral-common is not installed (pip install mistral-common)") from err
    data = Path(mistral_common.__file__).parent / "data"
    # File names carry a yymmdd date then an optional version suffix (.v7, .v7m1): sort by name, newest last.
    found = sorted(p for p in data.glob(patterns[kind]) if p.is_file() and p.stat().st_size > 0)
    if not found:
        raise FileNotFoundError(f"mistral-common {mistral_common.__version__} ships no {patterns[kind]} in {data}")
    return found[-1]


def fetch(*, force: bool = False, log=print) -> Path:
    """Fill the cache with the vocab GGUFs (and their test cases) and chat templates of llama-cpp-python's sdist.

    Idempotent: does nothing when the cache already holds the GGUFs and templates, unless `force`.
    Args:
        force: download and extract again even if the cache looks complete.
        log: where progress lines go.
    Returns:
        The cache directory.
    Raises:
        RuntimeError: `pip download` failed, or the sdist lacks the expected files.
    """
    root = cache_dir()
    gguf_dir, tmpl_dir = root / "gguf", root / "templates"
    marker = root / f".fetched-llama-cpp-python-{LLAMA_CPP_PYTHON_VERSION}"
    complete = marker.is_file() and all((gguf_dir / f"ggml-vocab-{n}.gguf").is_file() for n in PINNED_GGUF_SHA256)
    if complete and not force:
        log(f"asset cache {root} is complete (llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}); nothing to do")
        return root
    gguf_dir.mkdir(parents=True, exist_ok=True)
    tmpl_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="constrain-assets-") as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", tmp,
        ]
        log("running: " + " ".join(cmd))
        done = subprocess.run(cmd, capture_output=True, text=True)
        sdist = Path(tmp) / _SDIST_NAME
        if done.returncode != 0 or not sdist.is_file():
            raise RuntimeError(f"pip download failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        if (got := _sha256(sdist)) != _SDIST_SHA256:
            raise RuntimeError(f"{_SDIST_NAME} has sha256 {got}, expected {_SDIST_SHA256}")
        counts = {"gguf": 0, "templates": 0}
        with tarfile.open(sdist, "r:gz") as tar:
            for member in tar:
                if not member.isfile():
                    continue
                if m := _GGUF_MEMBER.match(member.name):
                    dest, kind = gguf_dir / m.group(1), "gguf"
                elif m := _TEMPLATE_MEMBER.match(member.name):
                    dest, kind = tmpl_dir / m.group(1), "templates"
                else:
                    continue
                src = tar.extractfile(member)
                assert src is not None  # isfile() members always have a stream
                part = dest.with_name(dest.name + ".part")
                with src, open(part, "wb") as fh:
                    shutil.copyfileobj(src, fh)
                if part.stat().st_size != member.size:
                    raise RuntimeError(f"{member.name}: wrote {part.stat().st_size} bytes, expected {member.size}")
                part.replace(dest)
                counts[kind] += 1
    n_vocab = len(list(gguf_dir.glob("ggml-vocab-*.gguf")))
    n_tmpl = len(list(tmpl_dir.glob("*.jinja")))
    if n_vocab == 0 or n_tmpl == 0:
        raise RuntimeError(f"the sdist gave {n_vocab} vocab GGUFs and {n_tmpl} templates; expected some of each")
    for name, want in PINNED_GGUF_SHA256.items():
        if (got := _sha256(gguf_path(name))) != want:
            raise RuntimeError(f"ggml-vocab-{name}.gguf has sha256 {got}, expected {want}")
    marker.write_text(f"{n_vocab} gguf, {n_tmpl} templates\n")
    log(f"extracted {counts['gguf']} GGUF files ({n_vocab} vocabularies) into {gguf_dir}")
    log(f"extracted {counts['templates']} chat templates into {tmpl_dir}")
    for kind in ("tekken", "sentencepiece"):
        try:
            log(f"mistral-common {kind}: {mistral_tokenizer_path(kind)}")
        except FileNotFoundError as err:
            log(f"mistral-common {kind}: missing ({err})")
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m constrain.assets", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    fetch_cmd = sub.add_parser("fetch", help="download and extract the test assets (idempotent)")
    fetch_cmd.add_argument("--force", action="store_true", help="fetch again even if the cache is complete")
    sub.add_parser("where", help="print the cache directory")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        fetch(force=args.force)
    else:
        print(cache_dir())
    return 0


if __name__ == "__main__":
    sys.exit(main())
