"""The loss roofline's per-call seconds (bench/loss_roofline.py) against hand-computed numbers."""

import pytest

from bench.loss_roofline import backbone_seconds, head_seconds
from bench.roofline import Roofline

# 1 GFLOP/s at every M, 10 decoder weights, 5 head weights, hidden 2, one layer: every figure below by hand.
FLAT = Roofline("float32", {1: 1e9, 1024: 1e9}, linear_weights=10, head_weights=5, hidden=2, layers=1)


def test_a_padded_pass_costs_its_linear_and_attention_products():
    # 2 rows x 3 new tokens on a 1-token cache: linear 2*6*10 = 120, attention 4*2*3*(1+3)*2*1 = 192 -> 312 ns.
    assert backbone_seconds(FLAT, rows=2, new=3, past=1, grad=False) == pytest.approx(312e-9)


def test_a_pass_under_autograd_costs_three_forwards():
    assert backbone_seconds(FLAT, rows=2, new=3, past=1, grad=True) == pytest.approx(3 * 312e-9)
    assert head_seconds(FLAT, scored=4, grad=True) == pytest.approx(3 * 2 * 4 * 5 / 1e9)


def test_non_pad_tokens_count_each_row_at_its_own_length():
    # Rows of (3 new, 4 context) and (1 new, 2 context) real tokens: linear 2*4*10 = 80,
    # attention 4*(3*4 + 1*2)*2 = 112 -> 192 ns.
    assert backbone_seconds(FLAT, rows=2, new=3, past=1, grad=False, real=[(3, 4), (1, 2)]) == pytest.approx(192e-9)


def test_the_throughput_is_read_at_the_calls_rows_times_new_tokens():
    # Twice as fast at M >= 6 as at M = 1: the 6-position linear product runs at 2 GFLOP/s, a 1-position head at 1.
    fast = Roofline("float32", {1: 1e9, 6: 2e9}, linear_weights=10, head_weights=5, hidden=0, layers=0)
    assert backbone_seconds(fast, rows=2, new=3, past=0, grad=False) == pytest.approx(120 / 2e9)
    assert head_seconds(fast, scored=1, grad=False) == pytest.approx(10 / 1e9)
    assert head_seconds(fast, scored=6, grad=False) == pytest.approx(60 / 2e9)
