"""platoon.integrations._core's warm-up check: the integrations warn a job of several workers
whose Adam takes its first step at its full lr (issue 47: without a warm-up the doubled lr the
docs advise did not pay, and AdamW needed 2-3x the steps). Real torch optimizers and
schedulers, stepped; the integrations' wiring is checked in their own tests."""

import logging

import pytest

torch = pytest.importorskip("torch")

from platoon.integrations._core import StepCounter, warn_without_warmup  # noqa: E402


def stepped(optimizer_class, schedule=None, **options):
    """A one-parameter optimizer after its first step (its scheduler not yet stepped, as
    in a training loop's post-step hook)."""
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = optimizer_class([weight], lr=1e-2, **options)
    if schedule is not None:
        torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    weight.sum().backward()
    optimizer.step()
    return optimizer


WARMUP = lambda step: min(1.0, step / 10)  # noqa: E731 - transformers' linear warm-up's start
DECAY = lambda step: 1.0 - step / 100  # noqa: E731 - a linear decay from the full lr


@pytest.mark.parametrize("optimizer_class,schedule,workers,warned", [
    (torch.optim.AdamW, None, 2, True),  # a constant lr
    (torch.optim.AdamW, DECAY, 2, True),  # decay only: the first step at the peak
    (torch.optim.Adam, DECAY, 4, True),
    (torch.optim.AdamW, WARMUP, 2, False),
    (torch.optim.AdamW, DECAY, 1, False),  # alone: the advice is about several workers
    (torch.optim.SGD, None, 2, False),  # measured with AdamW only
])
def test_adam_at_its_full_lr_from_the_first_step_is_warned(optimizer_class, schedule,
                                                           workers, warned, caplog):
    optimizer = stepped(optimizer_class, schedule)
    with caplog.at_level(logging.WARNING, logger="platoon.integrations._core"):
        assert warn_without_warmup(optimizer, workers) is warned
    assert ("no warm-up, in a job of %d workers" % workers in caplog.text) is warned
    if warned:
        assert "warmup_ratio=0.05" in caplog.text


def test_the_step_counter_checks_once_at_the_first_real_step(caplog):
    """Through `StepCounter` (what each integration counts with): one warning, after the
    first step, however many steps follow."""
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([weight], lr=1e-2)
    steps = []
    counter = StepCounter(optimizer, lambda: steps.append(1), workers=2)
    with caplog.at_level(logging.WARNING, logger="platoon.integrations._core"):
        for _ in range(3):
            weight.sum().backward()
            optimizer.step()
    counter.remove()
    assert len(steps) == 3
    assert caplog.text.count("no warm-up") == 1, caplog.text
