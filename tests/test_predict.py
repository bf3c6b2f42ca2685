"""The peak-memory predictor: step temporaries per optimizer family, the analytic activation count, the two
phases on CPU and CUDA (analytic cases: no GPU needed), what an uncalibrated model borrows, and the trial's hook.
(Calibrating it and its held-out band: tests/test_calibrate.py.)"""

import dataclasses

import pytest

from optbench.job.spec import TrialSpec
from optbench.memory import predict
from optbench.memory.calibration import Calibration, CalibrationSet
from optbench.optimizers import Param, resolve
from optbench.records.record import MIB

EMBEDDING = Param(shape=(30522, 384), embedding=True)  # 11,720,448 elements: the largest tensor
MATRIX = Param(shape=(1536, 384))
BIAS = Param(shape=(384,))
PARAMS = (EMBEDDING, MATRIX, BIAS)
BERT = predict.Architecture(layers=6, hidden_size=384, intermediate_size=1536, heads=12, vocab_size=30522,
                            causal_lm=False, gated_mlp=False, hidden_dropout=True, attention_dropout=True,
                            eager_attention=False)
LLAMA = predict.Architecture(layers=4, hidden_size=256, intermediate_size=688, heads=4, vocab_size=30522,
                             causal_lm=True, gated_mlp=True, hidden_dropout=False, attention_dropout=False,
                             eager_attention=False)
FACTS = predict.ModelFacts(name="made-up-bert", params=PARAMS, arch=BERT)
WEIGHTS = 4 * sum(p.numel for p in PARAMS)


def temporaries(name, device="cpu", params=PARAMS, **kwargs):
    entry = resolve(name)
    return predict.step_temporaries(entry, params, entry.settings(kwargs), device)


@pytest.mark.parametrize("name,device,expected", [
    ("adamw", "cpu", 2 * 4 * EMBEDDING.numel),  # per-tensor loop: sqrt(v) and its quotient, largest tensor
    ("adamw", "cuda", WEIGHTS),  # foreach: one param-sized result list
    ("adamw_fused", "cpu", 0), ("adamw_fused", "cuda", 0), ("sgd_momentum", "cpu", 0),
    ("adafactor", "cpu", 2 * 4 * EMBEDDING.numel), ("adafactor", "cuda", 2 * 4 * EMBEDDING.numel),
    ("adamw8bit", "cpu", 5 * 4 * EMBEDDING.numel),  # both moments dequantised + gradient copy + sqrt + quotient
    ("adamw8bit", "cuda", 0),  # fused kernels
    ("adamw8bit_hf", "cpu", 3 * 4 * EMBEDDING.numel),  # HF keeps the embedding on 32-bit state: 32-bit path
])
def test_step_temporaries_per_family(name, device, expected):
    assert temporaries(name, device)[0] == expected


def test_torch_kwargs_override_the_family_default_and_bf16_halves_torch_temporaries():
    assert temporaries("adamw", "cuda", fused=True)[0] == 0
    assert temporaries("adamw", "cuda", foreach=False)[0] == 2 * 4 * EMBEDDING.numel
    assert temporaries("adamw", "cpu", foreach=True)[0] == WEIGHTS
    bf16 = FACTS.in_precision("bf16")
    assert temporaries("adamw", "cpu", params=bf16)[0] == 2 * 2 * EMBEDDING.numel  # torch computes in bf16
    assert temporaries("adafactor", "cpu", params=bf16)[0] == 2 * 4 * EMBEDDING.numel  # HF upcasts to fp32


def test_small_tensors_take_bitsandbytes_32bit_path_and_unknown_families_are_flagged_generic():
    small = (Param(shape=(64, 32)),)  # 2,048 elements: under bitsandbytes' 4,096, fp32 state
    assert temporaries("adamw8bit", "cpu", params=small)[0] == 3 * 4 * 2048
    size, rule = temporaries("adamw4bit_torchao", "cpu")
    assert rule.startswith("generic") and size == 2 * 4 * EMBEDDING.numel


