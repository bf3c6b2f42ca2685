"""The registry and the state accounting, on hand-built parameter sets with hand-computed byte counts."""

import math

import pytest
import torch

from optbench import optimizers
from optbench.measure import optimizer_state_bytes

ALL = list(optimizers.REGISTRY.values())
# (shape) covering: a big matrix, a matrix under bnb's 4096-element threshold, a vector, a 3-D tensor,
# and a size that is not a multiple of the 256-element quantisation block.
SHAPES = [(96, 128), (30, 40), (96,), (4, 32, 48), (5000,)]


def _stepped(spec, shapes=SHAPES, steps: int = 2):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
    optimizer = spec.build(params, lr=1e-3)
    for _ in range(steps):
        sum((p * p).sum() for p in params).backward()
        optimizer.step()
        optimizer.zero_grad()
    return params, optimizer


def _params(shapes):
    return sum(math.prod(s) for s in shapes)


@pytest.mark.parametrize("spec", ALL, ids=lambda s: s.name)
def test_measured_state_matches_analytic_byte_for_byte(spec):
    if not spec.available:
        pytest.skip(f"{spec.name} is unavailable here: {spec.unavailable_reason()}")
    _, optimizer = _stepped(spec)
    measured, by_key = optimizer_state_bytes(optimizer)
    assert measured == spec.analytic_state_bytes(SHAPES)
    assert sum(by_key.values()) == measured


def test_adamw_holds_exactly_eight_bytes_per_param_of_moments():
    _, optimizer = _stepped(optimizers.resolve("adamw"))
    _, by_key = optimizer_state_bytes(optimizer)
    assert by_key["exp_avg"] + by_key["exp_avg_sq"] == 8 * _params(SHAPES)
    assert by_key["step"] == 4 * len(SHAPES)  # torch keeps one fp32 step tensor per parameter


def test_bnb_8bit_is_two_bytes_plus_absmax_per_block_and_fp32_below_threshold():
    pytest.importorskip("bitsandbytes")
    _, optimizer = _stepped(optimizers.resolve("adamw8bit"))
    _, by_key = optimizer_state_bytes(optimizer)
    big = [s for s in SHAPES if math.prod(s) >= 4096]
    small = [s for s in SHAPES if math.prod(s) < 4096]
    assert big and small
    assert by_key["state1"] + by_key["state2"] == 2 * _params(big) + 8 * _params(small)
    blocks = sum(-(-math.prod(s) // 256) for s in big)  # ceil: 5000 elements -> 20 blocks
    assert by_key["absmax1"] + by_key["absmax2"] == 2 * 4 * blocks
    assert by_key["qmap1"] + by_key["qmap2"] == 2 * 256 * 4  # shared by all parameters, counted once


def test_adafactor_stores_rows_plus_columns_not_rows_times_columns():
    _, optimizer = _stepped(optimizers.resolve("adafactor"))
    _, by_key = optimizer_state_bytes(optimizer)
    # (96,128): 96 + 128; (30,40): 30 + 40; (4,32,48): rows 4*32, cols 4*48 -> factored per leading dim
    assert by_key["exp_avg_sq_row"] == 4 * (96 + 30 + 4 * 32)
    assert by_key["exp_avg_sq_col"] == 4 * (128 + 40 + 4 * 48)
    assert by_key["exp_avg_sq"] == 4 * (96 + 5000)  # vectors keep a full second moment
    assert "exp_avg" not in by_key  # beta1=None: no momentum


@pytest.mark.parametrize("alias,name", [("adamw_torch", "adamw"), ("adamw_bnb_8bit", "adamw8bit"),
                                        ("adafactor", "adafactor"), ("ADAMW", "adamw")])
def test_hf_trainer_names_are_aliases(alias, name):
    assert optimizers.resolve(alias).name == name


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(optimizers.UnknownOptimizerError, match="adamw8bit") as info:
        optimizers.resolve("sgdx")
    assert "sgdx" in str(info.value)


def test_missing_library_makes_an_entry_unavailable_with_a_reason():
    spec = optimizers.OptimizerSpec(
        name="ghost", factory=lambda p, lr: None, library="no_such_library_xyz", default_lr=1e-3,
        precision="fp32", analytic_state_bytes=lambda shapes: 0)
    assert not spec.available
    assert "pip install no_such_library_xyz" in spec.unavailable_reason()


def test_each_entry_wants_its_own_learning_rate():
    assert optimizers.resolve("adafactor").default_lr > optimizers.resolve("adamw").default_lr


def test_nominal_bytes_per_param_comes_from_the_analytic_count():
    assert optimizers.resolve("adamw").nominal_bytes_per_param == pytest.approx(8.0, abs=1e-5)
    assert optimizers.resolve("adamw8bit").nominal_bytes_per_param == pytest.approx(2 + 8 / 256, abs=1e-2)
    assert optimizers.resolve("adafactor").nominal_bytes_per_param < 0.01
