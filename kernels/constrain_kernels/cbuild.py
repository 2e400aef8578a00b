"""Build a C source once per machine with the system compiler and load it with ctypes (the native mask pass and the
automaton passes use it) or as a CPython extension module (the cursor's per-token calls). Standard library only, so
that any module may import it.

`CONSTRAIN_NATIVE=0` turns every native library off; `$CONSTRAIN_KERNELS` overrides the build cache
(`~/.cache/constrain/kernels`). A library that cannot be built warns once, naming the slower path used instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import importlib.machinery
import importlib.util
import os
import platform
import shutil
import subprocess
import sysconfig
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["FLAGS", "build", "build_module"]

FLAGS = ("-O3", "-shared", "-fPIC")


def build(stem: str, source: str, *, fallback: str) -> ctypes.CDLL | None:
    """The shared library of `source`, compiled on first use and cached on disk by source, compiler and flags.

    Returns None (after one RuntimeWarning that says `fallback`, the path callers take instead) when no C compiler
    is found or the build fails, and None without a warning when `CONSTRAIN_NATIVE=0`.
    """
    so = _compiled(stem, source, (), fallback)
    return None if so is None else _load(stem, fallback, lambda: ctypes.CDLL(str(so)))


def build_module(name: str, source: str, *, fallback: str) -> ModuleType | None:
    """The CPython extension module `name` (`source` defines `PyInit_<name>`), compiled against this interpreter's
    headers on first use and cached as `build` caches; None as `build` returns it, also where the headers are missing.
    A call into it costs ~0.05 us where a ctypes call costs ~0.6."""
    include = sysconfig.get_paths().get("include") or ""
    if os.environ.get("CONSTRAIN_NATIVE", "1") != "0" and not Path(include, "Python.h").exists():
        warnings.warn(f"no Python.h under {include!r}; {fallback}", RuntimeWarning, stacklevel=2)
        return None
    so = _compiled(name, source, (f"-I{include}", sysconfig.get_config_var("SOABI") or ""), fallback)

    def load() -> ModuleType:
        loader = importlib.machinery.ExtensionFileLoader(name, str(so))
        spec = importlib.util.spec_from_file_location(name, str(so), loader=loader)
        module = importlib.util.module_from_spec(spec)
        loader.exec_module(module)
        return module

    return None if so is None else _load(name, fallback, load)


def _compiled(stem: str, source: str, extra: tuple[str, ...], fallback: str) -> Path | None:
    """The path of `source` compiled (with `extra` flags; an entry without a leading '-' only keys the cache)."""
    if os.environ.get("CONSTRAIN_NATIVE", "1") == "0":
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        warnings.warn(f"no C compiler found; {fallback}", RuntimeWarning, stacklevel=3)
        return None
    env_dir = os.environ.get("CONSTRAIN_KERNELS")
    cache = Path(env_dir).expanduser() if env_dir else Path.home() / ".cache" / "constrain" / "kernels"
    key = "\0".join([source, cc, *FLAGS, *extra, platform.machine(), platform.system()])
    so = cache / f"{stem}_{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
    flags = [f for f in extra if f.startswith("-")]
    try:
        if not so.exists():
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                src = Path(tmp) / f"{stem}.c"
                src.write_text(source)
                out = Path(tmp) / so.name
                subprocess.run([cc, *FLAGS, *flags, "-o", str(out), str(src)], check=True, capture_output=True,
                               timeout=120)
                os.replace(out, so)  # atomic: concurrent builders each install a whole file
        return so
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", b"") or b""
        warnings.warn(f"building {stem} failed ({type(err).__name__}: {err} "
                      f"{detail.decode(errors='replace')[:500]}); {fallback}", RuntimeWarning, stacklevel=3)
        return None


def _load(stem: str, fallback: str, load: Callable[[], Any]) -> Any:
    try:
        return load()
    except (OSError, ImportError) as err:
        warnings.warn(f"loading {stem} failed ({type(err).__name__}: {err}); {fallback}", RuntimeWarning, stacklevel=3)
        return None
