//! What Sluice's exactly-once relies on in the Kafka-protocol broker, held
//! against the broker the tests run (`SLUICE_KAFKA_BROKERS`): a transactional
//! producer fenced by another `InitProducerId` of its transactional id while
//! its sends are in flight leaves nothing behind. Sluice fences a worker's
//! or a step log's producer exactly so (a new leader, a new holder of a
//! worker), while the old one may still be sending.
#![cfg(feature = "kafka")]

use crate::kafka::{brokers, fresh_name};
use crate::support::cluster::create_topic;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Partitions the fenced producer writes; the one fencing it writes all but
/// the last, so a record left open there would hold that partition's last
/// stable offset back, and one left in the others would be committed by
/// the next producer's commit marker.
const PARTITIONS: i32 = 4;

fn transactional(brokers: &str, id: &str) -> BaseProducer {
    rdkafka::ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("transactional.id", id)
        .set("linger.ms", "0")
        .set("transaction.timeout.ms", "60000")
        .create()
        .unwrap()
}

/// Round after round: producer A sends as fast as it can in a transaction;
/// B, with A's transactional id, fences it mid-send, then commits one
/// record to every partition but the last. In the end a `read_committed`
/// reader sees B's records only (A never committed), and every partition's
/// last stable offset is its end (nothing left open). Against a broker
/// that let a send checked before the fence land after the fence's abort
/// marker, A's record stayed open (crabka 0.3.0 without our
/// `crabka-fence-epoch.patch`): B's next commit marker, closing every open
/// record of the producer id, committed it.
#[test]
fn a_producer_fenced_mid_send_leaves_nothing_behind() {
    let Some(brokers) = brokers() else { return };
    let topic = fresh_name("fenced-mid-send");
    create_topic(&brokers, &topic, PARTITIONS);
    let id = fresh_name("fenced-mid-send-txn");
    let rounds: i32 = 30;
    let mut zombies_sent = 0u64;
    for round in 0..rounds {
        let a = transactional(&brokers, &id);
        a.init_transactions(Duration::from_secs(30)).unwrap();
        a.begin_transaction().unwrap();
        let fenced = Arc::new(AtomicBool::new(false));
        let sender = {
            let (topic, fenced) = (topic.clone(), fenced.clone());
            std::thread::spawn(move || {
                let mut sent = 0u64;
                let until = Instant::now() + Duration::from_secs(10);
                while !fenced.load(Ordering::SeqCst) && Instant::now() < until {
                    let p = (sent % PARTITIONS as u64) as i32;
                    match a.send(BaseRecord::<(), _>::to(&topic).partition(p).payload("a")) {
                        Ok(()) => sent += 1,
                        Err(_) => std::thread::sleep(Duration::from_millis(1)),
                    }
                    a.poll(Duration::ZERO);
                }
                // In flight until the fence answers them.
                let _ = a.flush(Duration::from_secs(5));
                sent
            })
        };
        // Fence A a moment into its sends.
        std::thread::sleep(Duration::from_millis(20 + (round as u64 * 7) % 40));
        let b = transactional(&brokers, &id);
        b.init_transactions(Duration::from_secs(30)).unwrap();
        fenced.store(true, Ordering::SeqCst);
        zombies_sent += sender.join().unwrap();
        b.begin_transaction().unwrap();
        for p in 0..PARTITIONS - 1 {
            b.send(BaseRecord::<(), _>::to(&topic).partition(p).payload("b"))
                .unwrap();
        }
        b.commit_transaction(Duration::from_secs(30)).unwrap();
    }
    assert!(zombies_sent > 0, "the fenced producer sent nothing");

    // Every partition's last stable offset reaches its end.
    let consumer = |isolation: &str| -> BaseConsumer {
        rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("group.id", fresh_name("fenced-mid-send-reader"))
            .set("enable.auto.commit", "false")
            .set("isolation.level", isolation)
            .create()
            .unwrap()
    };
    let (all, committed) = (consumer("read_uncommitted"), consumer("read_committed"));
    let t = Duration::from_secs(10);
    // A transaction open past its timeout is aborted by the broker: wait
    // less than that (60 s) for what is left open to show.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut open = Vec::new();
    loop {
        open.clear();
        for p in 0..PARTITIONS {
            let (_, high) = all.fetch_watermarks(&topic, p, t).unwrap();
            let (_, stable) = committed.fetch_watermarks(&topic, p, t).unwrap();
            if stable != high {
                open.push((p, stable, high));
            }
        }
        if open.is_empty() || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        open.is_empty(),
        "partitions (partition, last stable offset, end) held back by a fenced producer: {open:?}"
    );

    // A read_committed reader sees B's records only.
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(&topic, p, rdkafka::Offset::Beginning)
            .unwrap();
    }
    committed.assign(&tpl).unwrap();
    let (mut bs, mut zombies) = (0, Vec::new());
    let quiet = Duration::from_secs(3);
    let mut last = Instant::now();
    while last.elapsed() < quiet {
        match committed.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                last = Instant::now();
                match m.payload() {
                    Some(b"b") => bs += 1,
                    _ => zombies.push((m.partition(), m.offset())),
                }
            }
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    assert!(
        zombies.is_empty(),
        "{} records of a fenced producer read as committed, the first (partition, offset): {:?}",
        zombies.len(),
        &zombies[..zombies.len().min(8)]
    );
    assert_eq!(bs, rounds * (PARTITIONS - 1), "every record B committed");
}

