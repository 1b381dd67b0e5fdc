"""Import the reference package `qwen-tts` as a test oracle, on a CPU machine.

`import qwen_tts` pulls in the 25 Hz tokenizer, which imports torchaudio (PyPI's build is
CUDA-only and fails to load here), sox and onnxruntime. The 12 Hz path we compare against
uses none of them, so we register empty modules under those names before importing.
The oracle is installed by `tests/install.sh`, never as a dependency of voxmesh itself.
"""

from __future__ import annotations

import importlib.machinery
import sys
import types

_STUBBED = ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi", "sox", "onnxruntime")


def _stub_unused_modules() -> None:
    for name in _STUBBED:
        if name in sys.modules:
            continue
        module = types.ModuleType(name)
        # transformers probes packages with importlib.util.find_spec, which needs a spec.
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = module
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]


def load():
    """Return the `qwen_tts` package, importable on a CPU-only machine."""
    _stub_unused_modules()
    import qwen_tts

    return qwen_tts
