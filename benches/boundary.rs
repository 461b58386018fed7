//! The step boundary: one `step` call into a WASM word-count worker with no
//! input, and with 1 000 lines, against the same circuit running natively.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sluice_core::Event;
use sluice_guest::CircuitInstance;
use sluice_guest::exchange::{LocalExchange, RawEvent};
use sluice_runtime::{Limits, SluiceEngine, Worker};

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let engine = SluiceEngine::new(Limits::default(), SluiceEngine::default_cache_dir()).unwrap();
    let target = SluiceEngine::default_cache_dir()
        .unwrap_or_else(std::env::temp_dir)
        .join("guest-target");
    let wasm = sluice_tools::compile::build_component(
        &sluice_tools::examples_dir().join("wordcount"),
        Some(&target),
    )
    .unwrap();
    let component = engine.load_file(&wasm).unwrap();
    let mut worker = rt
        .block_on(Worker::standalone(&engine, &component, "bench"))
        .unwrap();
    let mut native = CircuitInstance::build(wordcount::build).unwrap();
    let lines: Vec<Event> = sluice_tools::demo::TEXT
        .lines()
        .cycle()
        .take(1000)
        .map(|l| Event {
            value: serde_json::to_vec(l).unwrap(),
            weight: 1,
        })
        .collect();

    let mut group = c.benchmark_group("step boundary");
    for n in [0usize, 1000] {
        let input = lines[..n].to_vec();
        let raw: Vec<RawEvent> = input
            .iter()
            .map(|e| RawEvent {
                key: vec![],
                value: e.value.clone(),
                weight: e.weight,
            })
            .collect();
        let mut step = 0u64;
        group.bench_with_input(BenchmarkId::new("wasm", n), &input, |b, input| {
            b.iter(|| {
                step += 1;
                rt.block_on(worker.step_ports(step, 0, vec![input.clone()]))
                    .unwrap()
            })
        });
        group.bench_with_input(BenchmarkId::new("native", n), &raw, |b, raw| {
            b.iter(|| native.step(vec![raw.clone()], &mut LocalExchange).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
