//! The runner's entry: [`PipelineHandle::open`] opens a pipeline on this
//! server alone, or this server's part of a pipeline across hosts, as its
//! spec says.

use super::handle::PipelineHandle;
use crate::limits::EffectiveLimits;
use crate::settings::KafkaSettings;
use crate::types::{Desired, PipelineSpec};
use sluice_core::CircuitPorts;
use sluice_runtime::{LoadedComponent, SluiceEngine};
use std::path::PathBuf;
use std::sync::Arc;

impl PipelineHandle {
    /// Opens (or creates) the pipeline's storage in `dir` and starts its
    /// task in state `desired`.
    #[allow(clippy::too_many_arguments)]
    pub async fn open(
        base: &SluiceEngine,
        tenant: &str,
        spec: PipelineSpec,
        component: LoadedComponent,
        ports: CircuitPorts,
        limits: EffectiveLimits,
        dir: PathBuf,
        desired: Desired,
        kafka: Option<KafkaSettings>,
    ) -> sluice_pipeline::Result<Arc<PipelineHandle>> {
        let engine = Arc::new(base.with_limits(limits.instance));
        if spec.across_hosts {
            #[cfg(feature = "kafka")]
            if let Some(kafka) = kafka {
                return super::hosts::open(
                    engine, tenant, spec, component, ports, limits, dir, desired, kafka,
                )
                .await;
            }
            return Err(sluice_core::ConfigError::Invalid(
                "a pipeline across hosts needs a server with Kafka brokers and --hosts-etcd".into(),
            )
            .into());
        }
        super::single::open(
            engine, tenant, spec, component, ports, limits, dir, desired, kafka,
        )
        .await
    }
}
