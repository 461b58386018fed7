//! What Sluice's exactly-once relies on in the Kafka-protocol broker, held
//! against the broker the tests run (`SLUICE_KAFKA_BROKERS`): a transactional
//! producer fenced by another `InitProducerId` of its transactional id while
//! its sends are in flight leaves nothing behind. Sluice fences a worker's
//! or a step log's producer exactly so (a new leader, a new holder of a
//! worker), while the old one may still be sending.
#![cfg(feature = "kafka")]

use crate::kafka::{brokers, fresh_name};
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
    {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let admin: AdminClient<_> = rdkafka::ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .create()
            .unwrap();
        let new = NewTopic::new(&topic, PARTITIONS, TopicReplication::Fixed(1));
        let created =
            futures_executor::block_on(admin.create_topics([&new], &AdminOptions::new())).unwrap();
        for r in created {
            r.unwrap();
        }
    }
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
