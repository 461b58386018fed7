//! Durable commit: a step commit through the runtime's guarded path against
//! a raw synced RocksDB write batch of the same bytes, in one run.

use criterion::{Criterion, criterion_group, criterion_main};
use sluice_core::StepCommit;
use sluice_embedded::{db, output_key};
use sluice_pipeline::{PipelineConfig, Storage};

fn commit(step: u64, epoch: u64, prev: u128) -> StepCommit {
    sluice_tools::bench::sample_commit(step, 50, epoch, prev)
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("durable commit");
    group.sample_size(30);

    let dir = tempfile::tempdir().unwrap();
    let storage = Storage::open(
        &PipelineConfig::new(dir.path(), 2),
        &sluice_tools::bench::wordcount_ports(),
        "bench",
    )
    .unwrap();
    let guarded = storage.guarded();
    let epoch = guarded.fence().unwrap();
    let (mut step, mut prev) = (0, 0);
    group.bench_function("runtime step commit", |b| {
        b.iter(|| {
            let c = commit(step, epoch, prev);
            guarded.commit_step(&c).unwrap();
            prev = c.record.chain_hash();
            step += 1;
        })
    });

    let dir = tempfile::tempdir().unwrap();
    let database = db::open(dir.path()).unwrap();
    let (out, steps) = (
        db::cf(&database, db::CF_OUTPUT).unwrap(),
        db::cf(&database, db::CF_STEPS).unwrap(),
    );
    let mut step = 0;
    group.bench_function("raw synced WriteBatch", |b| {
        b.iter(|| {
            let c = commit(step, 1, 0);
            let mut wb = rocksdb::WriteBatch::default();
            for e in &c.outputs[0].1 {
                wb.put_cf(
                    out,
                    output_key("counts", e.step, e.worker),
                    postcard::to_allocvec(e).unwrap(),
                );
            }
            wb.put_cf(
                steps,
                step.to_be_bytes(),
                postcard::to_allocvec(&c.record).unwrap(),
            );
            database.write_opt(wb, &db::synced()).unwrap();
            step += 1;
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
