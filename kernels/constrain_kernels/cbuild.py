"""Build a C source once per machine with the system compiler and load it with ctypes (the native mask pass and the
automaton passes use it). Standard library only, so that any module may import it.

`CONSTRAIN_NATIVE=0` turns every native library off; `$CONSTRAIN_KERNELS` overrides the build cache
(`~/.cache/constrain/kernels`). A library that cannot be built warns once, naming the slower path used instead.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

__all__ = ["FLAGS", "build"]

FLAGS = ("-O3", "-shared", "-fPIC")


def build(stem: str, source: str, *, fallback: str) -> ctypes.CDLL | None:
    """The shared library of `source`, compiled on first use and cached on disk by source, compiler and flags.

    Returns None (after one RuntimeWarning that says `fallback`, the path callers take instead) when no C compiler
    is found or the build fails, and None without a warning when `CONSTRAIN_NATIVE=0`.
    """
    if os.environ.get("CONSTRAIN_NATIVE", "1") == "0":
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        warnings.warn(f"no C compiler found; {fallback}", RuntimeWarning, stacklevel=3)
        return None
    env_dir = os.environ.get("CONSTRAIN_KERNELS")
    cache = Path(env_dir).expanduser() if env_dir else Path.home() / ".cache" / "constrain" / "kernels"
    key = "\0".join([source, cc, *FLAGS, platform.machine(), platform.system()])
    so = cache / f"{stem}_{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"
    try:
        if not so.exists():
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                src = Path(tmp) / f"{stem}.c"
                src.write_text(source)
                out = Path(tmp) / so.name
                subprocess.run([cc, *FLAGS, "-o", str(out), str(src)], check=True, capture_output=True, timeout=120)
                os.replace(out, so)  # atomic: concurrent builders each install a whole file
        return ctypes.CDLL(str(so))
    except (OSError, subprocess.SubprocessError) as err:
        detail = getattr(err, "stderr", b"") or b""
        warnings.warn(f"building {stem} failed ({type(err).__name__}: {err} "
                      f"{detail.decode(errors='replace')[:500]}); {fallback}", RuntimeWarning, stacklevel=3)
        return None
