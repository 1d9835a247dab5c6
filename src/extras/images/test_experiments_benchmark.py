"""The images and text experiments' benchmark machinery (benchmarks/experiments.py): its busy load and its
ratio. No timing is asserted."""


def test_the_experiments_busy_load_spins_a_process_while_it_lasts_and_no_longer() -> None:
    import multiprocessing
    import time

    from benchmarks.experiments import load

    before = set(multiprocessing.active_children())  # worker processes an earlier test left, say
    with load("quiet"):
        assert set(multiprocessing.active_children()) == before
    with load("busy"):
        (spinner,) = set(multiprocessing.active_children()) - before
        time.sleep(0.2)
        assert spinner.is_alive()
    assert not spinner.is_alive()


def test_the_experiments_ratio_is_stock_over_shipped_per_round() -> None:
    from benchmarks.experiments import Cell, table

    cell = Cell({"shipped": [10.0, 20.0], "stock": [9.0, 22.0]})
    assert cell.ratios() == [0.9, 1.1]
    assert "| digits | busy | 15.00 | 15.50 | 1.00 (0.90-1.10) |" in table({("digits", "busy"): cell})
