"""The loss roofline's per-call seconds (bench/loss_roofline.py) against hand-computed numbers."""

import pytest

from bench.loss_roofline import call_seconds
from bench.roofline import Roofline

# 1 GFLOP/s at every M, 10 decoder weights, 5 head weights, hidden 2, one layer: every figure below by hand.
FLAT = Roofline("float32", {1: 1e9, 1024: 1e9}, linear_weights=10, head_weights=5, hidden=2, layers=1)


def test_a_padded_call_costs_its_linear_head_and_attention_products():
    # 2 rows x 3 positions, the head over 1 kept position a row:
    # linear 2*6*10 = 120, head 2*2*1*5 = 20, attention 4*2*3*3*2*1 = 144 FLOPs -> 284 ns at 1 GFLOP/s.
    assert call_seconds(FLAT, rows=2, length=3, kept=1, grad=False) == pytest.approx(284e-9)


def test_a_call_under_autograd_costs_three_forwards():
    assert call_seconds(FLAT, rows=2, length=3, kept=1, grad=True) == pytest.approx(3 * 284e-9)


def test_non_pad_tokens_count_each_row_at_its_own_length():
    # Rows of 3 and 1 real tokens: linear 2*4*10 = 80, head 2*(1+1)*5 = 20, attention 4*(9+1)*2 = 80 -> 180 ns.
    assert call_seconds(FLAT, rows=2, length=3, kept=1, grad=False, real=[3, 1]) == pytest.approx(180e-9)


def test_the_throughput_is_read_at_the_calls_rows_times_length():
    # Twice as fast at M >= 6 as at M = 1: the 6-row-position linear product runs at 2 GFLOP/s (log-linear).
    fast = Roofline("float32", {1: 1e9, 6: 2e9}, linear_weights=10, head_weights=0, hidden=0, layers=0)
    assert call_seconds(fast, rows=2, length=3, kept=1, grad=False) == pytest.approx(120 / 2e9)
