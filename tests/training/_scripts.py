"""Loading the training scripts (training/*.py, not a package) as modules."""

import importlib.util
import os
import sys

TRAINING_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "training"))


def load_script(name: str):
    """``training/<name>.py`` as the module ``name`` (the scripts import each other by that name)."""
    if name in sys.modules:
        return sys.modules[name]
    if TRAINING_DIR not in sys.path:
        sys.path.insert(0, TRAINING_DIR)
    spec = importlib.util.spec_from_file_location(name, os.path.join(TRAINING_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module
