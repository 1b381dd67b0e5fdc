"""The fused sampler (temperature, top-k by bisection, keyed Gumbel draw and greedy rows in one launch from the raw
logits) draws what the torch form of `sampling.sample` draws, row for row: under Triton's interpreter on the CPU,
compiled on CUDA.

The torch form is taken with its stable sort (`max_top_k=None`, a bound `RowSampling` allows for any rows), which
keeps equal values in vocab order: the fused kernel's tie rule. The form `RowSampling.build` picks for these rows
uses torch.topk, whose choice among values tied at the k-th place is unspecified (on the CPU it differs from the
sort's on bfloat16 logits), so that form is compared only on logits without ties (spread float32).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from unittest import mock

import pytest
import torch

from services.model import sampling
from services.model.kernel_verdicts import KernelVerdicts
from tests.support.triton_interpreter import interpreted

VOCABS = (2048, 3072, 1000)
TEMPERATURES = (0.9, 0.0, 0.3, 1.5)
KINDS = ("spread", "coarse", "rounding", "masked", "nan")
CODEBOOKS = (0, 7)
GRAPH_TOP_K_CAP = 128
"""`predictor_graphs.TOP_K_CAP` (not imported: the engine is a layer above the model)."""
MUTANTS = ("greedy for every row", "top_k ignored", "temperature 0 sampled", "ties to the highest ids",
           "division by the reciprocal", "lanes past the row as candidates", "another codebook's noise",
           "NaN as -inf", "-0.0 below +0.0")


def _params(vocab: int) -> list[sampling.SamplingParams]:
    """24 rows: every top_k (1, 5, 50, 0 = no cut, the vocabulary, past even int32) with every temperature."""
    return [sampling.SamplingParams(temperature=t, top_k=k)
            for k in (1, 5, 50, 0, vocab, 2**32 + 5) for t in TEMPERATURES]


def _coarse_scale(params: list[sampling.SamplingParams]) -> torch.Tensor:
    """Per row: the top_k 50 rows mostly -0.0 and +0.0 (the cut falls among them), a few greedy rows all of them (the
    argmax is among them), the others spread over many half-integers."""
    return torch.tensor([0.2 if p.top_k == 50 else 0.05 if p.is_greedy and p.top_k < 50 else 3.0 for p in params])


def _rounding_logits(params: list[sampling.SamplingParams], below: torch.Tensor,
                     generator: torch.Generator) -> torch.Tensor:
    """`below` under 64 consecutive float32 values, rising with the vocab id, where dividing by the row's temperature
    maps neighbours onto one float (the quotient's spacing is wider than theirs): which of them tie, so which is the
    argmax or the k-th (the lowest id of a tie), is decided by the division's last bit."""
    num_rows, vocab = below.shape
    start = torch.tensor([{0.3: 1.2, 0.9: 1.8}.get(p.temperature, 1.5) for p in params])[:, None]
    start = (start + 0.15 * torch.rand(num_rows, 1, generator=generator)).view(torch.int32)
    cluster = (start + torch.arange(64, dtype=torch.int32)).view(torch.float32)
    places = torch.rand(num_rows, vocab, generator=generator).argsort(dim=1)[:, :64].sort(dim=1).values
    return below.scatter(1, places, cluster)


def _logits(kind: str, params: list[sampling.SamplingParams], vocab: int, generator: torch.Generator) -> torch.Tensor:
    """float32 [rows, vocab] of one kind: spread (no ties), coarse (half-integers: many exact ties, see
    `_coarse_scale`), rounding (see `_rounding_logits`), masked (the talker's -inf control ids; some rows with 3
    finite values, fewer than most top_k; one row all -inf), nan (two NaNs in every third row)."""
    num_rows = len(params)
    spread = 3 * torch.randn(num_rows, vocab, generator=generator)
    rows = torch.arange(num_rows)
    if kind == "coarse":
        return (_coarse_scale(params)[:, None] * torch.randn(num_rows, vocab, generator=generator)).round() / 2
    if kind == "rounding":
        return _rounding_logits(params, spread - 10, generator)
    if kind == "nan":
        places = torch.randint(vocab, (num_rows, 2), generator=generator)
        return spread.scatter(1, places, float("nan")).where(rows[:, None] % 3 == 2, spread)
    if kind == "masked":
        masked = spread.clone()
        masked[:, 2 * vocab // 3:] = float("-inf")
        masked[:, -1] = spread[:, -1]  # the one control id left (EOS)
        few = torch.full_like(spread, float("-inf"))
        few.scatter_(1, torch.randint(vocab, (num_rows, 3), generator=generator),
                     -40 + torch.randn(num_rows, 3, generator=generator))
        masked = few.where(rows[:, None] % 3 == 1, masked)
        masked[-1] = float("-inf")
        return masked
    return spread


def torch_form(logits: torch.Tensor, rows: sampling.RowSampling, codebook: int) -> torch.Tensor:
    """`sampling.sample` off CUDA, with the stable sort of the whole vocabulary (ties kept in vocab order)."""
    return sampling.sample(logits.cpu(), dataclasses.replace(rows, max_top_k=None), codebook)


def _keyed_draw(values: torch.Tensor, ids: torch.Tensor, logits: torch.Tensor, rows: sampling.RowSampling,
                codebook: int) -> torch.Tensor:
    """The torch form's steps after its sort, over every token in a given rank order: top-k cut, keyed noise,
    argmax, greedy rows."""
    top_k = torch.where(rows.top_k > 0, rows.top_k, ids.shape[1])[:, None]
    values = values.masked_fill(torch.arange(ids.shape[1])[None, :] >= top_k, float("-inf"))
    scores = values.double() - torch.log(-torch.log(sampling._uniform(rows.keys, codebook, ids)))
    drawn = ids.gather(1, scores.argmax(dim=1, keepdim=True))[:, 0]
    return torch.where(rows.temperature > 0, drawn, logits.argmax(dim=1))


def _temperature(rows: sampling.RowSampling) -> torch.Tensor:
    return torch.where(rows.temperature > 0, rows.temperature, 1.0)[:, None]


def _ties_to_highest_ids(logits: torch.Tensor, rows: sampling.RowSampling, codebook: int) -> torch.Tensor:
    """The torch form with the opposite tie rule: a sort that keeps equal values in reverse vocab order."""
    values, flipped = (logits.float() / _temperature(rows)).flip(1).sort(dim=1, descending=True, stable=True)
    return _keyed_draw(values, logits.shape[1] - 1 - flipped, logits, rows, codebook)


def _divided_by_reciprocal(logits: torch.Tensor, rows: sampling.RowSampling, codebook: int) -> torch.Tensor:
    """The torch form with the temperature applied as a multiplication by its reciprocal (not IEEE division)."""
    values, ids = (logits.float() * (1.0 / _temperature(rows))).sort(dim=1, descending=True, stable=True)
    return _keyed_draw(values, ids, logits, rows, codebook)


def _mutants(logits: torch.Tensor, rows: sampling.RowSampling, codebook: int) -> dict[str, torch.Tensor]:
    """What a kernel with each mistake would draw: the comparison must tell every one of them apart."""
    vocab = logits.shape[1]
    padded = torch.nn.functional.pad(logits, (0, (1 << (vocab - 1).bit_length()) - vocab))
    return {
        "greedy for every row": logits.argmax(dim=1),
        "top_k ignored": torch_form(logits, dataclasses.replace(rows, top_k=torch.zeros_like(rows.top_k)), codebook),
        "temperature 0 sampled": torch_form(
            logits, dataclasses.replace(rows, temperature=torch.where(rows.temperature > 0, rows.temperature, 1.0)),
            codebook),
        "ties to the highest ids": _ties_to_highest_ids(logits, rows, codebook),
        "division by the reciprocal": _divided_by_reciprocal(logits, rows, codebook),
        "lanes past the row as candidates": torch_form(padded, rows, codebook),
        "another codebook's noise": torch_form(logits, rows, codebook + 1),
        "NaN as -inf": torch_form(logits.nan_to_num(nan=float("-inf")), rows, codebook),
        "-0.0 below +0.0": torch_form(logits.where((logits != 0) | ~logits.signbit(), -1e-40), rows, codebook),
    }


def _straddling_ties(logits: torch.Tensor, rows: sampling.RowSampling) -> int:
    """Sampled rows whose k-th largest value is tied across the cut: the tie rule decides their candidates."""
    scaled = logits.float() / _temperature(rows)
    count = 0
    for values, top_k, temperature in zip(scaled, rows.top_k.tolist(), rows.temperature.tolist()):
        if temperature > 0 and 0 < top_k < len(values) and not values.isnan().any():
            kth = values.topk(top_k).values[-1]
            count += int((values > kth).sum() < top_k < (values >= kth).sum())
    return count


def _as_graph_columns(rows: sampling.RowSampling) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """temperature, top_k and keys as the frame-sampling graphs pass them: columns of wider static buffers."""
    ints = torch.stack((rows.top_k + 3, rows.top_k, rows.seed, rows.keys[:, 0], rows.keys[:, 1]), dim=1)
    floats = torch.stack((rows.temperature + 2, rows.temperature, rows.top_p), dim=1)
    return floats[:, 1], ints[:, 1], ints[:, 3:]


def _graphs_form_agreement(logits: torch.Tensor, rows: sampling.RowSampling, codebook: int,
                           expected: torch.Tensor) -> tuple[int, int]:
    """(rows checked, rows agreeing with `expected`) of `sample` on CUDA with the summaries the frame-sampling graphs
    give rows whose top_k are all within their cap: top-p applied (a no-op at 1), so torch.topk of the cap, then the
    fused draw (`fused_draw`)."""
    within = (rows.top_k >= 1) & (rows.top_k <= GRAPH_TOP_K_CAP)
    graphed = dataclasses.replace(rows.select(within), max_top_k=GRAPH_TOP_K_CAP, uses_top_p=True)
    drawn = sampling.sample(logits[within], graphed, codebook).cpu()
    return int(within.sum()), int((drawn == expected[within.cpu()]).sum())


def _cases() -> list[tuple[int, torch.dtype, str, int]]:
    """(vocab, dtype, kind, codebook): every kind of logits in both dtypes for every vocabulary; the codebook
    alternates so that each kind and each dtype meets both."""
    return [(vocab, dtype, kind, CODEBOOKS[(v + d) % 2])
            for v, vocab in enumerate(VOCABS) for d, dtype in enumerate((torch.float32, torch.bfloat16))
            for kind in KINDS]


def _routed(kind: str, every_case: bool) -> bool:
    """Whether a case is drawn through `sampling.sample` too: on CUDA every case; under the interpreter, where each
    launch costs seconds, one case of each vocabulary and dtype (the first kind), whose codebooks alternate: the
    routing (the branch to the kernel, the rows' columns and keys, the codebook's salts) does not depend on the
    logits' values, which the direct comparison covers kind by kind."""
    return every_case or kind == KINDS[0]


@torch.no_grad()
def compare(device: str, every_case_through_sample: bool = True) -> dict[str, object]:
    """Counts over every case: draws, agreements with the torch form (direct, and through `sample` for the cases
    `_routed` picks), rows decided by ties, and how many draws each mutant gets wrong."""
    from services.kernels import fused_sample

    generator = torch.Generator().manual_seed(19)
    totals: Counter = Counter()
    mutant_misses: Counter = Counter({name: 0 for name in MUTANTS})
    for case, (vocab, dtype, kind, codebook) in enumerate(_cases()):
        params = _params(vocab)
        seeds = torch.randint(-2**62, 2**62, (len(params),), generator=generator).tolist()
        frames = [3 * case + codebook] * len(params)
        rows, device_rows = (sampling.RowSampling.build(params, seeds, frames, where) for where in ("cpu", device))
        logits = _logits(kind, params, vocab, generator).to(dtype)
        expected = torch_form(logits, rows, codebook)
        got = fused_sample.sample(logits.to(device), *_as_graph_columns(device_rows),
                                  sampling._codebook_salts(codebook)).cpu()
        totals["drawn"] += len(params)
        totals["agreed"] += int((got == expected).sum())
        totals["straddling ties"] += _straddling_ties(logits, rows)
        if _routed(kind, every_case_through_sample):
            with mock.patch.object(sampling, "compiles_for", lambda _: True):  # `sample` as it runs on CUDA
                through_sample = sampling.sample(logits.to(device), device_rows, codebook,
                                                 kernels=KernelVerdicts(whole_row_sampler=True)).cpu()
            totals["sample drawn"] += len(params)
            totals["sample agreed"] += int((through_sample == expected).sum())
        if device != "cpu":
            checked, agreed = _graphs_form_agreement(logits.to(device), device_rows, codebook, expected)
            totals["graphs form checked"] += checked
            totals["graphs form agreed"] += agreed
        if kind == "spread" and dtype == torch.float32:
            totals["topk form checked"] += len(params)
            totals["topk form agreed"] += int((sampling.sample(logits, rows, codebook) == expected).sum())
        for name, tokens in _mutants(logits, rows, codebook).items():
            mutant_misses[name] += int((tokens != expected).sum())
    return {**totals, "mutants": dict(mutant_misses)}


def _check(result: dict, every_case_through_sample: bool = True) -> None:
    assert result["drawn"] == len(_cases()) * 24, result
    routed = sum(_routed(kind, every_case_through_sample) for _, _, kind, _ in _cases())
    assert result["sample drawn"] == routed * 24, result
    assert result["agreed"] == result["drawn"] and result["sample agreed"] == result["sample drawn"], result
    assert result["topk form agreed"] == result["topk form checked"] > 0, result
    assert result["straddling ties"] > 10, result
    caught = {name: misses for name, misses in result["mutants"].items() if misses > 0}
    assert caught == result["mutants"], f"the comparison would not catch these mistakes: {result['mutants']}"


def test_the_fused_sampler_draws_what_the_torch_form_draws_under_the_interpreter():
    _check(interpreted("tests.kernels.test_fused_sample.compare('cpu', every_case_through_sample=False)"),
           every_case_through_sample=False)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device")
def test_the_fused_sampler_draws_what_the_torch_form_draws_on_cuda():
    _check(compare("cuda"))
    # Not asserted: the top-p path's torch.topk (`graphs form`) on CUDA keeps other tied values at the k-th place
    # than the CPU's stable sort (332 of 360 draws agreed on an H200, 2026-12-02), a property of that path, not of
    # this kernel; loadtest/RESULTS-GPU.md has it under "noticed".


def startup_check(device: str) -> dict[str, bool]:
    """The start-up check as the loader runs it: the kernel passes; a kernel that ignores top_k is refused; the
    verdicts, as the model keeps them, send the draws to the kernel or back to the torch form."""
    from services.kernels import fused_sample
    from services.model import sampling_check

    passes = sampling_check.check(torch.device(device), (3072, 2048))
    serves_after_pass = KernelVerdicts(whole_row_sampler=passes).samples_whole_rows(2048)
    real = fused_sample.sample

    def ignores_top_k(logits, temperature, top_k, keys, salts):
        return real(logits, temperature, torch.zeros_like(top_k), keys, salts)

    fused_sample.sample = ignores_top_k
    try:
        refuses = not sampling_check.check(torch.device(device), (2048,))
    finally:
        fused_sample.sample = real
    return {"passes": passes, "serves_after_pass": serves_after_pass, "refuses_a_broken_kernel": refuses,
            "serves_after_refusal": KernelVerdicts(whole_row_sampler=not refuses).samples_whole_rows(2048)}


def test_the_start_up_check_passes_the_kernel_and_refuses_a_broken_one_under_the_interpreter():
    assert interpreted("tests.kernels.test_fused_sample.startup_check('cpu')") == {
        "passes": True, "serves_after_pass": True, "refuses_a_broken_kernel": True, "serves_after_refusal": False}
