"""hypic: a serving engine for hybrid linear/full-attention LLMs with position-independent caching."""

__version__ = "0.1.0"
__all__ = ["EngineConfig", "LLM", "SamplingParams", "__version__"]


def __getattr__(name):
    # Lazy so that `import hypic.ops...` does not pull the engine (and its model code) in.
    if name == "LLM":
        from hypic.entrypoints.llm import LLM

        return LLM
    if name == "EngineConfig":
        from hypic.config import EngineConfig

        return EngineConfig
    if name == "SamplingParams":
        from hypic.engine.sampling import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'hypic' has no attribute {name!r}")