def test_analytic_activations_follow_the_layer_count():
    # BERT, fp32: e(8h + 2i) + 2h dropout masks; the s² part (softmax, mask, dropped) only where CPU keeps it
    assert predict.analytic_activation_coefficients(BERT, "fp32", "cpu") == (4 * (8 * 384 + 2 * 1536) + 2 * 384, 9.0)
    assert predict.analytic_activation_coefficients(BERT, "fp32", "cuda")[1] == 0.0  # SDPA kernels keep none
    assert predict.analytic_activation_coefficients(BERT, "bf16-autocast", "cpu") == (
        2 * (8 * 384 + 2 * 1536) + 2 * 384, 5.0)
    # Llama: gated MLP (four i-wide tensors), no dropout; logits + fp32 copy + log-softmax spread over layers
    per_token, per_s2 = predict.analytic_activation_coefficients(LLAMA, "fp32", "cpu")
    assert per_token == 4 * (8 * 256 + 4 * 688) + 12 * 30522 / 4 and per_s2 == 0.0
    assert predict.activation_units(BERT, 8, 32) == (8 * 32 * 6, 8 * 12 * 32 * 32 * 6)


@pytest.fixture
def no_calibrations(monkeypatch):
    monkeypatch.setattr(predict, "load_calibrations", lambda kind: CalibrationSet(kind))


def test_cuda_step_phase_is_weights_grads_state_and_foreach_temporaries(no_calibrations):
    found = predict.predict_peak(FACTS, resolve("adamw"), batch_size=1, seq_len=8, device_kind="cuda")
    state = resolve("adamw").count(list(PARAMS)).state_bytes
    assert found.phase == "optimizer step" and not found.calibrated and found.target == "peak_cuda_allocated_bytes"
    assert found.state_bytes == state == 2 * WEIGHTS + 3 * 4  # two moments + a 0-d fp32 step per tensor
    assert found.activation_bytes == 0  # the caching allocator's `allocated` holds no freed activation
    assert found.total_bytes == WEIGHTS + WEIGHTS + state + WEIGHTS  # weights, grads, state, foreach sqrt(v)


def test_cuda_forward_backward_phase_when_activations_outgrow_grads_and_temporaries(no_calibrations):
    found = predict.predict_peak(FACTS, resolve("adamw8bit"), batch_size=64, seq_len=512, device_kind="cuda")
    per_token, _ = predict.analytic_activation_coefficients(BERT, "fp32", "cuda")
    activations = per_token * 64 * 512 * 6  # no s² part on CUDA
    assert found.phase == "forward/backward" and found.grads_bytes == 0 and found.temporaries_bytes == 0
    assert found.total_bytes == WEIGHTS + resolve("adamw8bit").count(list(PARAMS)).state_bytes + round(activations)


CAL = Calibration(device_kind="cpu", model="made-up-bert", precision="fp32", bytes_per_token_layer=40_000,
                  bytes_per_s2_layer=12.0, retained_fraction=0.5, overhead_bytes=50 * MIB, trial_ids=("a", "b"))


def test_cpu_calibrated_phases_and_parts_add_up():
    entry = resolve("adamw")
    small = predict.predict_peak(FACTS, entry, batch_size=4, seq_len=32, calibration=CAL)
    activations = 40_000 * 4 * 32 * 6 + 12.0 * 4 * 12 * 32 * 32 * 6
    assert small.phase == "optimizer step" and small.calibrated and "2 cpu trials" in small.basis
    assert small.activation_bytes == round(0.5 * activations)
    assert small.total_bytes == sum(small.parts().values()) == (
        WEIGHTS + WEIGHTS + entry.count(list(PARAMS)).state_bytes + 2 * 4 * EMBEDDING.numel
        + round(0.5 * activations) + 50 * MIB)
    large = predict.predict_peak(FACTS, entry, batch_size=64, seq_len=256, calibration=CAL)
    assert large.phase == "forward/backward" and large.grads_bytes == 0
    assert large.activation_bytes == round(40_000 * 64 * 256 * 6 + 12.0 * 64 * 12 * 256 * 256 * 6)


