"""Per-epoch work kept to its share of the run's time (src/extras/pacing.py)."""

from types import SimpleNamespace
from typing import Any

import pytest

from src.errors import UserInputError
from src.extras import pacing
from src.extras.pacing import Pace

ONE_PROCESS: Any = SimpleNamespace(world_size=1)


class Clock:
    """A perf_counter that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_work_is_due_again_once_its_last_cost_is_within_its_share(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(pacing.time, "perf_counter", clock)
    pace = Pace(0.1, "work")
    assert pace.due(ONE_PROCESS)  # the first run
    with pace.running():
        clock.now += 2.0  # the work takes 2 s: the next run waits for 20 s of the run since it ended
    clock.now += 19.9
    assert not pace.due(ONE_PROCESS)
    clock.now += 0.1
    assert pace.due(ONE_PROCESS)
    pace.reset()  # a new fit: due at once
    clock.now += 0.0
    assert pace.due(ONE_PROCESS)


def test_no_share_is_always_due_and_a_bad_share_is_one_sentence(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(pacing.time, "perf_counter", clock)
    pace = Pace(None, "work")
    with pace.running():
        clock.now += 50.0
    assert pace.due(ONE_PROCESS)
    for share in (0, -0.1, 1.5):
        with pytest.raises(UserInputError, match=rf"^work max_share={share} must lie in \(0, 1\]"):
            Pace(share, "work")
