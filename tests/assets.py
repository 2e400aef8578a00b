"""Real-tokenizer test assets: pinned files taken out of pinned PyPI packages into a local cache, and their loaders.

Run `python tests/assets.py` once (CI does, in .ci/run) to fill the cache; tests never download anything.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


class AssetError(Exception):
    """An asset is missing from the cache, or a fetched file does not have its pinned sha256."""


@dataclass(frozen=True)
class Archive:
    """One pinned package release and the files taken out of it (cache name → path inside the archive)."""

    requirement: str  # "name==version", what pip downloads
    binary: bool  # True: the wheel; False: the source distribution
    members: dict[str, str]


# llama.cpp ships vocab-only GGUF files with test texts (.inp) and the ids its tokenizer gives them (.out); the
# llama-cpp-python sdist vendors them. mistral-common's wheel carries Mistral's own tokenizer files.
_LLAMA = "llama_cpp_python-0.3.36/vendor/llama.cpp/models/"
_GGUF_VOCABS = ("gpt-2", "llama-bpe", "qwen2", "llama-spm", "gemma-4")
ARCHIVES = (
    Archive(
        "llama-cpp-python==0.3.36",
        binary=False,
        members={
            f"ggml-vocab-{name}.gguf{ext}": f"{_LLAMA}ggml-vocab-{name}.gguf{ext}"
            for name in _GGUF_VOCABS
            for ext in ("", ".inp", ".out")
        },
    ),
    Archive(
        "mistral-common==1.13.1",
        binary=True,
        members={
            "mistral-v3.model": "mistral_common/data/mistral_instruct_tokenizer_240323.model.v3",
            "tekken-240718.json": "mistral_common/data/tekken_240718.json",
        },
    ),
)

SHA256 = {
    "ggml-vocab-gpt-2.gguf": "cedc56ca6e2e89f63e781696d1fd76b4b1d49e6720dee86463e915f6e90016ac",
    "ggml-vocab-gpt-2.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-gpt-2.gguf.out": "48e8c4cb3ad5c37915b225f872222567c1c4dd4d66951aa53460c8d152ff6d60",
    "ggml-vocab-llama-bpe.gguf": "97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e",
    "ggml-vocab-llama-bpe.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-llama-bpe.gguf.out": "118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b",
    "ggml-vocab-qwen2.gguf": "44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c",
    "ggml-vocab-qwen2.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-qwen2.gguf.out": "de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363",
    "ggml-vocab-llama-spm.gguf": "16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69",
    "ggml-vocab-llama-spm.gguf.inp": "be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0",
    "ggml-vocab-llama-spm.gguf.out": "ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29",
    "ggml-vocab-gemma-4.gguf": "58b1ba0b57f3b4d7c468ba4ffd91ad85190346a3d7ad7e71d1cabaae8a14bb65",
    "ggml-vocab-gemma-4.gguf.inp": "0528aa007b06965f980181d252b5dff7bb170a77af6157bd48bba56885374448",
    "ggml-vocab-gemma-4.gguf.out": "ba8c596bcd05e97e62566fa994b42eeaeffd6a4e4b4a4abe7b5b689aa6b43bf3",
    "mistral-v3.model": "9addc8bdce5988448ae81b729336f43a81262160ae8da760674badab9d4c7d33",
    "tekken-240718.json": "eccd1665d2e477697c33cb7f0daa6f6dfefc57a0a6bceb66d4be52952f827516",
}

GGUF_VOCABS = _GGUF_VOCABS


def cache_dir() -> Path:
    """Where assets live: `$CONSTRAIN_ASSETS`, else `$XDG_CACHE_HOME/constrain/assets` (default `~/.cache`)."""
    if os.environ.get("CONSTRAIN_ASSETS"):
        return Path(os.environ["CONSTRAIN_ASSETS"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "constrain" / "assets"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_cached(name: str) -> bool:
    """True when `name` is in the cache with its pinned sha256."""
    path = cache_dir() / name
    return path.is_file() and _sha256(path) == SHA256[name]


def asset_path(name: str) -> Path:
    """The cached file `name`, checked against its pinned sha256.

    Raises:
        AssetError: not cached or corrupt; the message says how to fill the cache.
    """
    if name not in SHA256:
        raise AssetError(f"unknown asset {name!r}: expected one of {sorted(SHA256)}")
    if not is_cached(name):
        raise AssetError(f"test asset {name!r} is not in {cache_dir()} (or its sha256 differs): "
                         f"run `python tests/assets.py` to fetch it")
    return cache_dir() / name


def _download(archive: Archive, into: Path) -> Path:
    kind = ["--only-binary", ":all:"] if archive.binary else ["--no-binary", ":all:"]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", *kind, "-d", str(into),
           archive.requirement]
    subprocess.run(cmd, check=True)
    (found,) = [p for p in into.iterdir() if p.suffix in (".whl", ".gz")]
    return found


def _extract(archive_file: Path, members: dict[str, str], dest: Path) -> None:
    wanted = {inner: name for name, inner in members.items()}
    if archive_file.suffix == ".whl":
        with zipfile.ZipFile(archive_file) as z:
            blobs = {wanted[i]: z.read(i) for i in z.namelist() if i in wanted}
    else:
        with tarfile.open(archive_file, "r:gz") as t:
            blobs = {wanted[m.name]: t.extractfile(m).read() for m in t.getmembers() if m.name in wanted and m.isfile()}
    missing = sorted(set(members) - set(blobs))
    if missing:
        raise AssetError(f"{archive_file.name} lacks {missing}")
    for name, data in blobs.items():
        digest = hashlib.sha256(data).hexdigest()
        if digest != SHA256[name]:
            raise AssetError(f"{name} from {archive_file.name} has sha256 {digest}, expected {SHA256[name]}")
        tmp = dest / (name + ".part")
        tmp.write_bytes(data)
        tmp.replace(dest / name)  # atomic: a reader never sees half a file


def fetch_all() -> list[str]:
    """Fill the cache: download each archive that has a missing member, take out its files, check their sha256.

    Returns:
        The names fetched this time (empty when everything was cached).
    Raises:
        AssetError: a file is missing from its archive or has the wrong sha256.
        subprocess.CalledProcessError: pip could not download a package.
    """
    dest = cache_dir()
    dest.mkdir(parents=True, exist_ok=True)
    fetched: list[str] = []
    for archive in ARCHIVES:
        todo = {name: inner for name, inner in archive.members.items() if not is_cached(name)}
        if not todo:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            _extract(_download(archive, Path(tmp)), todo, dest)
        fetched += sorted(todo)
    return fetched


def read_gguf_cases(name: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's tokenizer test cases for vocab `name`: (text, the ids llama.cpp's tokenizer gives it)."""
    base = asset_path(f"ggml-vocab-{name}.gguf.inp")
    texts = base.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
    if texts and texts[-1] == "":  # most files end with a separator, gemma-4's does not
        texts.pop()
    lines = asset_path(f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    if len(lines) < len(texts) or any(line.strip() for line in lines[len(texts):]):
        raise AssetError(f"{name}: {len(texts)} texts but {len(lines)} id lines")
    return [(text, [int(x) for x in line.split()]) for text, line in zip(texts, lines)]


def main() -> int:
    fetched = fetch_all()
    print(f"test assets in {cache_dir()}: fetched {len(fetched)}, {len(SHA256) - len(fetched)} already cached")
    return 0


if __name__ == "__main__":
    sys.exit(main())