def test_another_precision_rescales_calibrated_activations_and_adds_autocast_weight_copies():
    entry = resolve("adafactor")
    fp32 = predict.predict_peak(FACTS, entry, batch_size=64, seq_len=256, calibration=CAL)
    autocast = predict.predict_peak(FACTS, entry, batch_size=64, seq_len=256, precision="bf16-autocast",
                                    calibration=CAL)
    ratio_token = (2 * (8 * 384 + 2 * 1536) + 2 * 384) / (4 * (8 * 384 + 2 * 1536) + 2 * 384)
    expected = 40_000 * ratio_token * 64 * 256 * 6 + 12.0 * 5 / 9 * 64 * 12 * 256 * 256 * 6 + 2 * MATRIX.numel
    assert autocast.activation_bytes == round(expected) and "rescaled to bf16-autocast" in autocast.basis
    assert autocast.activation_bytes < fp32.activation_bytes


def test_a_model_without_a_transformer_config_is_refused():
    with pytest.raises(predict.PredictError, match="no transformer config"):
        predict.predict_peak(dataclasses.replace(FACTS, arch=None), resolve("adamw"), batch_size=1, seq_len=8)


# -- real (meta-device) models ----------------------------------------------------------------------------
TINY = TrialSpec(optimizer="adamw", workload="tiny", device="cpu", batch_size=8, seq_len=32)


def test_meta_device_facts_of_the_tiny_and_lm_workloads():
    tiny = predict.facts_for_spec(TINY)
    assert tiny.name == "tiny-bert-h64" and tiny.arch.layers == 2 and tiny.arch.hidden_size == 64
    assert tiny.arch.attention_dropout and not tiny.arch.causal_lm and not tiny.arch.gated_mlp
    assert any(p.embedding for p in tiny.params) and all(p.itemsize == 4 for p in tiny.params)
    lm = predict.facts_for_spec(dataclasses.replace(TINY, workload="lm"))
    assert lm.name == "llama-h512-l4" and lm.arch.causal_lm and lm.arch.gated_mlp and lm.arch.layers == 4
    assert sum(p.numel for p in lm.params) == 13_701_632


def test_for_trial_predicts_what_predict_peak_says_and_skips_jobs_it_does_not_model():
    from accelerate import init_empty_weights
    from transformers import BertForSequenceClassification

    from optbench.workloads import tiny_bert_config

    with init_empty_weights():
        model = BertForSequenceClassification(tiny_bert_config(64, 3))
    expected = predict.predict_peak(predict.ModelFacts.from_model(model, "tiny-bert-h64"), resolve("adamw"),
                                    batch_size=8, seq_len=32).total_bytes
    assert predict.for_trial(TINY, model, resolve("adamw")) == expected
    for other in ({"parallel": "ddp"}, {"fidelity": True}, {"resume_check": True}):
        assert predict.for_trial(dataclasses.replace(TINY, **other), model, resolve("adamw")) is None


def test_an_uncalibrated_model_borrows_the_other_models_scales():
    other = dataclasses.replace(CAL, model="other", token_scale=2.0, s2_scale=3.0, retained_fraction=0.7,
                                overhead_bytes=30 * MIB)
    own = dataclasses.replace(CAL, token_scale=9.0, s2_scale=9.0)
    found = CalibrationSet("cpu", {"other": other, "made-up-bert": own})
    assert found.borrowed("made-up-bert") == (2.0, 3.0, 0.7, 30 * MIB)  # never its own figures
    assert CalibrationSet("cuda").borrowed() == (1.0, 1.0, 0.0, 0)  # nothing calibrated: the analytic defaults
    bare = predict.predict_peak(FACTS, resolve("adamw"), batch_size=8, seq_len=64, calibration=None,
                                borrow_from=found)
    per_token, per_s2 = predict.analytic_activation_coefficients(BERT, "fp32", "cpu")
    activations = 2.0 * per_token * 8 * 64 * 6 + 3.0 * per_s2 * 8 * 12 * 64 * 64 * 6
    assert not bare.calibrated and bare.basis.startswith("uncalibrated")
    assert bare.activation_bytes == round(0.7 * activations) and bare.overhead_bytes == 30 * MIB
