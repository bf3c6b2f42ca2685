"""One whole train step (forward, backward, step, zero_grad): what the optimizer costs in context."""

from __future__ import annotations

from bench_support import extra_info, first_batch, fresh_model, measured_record, train_step, trial_spec

from optbench.probes import measure, slowdown


def test_train_step(benchmark, optimizer_spec, workload, bench_size, device):
    spec = trial_spec(bench_size, optimizer_spec.name, device)
    model = fresh_model(workload, device)
    batch = first_batch(workload, bench_size.batch_size, device)
    optimizer = optimizer_spec.build_for(model)
    slowdown.slow_down_if_asked(optimizer)  # the regression gate's test knob; a no-op otherwise
    # As in the trial: one forward/backward before the memory baseline pages the kernels in; grads dropped.
    model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    memory = measure.MemoryWindow(device)

    benchmark.group = f"train step: {workload.model_name}, batch {spec.batch_size} x seq {spec.seq_len} on {device}"
    benchmark.pedantic(train_step, args=(model, optimizer, batch, device), rounds=bench_size.train_rounds,
                       warmup_rounds=bench_size.warmup_rounds, iterations=1)
    record = measured_record(spec, optimizer_spec, workload, model, optimizer, device, memory)
    benchmark.extra_info.update(extra_info("train_step", record))
    # what the timing means: the optimizer really holds its state, exactly the analytic count of it (0 for SGD)
    assert record.state_bytes == record.analytic_state_bytes, record.state_bytes_by_key
    assert len(benchmark.stats.stats.data) == bench_size.train_rounds
