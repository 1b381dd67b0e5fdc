"""Every Triton kernel lives in services/kernels: a leaf package that imports torch, triton and itself only; the
model keeps the torch forms and chooses a kernel through its layers."""

from __future__ import annotations

from pathlib import Path

from tests.support.architecture import imports_outside, triton_uses

ROOT = Path(__file__).resolve().parents[2]
KERNELS = "services/kernels"


def triton_outside_the_kernels(root: Path) -> list[str]:
    """Each triton import or kernel definition under `root`'s services/ and messages/ outside services/kernels."""
    return [str(finding) for finding in triton_uses(root) if not finding.path.startswith(KERNELS + "/")]


def test_no_triton_outside_the_kernels_package():
    assert triton_outside_the_kernels(ROOT) == []


def test_the_kernels_package_holds_the_kernels():
    assert any(finding.path.startswith(KERNELS + "/codec/") for finding in triton_uses(ROOT))
    assert len({finding.path for finding in triton_uses(ROOT)}) >= 15


def test_the_kernels_package_imports_nothing_of_the_services_but_itself():
    assert [str(finding) for finding in imports_outside(ROOT, KERNELS, ["services.kernels"])] == []


def test_a_planted_kernel_is_reported(tmp_path):
    model = tmp_path / "services" / "model"
    (tmp_path / "services" / "kernels").mkdir(parents=True)
    model.mkdir(parents=True)
    (tmp_path / "services" / "kernels" / "fine.py").write_text(
        "import triton\nimport triton.language as tl\n\n@triton.jit\ndef _k(x):\n    pass\n")
    (model / "stray.py").write_text(
        "import torch\n\n"
        "def lazy():\n    from triton import language as tl  # inside a function: still an import\n\n"
        "@triton.jit\ndef _kernel(x_ptr, BLOCK: tl.constexpr):\n    pass\n")
    assert triton_outside_the_kernels(tmp_path) == [
        "services/model/stray.py:4: import triton",
        "services/model/stray.py:7: @triton kernel _kernel",
    ]


def test_a_planted_import_from_the_model_is_reported(tmp_path):
    kernels = tmp_path / "services" / "kernels"
    kernels.mkdir(parents=True)
    (kernels / "leaky.py").write_text("import torch\nfrom services.kernels import fine\n"
                                      "from services.model import sampling\n")
    assert [str(f) for f in imports_outside(tmp_path, KERNELS, ["services.kernels"])] == [
        "services/kernels/leaky.py:3: import services.model"]
