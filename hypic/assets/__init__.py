"""Embedded model assets and the resolution of model names to checkpoint folders.

``"tiny"`` names the embedded default model (``hypic/assets/tiny/``): a small Qwen3.5-architecture
checkpoint in Hugging Face format, trained on the synthetic suites of :mod:`hypic.data` by
``training/train_tiny.py`` (word-level tokenizer over the suite vocabulary; see its README.md).
``make_seeded_tiny.py`` writes a seeded random test model elsewhere; it is not this model.
"""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
TINY_MODEL_DIR = ASSETS_DIR / "tiny"

# Names that resolve to embedded checkpoints rather than to folders on disk.
EMBEDDED_MODELS = {"tiny": TINY_MODEL_DIR}


def resolve_model_path(model: str | Path) -> Path:
    """Map a model argument (an embedded name such as ``"tiny"`` or a folder) to a folder.

    Raises ValueError with the offending value when the folder does not exist or lacks a
    ``config.json``, so a typo fails at once instead of deep inside the loader.
    """
    if not isinstance(model, (str, Path)):
        raise ValueError(f"model must be a str or Path, got {type(model).__name__}")
    if isinstance(model, str) and model in EMBEDDED_MODELS:
        path = EMBEDDED_MODELS[model]
    else:
        path = Path(model).expanduser()
    if not path.is_dir():
        known = ", ".join(sorted(EMBEDDED_MODELS))
        raise ValueError(
            f"model {str(model)!r}: no such folder (give a checkpoint folder or one of: {known})"
        )
    if not (path / "config.json").is_file():
        raise ValueError(f"model {str(model)!r}: folder {path} has no config.json")
    return path
