"""`unset_weights`: modules built inside it skip `torch.nn.init` (their tensors allocated, nothing drawn), every other
call runs as usual, and outside it initialisation is back."""

import threading

import torch

from services.model.unset_weights import unset_weights


def test_inside_the_draws_are_skipped_and_other_calls_still_run():
    with unset_weights():
        weight = torch.zeros(64, 64)
        torch.nn.init.normal_(weight)
        torch.nn.init.kaiming_uniform_(weight, a=5 ** 0.5)
        other = torch.ones(3).add(1)
    assert torch.count_nonzero(weight) == 0, "an init call drew values inside unset_weights"
    assert other.tolist() == [2.0, 2.0, 2.0]


def test_after_it_and_on_another_thread_initialisation_runs():
    drawn: list[torch.Tensor] = []

    def elsewhere() -> None:
        drawn.append(torch.nn.init.normal_(torch.zeros(16)))

    with unset_weights():
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
    assert torch.count_nonzero(drawn[0]) > 0, "the mode leaked into another thread"
    assert torch.count_nonzero(torch.nn.init.normal_(torch.zeros(16))) > 0

