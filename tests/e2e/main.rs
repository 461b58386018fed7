//! The end-to-end tests, one binary (see `tests/README.md`): they run the
//! real `sluice` binary and the host's libraries against real storage, a
//! real Kafka-protocol broker and real guest components.

mod support;

mod api;
mod bad_records;
mod broker;
mod campaign;
mod chaos;
mod cli;
mod cluster;
mod console;
mod crash;
mod docs;
mod examples;
mod faults;
mod hardening;
mod hosts;
mod in_place;
mod incremental;
mod invariants;
mod kafka;
mod memory;
mod nexmark;
mod partitions;
mod python;
mod read_ahead;
mod replicas;
mod rescale;
mod server;
mod step_log;
mod takeover;
mod upgrade;
mod upgrade_group_campaign;
mod upgrade_hosts;
mod upgrade_kafka;
mod upgrade_rebuild;
mod upgrade_servers;
mod upgrade_switch;
mod verify;
