"""Model definitions (HF-shaped, no serving logic), config reading and weight loading."""

from hypic.models.config import ModelSpec, load_spec, spec_from_config

__all__ = ["ModelSpec", "load_spec", "spec_from_config"]
