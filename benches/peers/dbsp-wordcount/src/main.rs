//! Word count in `dbsp` 0.349, the native incremental engine Sluice is
//! measured against (issue #32).
//!
//! `dbsp-wordcount FILE WORKERS BATCH` reads FILE (one JSON string per line,
//! the file `sluice run --input lines=FILE` reads), feeds it in steps of
//! BATCH lines to a circuit of WORKERS worker threads that splits lines into
//! words with `examples/wordcount`'s own `words` and counts each word, consumes
//! every step's changes, and prints `words=N total=M seconds=S` (distinct
//! words, the sum of their counts, and the wall time from the first read to
//! the last step). Peak memory is the caller's to measure (`wait4`).

use dbsp::{IndexedZSetReader, Runtime, utils::Tup2};
use std::collections::HashMap;
use std::io::BufRead;
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    anyhow::ensure!(args.len() == 4, "usage: dbsp-wordcount FILE WORKERS BATCH");
    let workers: usize = args[2].parse()?;
    let batch: usize = args[3].parse()?;
    let start = Instant::now();
    let (mut circuit, (input, output)) = Runtime::init_circuit(workers, |c| {
        let (lines, input) = c.add_input_zset::<String>();
        let counts = lines
            .flat_map(|line: &String| wordcount::words(line))
            .map_index(|w: &String| (w.clone(), ()))
            .weighted_count();
        // A transaction may take several steps: accumulate its output.
        Ok((input, counts.accumulate_output()))
    })?;
    let file = std::io::BufReader::new(std::fs::File::open(&args[1])?);
    // The integral of the output, as a reader of Sluice's output log keeps it.
    let mut counts: HashMap<String, i64> = HashMap::new();
    let mut pending = Vec::with_capacity(batch);
    let mut lines = file.lines();
    loop {
        let mut done = true;
        for line in lines.by_ref() {
            let line: String = serde_json::from_str(&line?)?;
            pending.push(Tup2(line, 1));
            if pending.len() == batch {
                done = false;
                break;
            }
        }
        input.append(&mut pending);
        circuit.transaction()?;
        for (word, count, weight) in output.concat().consolidate().iter() {
            // An update retracts the old count (weight -1) and inserts the
            // new one (+1): keep the inserted one.
            if weight > 0 {
                counts.insert(word, count);
            } else if counts.get(&word) == Some(&count) {
                counts.remove(&word);
            }
        }
        if done {
            break;
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    circuit.kill().ok();
    let total: i64 = counts.values().sum();
    println!("words={} total={total} seconds={seconds:.3}", counts.len());
    Ok(())
}
