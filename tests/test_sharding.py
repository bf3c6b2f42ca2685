"""The sharding check's pieces without a process group: how ranks split parameters, what counts as a change, and
what `explain --parallel` predicts on the tiny BERT (tests/test_parallel.py holds the prediction equal to what
real torchrun groups measure)."""

import re

import pytest

from optbench.cli import main as cli
from optbench.memory import sharding
from optbench.memory.statemap import SHARED, SHARED_ROW_NAME, StateRow
from optbench.optimizers import Param


def _row(name, numel, why="w", **bytes_by_dtype):
    return StateRow(name, (numel,), numel, SHARED if name == SHARED_ROW_NAME else "mlp", bytes_by_dtype, why)


def test_fsdp2_gives_each_rank_a_chunk_of_dim_0():
    assert sharding.fsdp2_rows(3, 2) == [2, 1]
    assert sharding.fsdp2_rows(30522, 2) == [15261, 15261]
    assert sharding.fsdp2_rows(1, 2) == [1, 0]
    assert sharding.fsdp2_rows(10, 4) == [3, 3, 3, 1]


def test_zero1_hands_out_whole_parameters_largest_first_to_the_least_loaded_rank():
    params = [Param.from_shape((n,)) for n in (3, 10, 5, 7)]
    assert sharding.zero1_owners(params, 2) == [0, 0, 1, 1]  # 10 -> 0, 7 -> 1, 5 -> 1, 3 -> 0


def test_a_dtype_change_is_a_precision_change_and_a_scalar_per_shard_or_a_replica_is_not_a_change():
    single = [_row("emb", 8192, uint8=16384, float32=256), _row("w", 4096, float32=8 * 4096 + 4)]
    ranks = [[_row("emb", 4096, float32=8 * 4096), _row("w", 2048, float32=8 * 2048 + 4)],
             [_row("emb", 4096, float32=8 * 4096), _row("w", 2048, float32=8 * 2048 + 4)]]
    (change,) = sharding.compare(single, ranks)
    assert (change.name, change.kind) == ("emb", "precision")
    assert change.single == "uint8+fp32, 2.03 B/elt" and change.sharded == "fp32, 8.00 B/elt"
    assert sharding.compare(single[1:], [single[1:], single[1:]]) == []  # DDP: every rank holds all of it


def test_bytes_change_needs_one_percent_and_one_kib_and_lost_state_is_a_precision_change():
    def case(codes):  # a torchao-like parameter: its per-tensor 1 KiB map, copied on each rank
        single = [_row("q", 65536, uint8=codes, float32=1024), _row("gone", 100, float32=800),
                  _row(SHARED_ROW_NAME, 0, float32=2048)]
        half = [_row("q", 32768, uint8=codes // 2, float32=1024), _row(SHARED_ROW_NAME, 0, float32=2048)]
        return {change.name: change for change in sharding.compare(single, [half, half])}

    changes = case(codes=65536)  # +1 KiB on 65.5 KB: 1.6 %; the shared maps: each rank keeps one process's own
    assert {name: change.kind for name, change in changes.items()} == {"q": "bytes", "gone": "precision"}
    assert changes["gone"].sharded == "no state on any rank"
    assert "q" not in case(codes=65536 * 2)  # +1 KiB on 132 KB: under 1 %


POOLER = "bert.pooler.dense.weight"
SQUARE = [f"bert.encoder.layer.{i}.{part}.weight" for i in (0, 1)
          for part in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense")]
TALL = [f"bert.encoder.layer.{i}.{part}.dense.weight" for i in (0, 1) for part in ("intermediate", "output")]


@pytest.mark.parametrize("optimizer,mode,changed", [
    ("adamw", "fsdp2", {}), ("adamw", "zero1", {}), ("adafactor", "zero1", {}),
    # The tiny BERT's 64 x 64 matrices: 4096 elements, 2048 per FSDP2 shard, under torchao's 4096: fp32 moments. Its
    # bigger quantised ones keep a 1 KiB quantisation map per moment on each rank. (MiniLM's 30522 x 384 embeddings:
    # 256 divides them, not their 15261 x 384 shards; the tiny BERT's it divides in neither.)
    ("adamw8bit_torchao", "fsdp2", {**dict.fromkeys([*SQUARE, POOLER], "precision"),
                                    **dict.fromkeys(["bert.embeddings.position_embeddings.weight", *TALL], "bytes")}),
    # ZeRO-1 builds from bare tensors: HF's fp32 override for embeddings is lost (position: 512 x 64 >= 4096)
    ("adamw8bit_hf", "zero1", {"bert.embeddings.word_embeddings.weight": "precision",
                               "bert.embeddings.position_embeddings.weight": "precision"}),
    ("adamw8bit", "zero1", {}), ("adamw8bit", "ddp", {}),  # every rank: its own maps, as one process
])
def test_the_prediction_names_what_sharding_changes(optimizer, mode, changed):
    single, ranks, changes = sharding.predict(optimizer, mode, 2, workload="tiny")
    assert {change.name: change.kind for change in changes} == changed
    assert len(ranks) == 2
    if mode == "fsdp2":  # every parameter is on both ranks, dim 0 split in two
        def held(rank):
            return sum(sharding.fsdp2_rows(row.shape[0], 2)[rank] * row.numel // row.shape[0] for row in single
                       if row.module_kind != SHARED)

        assert [sum(r.numel for r in rows if r.module_kind != SHARED) for rows in ranks] == [held(0), held(1)]


@pytest.mark.parametrize("optimizer,reason", [("adamw8bit", "take no DTensor"), ("muon", "is not known")])
def test_where_fsdp2_cannot_be_predicted_explain_says_why(optimizer, reason, capsys):
    assert cli.main(["explain", optimizer, "--workload", "tiny", "--parallel", "fsdp2", "--nproc", "2"]) == 0
    out = capsys.readouterr().out
    assert "cannot be predicted" in out and reason in out


def test_explain_parallel_prints_the_ranks_and_the_changed_parameter_within_120_columns(capsys):
    assert cli.main(["explain", "adamw8bit_torchao", "--workload", "tiny", "--parallel", "fsdp2"]) == 0
    out = capsys.readouterr().out
    tail = out[out.index("under fsdp2 x2"):]
    assert "rank 0:" in tail and "rank 1:" in tail
    assert "layer.*.attention.self.query.weight x2 (precision): uint8+fp32, 2.53 B/elt -> fp32, 8.00 B/elt" in tail
    assert "why: 8-bit -> fp32: under 4096 elements" in tail
    assert max(len(line) for line in out.splitlines()) <= 120


def test_ranks_that_hold_alike_share_one_line(capsys):
    """ZeRO-1 over more ranks than parameters: the ranks past them hold nothing, and say so once, not once each."""
    assert cli.main(["explain", "adamw", "--workload", "tiny", "--parallel", "zero1", "--nproc", "100000"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("rank ", "ranks "))]
    assert len(lines) < 100 and lines[0].startswith("rank 0: ")
    assert re.fullmatch(r"ranks \d+-99999 \([\d,]+\), each: 0\.00 MiB of state for 0 parameter\(s\) \(0 elements\)",
                        lines[-1]), lines[-1]


@pytest.mark.parametrize("nproc", ["2", "4"])  # 2 was its default, so `--nproc 2` alone was taken silently
def test_explain_nproc_without_parallel_is_a_usage_error(capsys, nproc):
    assert cli.main(["explain", "adamw", "--workload", "tiny", "--nproc", nproc]) == 2
    assert "--nproc needs a --parallel mode" in capsys.readouterr().err
