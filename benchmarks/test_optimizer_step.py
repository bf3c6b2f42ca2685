"""`optimizer.step()` alone, on the workload's real gradients: the cost the optimizer itself adds."""

from __future__ import annotations

from bench_support import extra_info, first_batch, fresh_model, measured_record, trial_spec

from optbench.probes import measure, slowdown


def test_optimizer_step(benchmark, optimizer_spec, workload, bench_size, device):
    spec = trial_spec(bench_size, optimizer_spec.name, device)
    model = fresh_model(workload, device)
    model(**first_batch(workload, bench_size.batch_size, device)).loss.backward()  # real gradients, kept
    optimizer = optimizer_spec.build_for(model)
    slowdown.slow_down_if_asked(optimizer)  # the regression gate's test knob; a no-op otherwise
    memory = measure.MemoryWindow(device)

    def step() -> None:
        optimizer.step()
        measure.synchronize(device)

    benchmark.group = f"optimizer.step: {workload.model_name} on {device}"
    # The warm-up rounds absorb the first step(), which allocates the state (and compiles, for torchao).
    benchmark.pedantic(step, rounds=bench_size.step_rounds, warmup_rounds=bench_size.warmup_rounds, iterations=1)
    record = measured_record(spec, optimizer_spec, workload, model, optimizer, device, memory)
    benchmark.extra_info.update(extra_info("optimizer_step", record))
    # what the timing means: the optimizer really holds its state, exactly the analytic count of it (0 for SGD)
    assert record.state_bytes == record.analytic_state_bytes, record.state_bytes_by_key
    assert len(benchmark.stats.stats.data) == bench_size.step_rounds
