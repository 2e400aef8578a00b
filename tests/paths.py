"""Where the shared test data lives: $CONSTRAIN_DATA, else `shared/data` beside the repository (where CI lays it)."""

import os
from pathlib import Path

DATA = Path(os.environ.get("CONSTRAIN_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")
