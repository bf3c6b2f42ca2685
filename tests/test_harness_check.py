"""The harness-vs-bare check's statistics (benchmarks/test_harness_overhead.py) on made-up run times: it reads the
pairs until their interval resolves the tolerance, fails only on a difference it resolved, and otherwise says the
machine could not tell."""

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the check imports bench_support as the suite's rootdir conftest allows
_SPEC = importlib.util.spec_from_file_location("harness_check", BENCHMARKS / "test_harness_overhead.py")
check = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(check)
SIZE = __import__("bench_support").SIZES["default"]  # 6 to 20 pairs, ±3 %


def _runs(bare, harness):
    """Fake bare and harness runs returning the given medians in turn, logging the order they ran in."""
    order, bare_values, harness_values = [], iter(bare), iter(harness)

    def run_bare():
        order.append("b")
        return next(bare_values)

    def run_harness():
        order.append("h")
        return next(harness_values)

    return run_bare, run_harness, order


@pytest.mark.parametrize("low,high,verdict", [(0.98, 1.02, check.WITHIN), (0.90, 0.96, check.OUTSIDE),
                                              (1.04, 1.10, check.OUTSIDE), (0.95, 1.01, check.UNRESOLVED),
                                              (None, None, check.UNRESOLVED)])
def test_an_interval_inside_or_beyond_the_tolerance_resolves_it(low, high, verdict):
    assert check.resolution(low, high, 0.03) == verdict


def test_pairs_run_in_abba_order_and_stop_once_resolved():
    run_bare, run_harness, order = _runs([1.0, 1.01, 0.99] * 10, [1.0, 1.0, 1.0] * 10)
    bare, harness = check.interleaved_pairs(run_bare, run_harness, SIZE)
    assert len(bare) == len(harness) == SIZE.overhead_min_pairs  # agreeing pairs settle at the minimum
    assert "".join(order[:8]) == "bhhbbhhb"
    ratio, low, high = check.pair_interval([h / b for b, h in zip(bare, harness, strict=True)])
    assert check.resolution(low, high, 0.03) == check.WITHIN and low < ratio < high


def test_a_clear_difference_is_resolved_as_one():
    run_bare, run_harness, _ = _runs([1.0, 1.01, 0.99] * 10, [0.90, 0.91, 0.89] * 10)  # harness 10 % faster
    bare, harness = check.interleaved_pairs(run_bare, run_harness, SIZE)
    _, low, high = check.pair_interval([h / b for b, h in zip(bare, harness, strict=True)])
    assert check.resolution(low, high, 0.03) == check.OUTSIDE and len(bare) == SIZE.overhead_min_pairs


def test_pairs_too_noisy_to_tell_stop_at_the_cap_unresolved():
    run_bare, run_harness, _ = _runs([1.0] * 40, [0.90, 1.10, 1.05, 0.92] * 10)  # ±10 % from pair to pair
    bare, _ = check.interleaved_pairs(run_bare, run_harness, SIZE)
    assert len(bare) == SIZE.overhead_max_pairs
