"""What identifies the model an engine serves, for keys that outlive the process.

Store keys carry a model id (:class:`~hypic.pic.keys.KeyNamespace`), and the segment store's
disk tier (:mod:`hypic.pic.disk_tier`) records the engine that wrote it, so that entries are
never read by an engine of another model, dtype or configuration. The model id is made from the
checkpoint's content, not its path: a directory of entries moved to another machine (or a
checkpoint copied elsewhere) keeps its hits, and two checkpoints of one architecture whose
weights differ (two fine-tunes) never share entries.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Dict

# bytes read from each end of every weight file: two fine-tunes of one architecture differ in
# almost every block of their weights, and reading whole files would cost seconds per GB
SAMPLE_BYTES = 1 << 20
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")


def model_fingerprint(model_dir: os.PathLike, load_format: str, seed: int) -> str:
    """A sha256 hex digest of the model's ``config.json``, its weight files (name, size, first and
    last :data:`SAMPLE_BYTES`) and, for dummy weights, the load format and seed that draw them."""
    folder = Path(model_dir)
    h = hashlib.sha256()
    config = folder / "config.json"
    h.update(config.read_bytes() if config.is_file() else b"")
    h.update(f"|{load_format}|".encode())
    if load_format == "dummy":
        h.update(f"seed={seed}".encode())
    else:
        for path in sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file()):
            size = path.stat().st_size
            h.update(f"|{path.name}|{size}|".encode())
            with open(path, "rb") as f:
                h.update(f.read(SAMPLE_BYTES))
                if size > SAMPLE_BYTES:
                    f.seek(max(SAMPLE_BYTES, size - SAMPLE_BYTES))
                    h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def store_fingerprint(model_id: str, dtype: str, hash_name: str = "sha256") -> Dict[str, str]:
    """What a segment-store directory records about the engine that wrote it (every field must
    match for another engine to read it)."""
    return {"model": model_id, "dtype": dtype, "key_hash": hash_name}


__all__ = ["SAMPLE_BYTES", "model_fingerprint", "store_fingerprint"]