/// The size of the log segments of `topic`'s partition 0 in a broker's
/// data directory (what has been appended there).
fn appended(dir: &std::path::Path, topic: &str) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir.join(format!("{topic}-0"))) else {
        return 0;
    };
    entries
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "log"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum()
}

/// A transactional batch appended just before the broker is killed, whose
/// acknowledgement never reached the producer (held in a proxy, then the
/// connection reset), is sent again by the producer after the restart with
/// the same producer id, epoch and sequence. The partition must know it
/// (Kafka rebuilds its producer state from the log on load) and answer
/// with the first append's offset: a second append would sit in the same
/// transaction, and its commit would hand a `read_committed` reader every
/// record twice — a step's output written twice (the fault campaign saw
/// it after a broker restart). crabka 0.3.0 kept that state in memory only
/// (`crabka-producer-state-restart.patch`).
#[test]
fn a_batch_retried_across_a_broker_restart_is_appended_once() {
    use crate::support::cluster::OwnBroker;
    use crate::support::proxy::Proxy;
    if brokers().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = None;
    let broker = OwnBroker::start_behind(dir.path().join("broker"), |addr| {
        let p = Proxy::start(addr);
        let front = p.addr().to_owned();
        proxy = Some(p);
        front
    });
    let proxy = proxy.unwrap();
    let front = proxy.addr().to_owned();
    let topic = fresh_name("retried-across-restart");
    create_topic(&front, &topic, 1);
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &front)
        .set("transactional.id", fresh_name("retried-across-restart-txn"))
        .set("acks", "all")
        .set("max.in.flight.requests.per.connection", "1")
        .set("linger.ms", "50")
        .set("message.timeout.ms", "60000")
        .set("transaction.timeout.ms", "60000")
        .set("reconnect.backoff.max.ms", "1000")
        .create()
        .unwrap();
    let t = Duration::from_secs(30);
    producer.init_transactions(t).unwrap();
    producer.begin_transaction().unwrap();
    let send = |value: &str| {
        producer
            .send(BaseRecord::<(), _>::to(&topic).partition(0).payload(value))
            .unwrap()
    };
    send("warm");
    producer.flush(t).unwrap();

    // The next batch reaches the log; its acknowledgement stays in the proxy.
    let before = appended(&broker.dir, &topic);
    assert!(
        before > 0,
        "no segment of {topic} under {}",
        broker.dir.display()
    );
    proxy.hold_out(true);
    for i in 0..10 {
        send(&format!("r{i}"));
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while appended(&broker.dir, &topic) == before {
        assert!(Instant::now() < deadline, "the batch was never appended");
        producer.poll(Duration::from_millis(10));
    }
    // The broker dies with the batch in its log; the held answer is never
    // delivered (the connections end), so the producer sends the batch
    // again to the restarted broker.
    broker.kill();
    proxy.reset();
    proxy.hold_out(false);
    broker.up();
    producer
        .commit_transaction(Duration::from_secs(60))
        .unwrap();

    let reader: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &front)
        .set("group.id", fresh_name("retried-across-restart-reader"))
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    reader.assign(&tpl).unwrap();
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let deadline = Instant::now() + t;
    loop {
        assert!(
            Instant::now() < deadline,
            "{topic} not read to its end in {t:?}"
        );
        match reader.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                *seen.entry(value).or_default() += 1;
            }
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) => panic!("reading {topic}: {e}"),
            None => {}
        }
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "records committed more than once: {twice:?}"
    );
    let expected: Vec<String> = std::iter::once("warm".to_owned())
        .chain((0..10).map(|i| format!("r{i}")))
        .collect();
    let got: Vec<String> = seen.into_keys().collect();
    let mut expected = expected;
    expected.sort();
    assert_eq!(got, expected, "every record committed once");
}
