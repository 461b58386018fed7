//! Topics: their partition counts, creating them (with their configuration)
//! and reading it back, and deleting a pipeline's topics ([`delete_topics`]).

use crate::config::{KafkaConfig, validate_topic};
use crate::errors::{kafka, kafka_failure};
use crate::handle::{KafkaLog, lock};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use sluice_core::ConfigError;
use sluice_storage::{Result, StorageError as Error};
use std::time::{Duration, Instant};

impl KafkaLog {
    /// The partition count of `topic`, or `None` if it does not exist.
    pub(crate) fn topic_partitions(&self, topic: &str) -> Result<Option<u32>> {
        if let Some(n) = lock(&self.partitions).get(topic) {
            return Ok(Some(*n));
        }
        let md = self
            .client
            .fetch_metadata(Some(topic), self.config.timeout)
            .map_err(kafka(format!("reading metadata of topic `{topic}`")))?;
        let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
            return Ok(None);
        };
        match t.error() {
            None => {}
            Some(e) => {
                let code: RDKafkaErrorCode = e.into();
                if code == RDKafkaErrorCode::UnknownTopicOrPartition {
                    return Ok(None);
                }
                return Err(Error::backend(
                    "Kafka",
                    format!("reading metadata of topic `{topic}`"),
                    true,
                    KafkaError::MetadataFetch(code),
                ));
            }
        }
        if t.partitions().is_empty() {
            return Ok(None);
        }
        let n = t.partitions().len() as u32;
        lock(&self.partitions).insert(topic.to_owned(), n);
        Ok(Some(n))
    }

    /// The replication factor of the topics this log creates: the one
    /// configured, or (`0`) what the cluster offers, `min(3, brokers)`.
    fn replication(&self) -> Result<i32> {
        if self.config.replication != 0 {
            return Ok(self.config.replication);
        }
        let md = self
            .client
            .fetch_metadata(None, self.config.timeout)
            .map_err(kafka("reading the cluster's brokers"))?;
        Ok(offered_replication(md.brokers().len()))
    }

    /// Creates `topic` with `partitions` partitions if it does not exist;
    /// returns its partition count.
    pub(crate) fn ensure_topic(
        &self,
        topic: &str,
        partitions: u32,
        config: &[(&str, &str)],
    ) -> Result<u32> {
        validate_topic(topic)?;
        if let Some(n) = self.topic_partitions(topic)? {
            return Ok(n);
        }
        let replication = self.replication()?;
        if replication == 1 {
            let loses = match topic == self.config.steps_topic() {
                true => "the pipeline's step history, which would start again at step 0",
                false => "its records",
            };
            tracing::warn!(
                topic,
                "creating a topic with replication factor 1 (the cluster has one broker, or \
                 --replication 1 was asked for): one broker's disk lost loses {loses}"
            );
        }
        let mut new = NewTopic::new(
            topic,
            partitions as i32,
            TopicReplication::Fixed(replication),
        );
        for (k, v) in config {
            new = new.set(k, v);
        }
        let opts = AdminOptions::new().operation_timeout(Some(self.config.timeout));
        let results = futures_executor::block_on(self.admin.create_topics([&new], &opts))
            .map_err(kafka(format!("creating topic `{topic}`")))?;
        for r in results {
            match r {
                Ok(_) => {}
                Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((name, code)) => {
                    return Err(ConfigError::Invalid(format!(
                        "the Kafka broker refused to create topic `{name}` with {partitions} \
                         partitions: {code}"
                    ))
                    .into());
                }
            }
        }
        // Metadata can lag the creation briefly.
        let deadline = Instant::now() + self.config.timeout;
        loop {
            if let Some(n) = self.topic_partitions(topic)? {
                return Ok(n);
            }
            if Instant::now() > deadline {
                return Err(kafka_failure(
                    format!("creating topic `{topic}`"),
                    "the topic did not appear in the metadata",
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The value of configuration `key` of `topic`, as the broker reports it.
    pub(crate) fn topic_config(&self, topic: &str, key: &str) -> Result<Option<String>> {
        let opts = AdminOptions::new().request_timeout(Some(self.config.timeout));
        let results = futures_executor::block_on(
            self.admin
                .describe_configs([&ResourceSpecifier::Topic(topic)], &opts),
        )
        .map_err(kafka(format!("describing topic `{topic}`")))?;
        for r in results {
            let resource = r.map_err(|code| {
                kafka(format!("describing topic `{topic}`"))(KafkaError::AdminOp(code))
            })?;
            if let Some(entry) = resource.get(key) {
                return Ok(entry.value.clone());
            }
        }
        Ok(None)
    }

    /// The partition count of an existing topic of log `log`, or an error.
    pub(crate) fn known_partitions(&self, log: &str) -> Result<(String, u32)> {
        let topic = self.config.topic(log);
        match self.topic_partitions(&topic)? {
            Some(n) => Ok((topic, n)),
            None => Err(Error::Unknown {
                kind: "log",
                name: log.to_owned(),
                hint: format!(" (Kafka topic `{topic}` does not exist)"),
            }),
        }
    }

    /// The topic of log `log`, if it exists and has partition `partition`.
    pub(crate) fn check_partition(&self, log: &str, partition: u32) -> Result<String> {
        let (topic, n) = self.known_partitions(log)?;
        if partition >= n {
            return Err(Error::Unknown {
                kind: "partition",
                name: format!("{log}/{partition}"),
                hint: format!(" (topic `{topic}` has {n} partitions)"),
            });
        }
        Ok(topic)
    }

    /// Each output log's topic (created if missing) and its partitions.
    pub(crate) fn output_topics<'n>(
        &self,
        names: impl Iterator<Item = &'n str>,
    ) -> Result<Vec<(String, u32)>> {
        names
            .map(|name| {
                let topic = self.config.topic(name);
                let n = self.ensure_topic(&topic, self.config.output_partitions, &[])?;
                Ok((topic, n))
            })
            .collect()
    }
}
/// Deletes the topics a pipeline owns — its step and meta topics and every
/// `<pipeline>.<log>` topic (logs named to other topics in
/// [`KafkaConfig::topics`] are not the pipeline's and stay) — and its
/// consumer group. Returns the topics deleted.
pub fn delete_topics(config: &KafkaConfig) -> Result<Vec<String>> {
    let admin: AdminClient<DefaultClientContext> = config
        .base()
        .create()
        .map_err(kafka("creating the Kafka admin client"))?;
    let client: BaseConsumer = config
        .base()
        .create()
        .map_err(kafka("creating a Kafka client"))?;
    let md = client
        .fetch_metadata(None, config.timeout)
        .map_err(kafka("listing topics"))?;
    let prefix = format!("{}.", config.pipeline);
    let named: std::collections::HashSet<&String> = config.topics.values().collect();
    // Log names hold no `.` (but a dead-letter log's `<port>.dead-letter`):
    // a topic with one more is another pipeline's.
    let owned: Vec<String> = md
        .topics()
        .iter()
        .map(|t| t.name().to_owned())
        .filter(|t| {
            t.strip_prefix(&prefix).is_some_and(|rest| {
                !rest.is_empty()
                    && (!rest.contains('.') || sluice_core::dead_letter_input(rest).is_some())
            }) && !named.contains(t)
        })
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(config.timeout));
    if !owned.is_empty() {
        let names: Vec<&str> = owned.iter().map(String::as_str).collect();
        let results = futures_executor::block_on(admin.delete_topics(&names, &opts))
            .map_err(kafka("deleting the pipeline's topics"))?;
        for r in results {
            if let Err((topic, code)) = r
                && code != RDKafkaErrorCode::UnknownTopicOrPartition
            {
                return Err(kafka_failure(
                    format!("deleting topic `{topic}`"),
                    code.to_string(),
                ));
            }
        }
    }
    // The group only shows progress; a broker without it is fine.
    let _ = futures_executor::block_on(admin.delete_groups(&[&config.group()], &opts));
    Ok(owned)
}

/// The replication factor a cluster of `brokers` brokers offers: as many
/// copies as there are brokers, up to 3 (Kafka's usual production
/// setting); 1 when the metadata names none.
fn offered_replication(brokers: usize) -> i32 {
    brokers.clamp(1, 3) as i32
}

#[cfg(test)]
mod tests {
    use super::offered_replication;

    #[test]
    fn topics_get_as_many_copies_as_the_cluster_offers_up_to_three() {
        let offered: Vec<i32> = (0..6).map(offered_replication).collect();
        assert_eq!(offered, [1, 1, 2, 3, 3, 3]);
    }
}
