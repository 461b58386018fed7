//! The WebAssembly engine: configuration (component model, async, NaN
//! canonicalization, fuel, no threads), the linker
//! with the host's imports, and components: validated against the world and
//! precompiled into a cache keyed by content hash.

use crate::bindings::{CIRCUIT_EXPORT, PipelineWorker, PipelineWorkerPre, WORLD};
use crate::determinism::StepClocks;
use crate::error::{Error, Result};
use crate::instance::WorkerState;
use sha2::{Digest, Sha256};
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use wasmtime::component::{Component, HasSelf, Linker};
use wasmtime::{Config, Engine};

/// How often [`ticks`] advances: the granularity of the deadline checked
/// after each host call.
pub const TICK: Duration = Duration::from_millis(10);

/// Ticks of [`TICK`] since the first engine of the process started its
/// ticker thread. The deadline check after every host call (and libcall) a
/// guest makes reads this, one atomic load, rather than the clock.
static TICKS: AtomicU64 = AtomicU64::new(0);

/// The current tick (see [`TICK`]).
pub(crate) fn ticks() -> u64 {
    TICKS.load(Ordering::Relaxed)
}

/// Starts the process's ticker thread, once; it runs as long as the process.
fn start_ticker() -> Result<()> {
    static STARTED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    STARTED
        .get_or_init(|| {
            std::thread::Builder::new()
                .name("sluice-ticks".into())
                .spawn(|| {
                    loop {
                        std::thread::sleep(TICK);
                        TICKS.fetch_add(1, Ordering::Relaxed);
                    }
                })
                .map(|_| ())
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| Error::Engine {
            what: "starting the ticker thread".into(),
            source: e.into(),
        })
}

/// Resource limits of every instance (invariant I6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Maximum linear memory of one instance, in bytes.
    pub memory: usize,
    /// Fuel granted to each call into the guest (a deterministic CPU bound:
    /// the same call stops at the same point on replay).
    pub fuel_per_call: u64,
    /// Wall-clock deadline of each call into the guest.
    pub deadline: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory: 1 << 30,
            fuel_per_call: 50_000_000_000,
            deadline: Duration::from_secs(120),
        }
    }
}

/// A configured engine plus linker; shared by all pipelines of a host.
pub struct SluiceEngine {
    engine: Engine,
    /// The pooling allocator's size, if it is used.
    pool: Option<u32>,
    linker: Linker<WorkerState>,
    cache_dir: Option<PathBuf>,
    limits: Limits,
}

/// A validated component, ready to instantiate.
#[derive(Clone)]
pub struct LoadedComponent {
    /// SHA-256 of the component bytes, hex.
    pub hash: String,
    pub(crate) pre: PipelineWorkerPre<WorkerState>,
}

impl SluiceEngine {
    /// Builds the engine. `cache_dir` holds precompiled components (none:
    /// compile every time). Instances get their memory on demand.
    pub fn new(limits: Limits, cache_dir: Option<PathBuf>) -> Result<Self> {
        Self::build(limits, cache_dir, None)
    }

    /// Like [`new`](Self::new), but instances come from a pooling allocator
    /// sized for `max_instances` concurrent instances: faster to
    /// instantiate, with all their memory reserved up front. A full pool
    /// refuses further instances with an error.
    pub fn with_pooling(
        limits: Limits,
        cache_dir: Option<PathBuf>,
        max_instances: u32,
    ) -> Result<Self> {
        Self::build(limits, cache_dir, Some(max_instances))
    }

    fn build(limits: Limits, cache_dir: Option<PathBuf>, pooling: Option<u32>) -> Result<Self> {
        // No `threads` feature is compiled in, so guests cannot spawn threads
        // or share memory (I4): there is nothing to switch off.
        let mut config = Config::new();
        // Relaxed SIMD may compute other bits on another CPU (fused or not):
        // the deterministic mode gives every host the same (I4).
        config
            .wasm_component_model(true)
            .cranelift_nan_canonicalization(true)
            .relaxed_simd_deterministic(true)
            // Fuel bounds a call's CPU deterministically (I6) and slices it
            // for yields, at which a call past its wall-clock deadline is
            // stopped (`worker::timed`); no epoch checks on top of it.
            .consume_fuel(true);
        if std::env::var_os("SLUICE_PERFMAP").is_some_and(|v| v != "0") {
            // For profiling: names the guests' compiled functions in
            // `/tmp/perf-PID.map`, which `perf report` reads.
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        if let Some(n) = pooling {
            // A Rust component instantiates a handful of core modules (its
            // own, the WASI adapter, shims), each with a memory or a table;
            // a Python one (componentize-py) some 40, sharing one memory.
            let mut pool = wasmtime::PoolingAllocationConfig::default();
            pool.total_component_instances(n)
                .total_core_instances(n.saturating_mul(16))
                .total_memories(n.saturating_mul(2))
                .total_tables(n.saturating_mul(8))
                .total_stacks(n)
                .max_core_instances_per_component(crate::instance::MAX_INSTANCES as u32)
                .max_memories_per_component(4)
                .max_tables_per_component(16)
                .max_memory_size(limits.memory)
                // A slot a stopped worker frees is reset by zeroing its
                // first pages in place rather than handing them back to the
                // kernel: the next worker there does not fault them in again.
                // 1.25 MiB covers a Rust guest's 1 MiB shadow stack and the
                // start of its data and heap, which every first call touches
                // (measured: a no-op `init` took 15 µs in a reused slot with
                // 256 KiB kept, 3–6 µs with 1.25 MiB). The price: a freed
                // slot keeps that much resident.
                .linear_memory_keep_resident(1280 << 10)
                .table_keep_resident(64 << 10);
            config.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&config).map_err(Error::engine("configuring the engine"))?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(Error::engine("linking WASI"))?;
        // The monotonic clock's timers follow the step's time, not real time
        // (see `determinism`): replace WASI's.
        linker.allow_shadowing(true);
        wasmtime_wasi::p2::bindings::clocks::monotonic_clock::add_to_linker::<_, StepClocks>(
            &mut linker,
            WorkerState::clock_view,
        )
        .map_err(Error::engine("linking the step clock"))?;
        linker.allow_shadowing(false);
        PipelineWorker::add_to_linker::<_, HasSelf<_>>(&mut linker, |s| s)
            .map_err(Error::engine("linking the sluice:circuit world"))?;

        start_ticker()?;
        Ok(SluiceEngine {
            engine,
            pool: pooling,
            linker,
            cache_dir,
            limits,
        })
    }

    /// The same engine (compiled components, pool) with other
    /// per-instance limits: one per pipeline on a multi-tenant host.
    pub fn with_limits(&self, limits: Limits) -> SluiceEngine {
        SluiceEngine {
            engine: self.engine.clone(),
            pool: self.pool,
            linker: self.linker.clone(),
            cache_dir: self.cache_dir.clone(),
            limits,
        }
    }

    /// The wasmtime engine.
    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The pooling allocator's size (`None`: instances allocated on demand).
    pub fn pool_size(&self) -> Option<u32> {
        self.pool
    }

    /// The limits every instance gets.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The default cache directory: `$SLUICE_CACHE_DIR`, else
    /// `$XDG_CACHE_HOME/sluice`, else `~/.cache/sluice`.
    pub fn default_cache_dir() -> Option<PathBuf> {
        if let Some(d) = std::env::var_os("SLUICE_CACHE_DIR") {
            return Some(PathBuf::from(d));
        }
        if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
            return Some(PathBuf::from(d).join("sluice"));
        }
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("sluice"))
    }

    /// Reads, validates and compiles (or loads from the cache) the component
    /// at `path`.
    pub fn load_file(&self, path: &Path) -> Result<LoadedComponent> {
        let bytes = std::fs::read(path).map_err(|e| Error::InvalidComponent {
            path: path.to_owned(),
            message: format!("cannot read it: {e}"),
        })?;
        self.load(path, &bytes)
    }

    /// The cheap checks of a component, before anything is compiled: the
    /// binary header, and the names its outermost component imports and
    /// exports (only WASI and the `sluice:circuit` interfaces may be
    /// imported; the circuit must be exported). A component that passes may
    /// still be refused by [`load`](Self::load), which checks the types.
    pub fn precheck(&self, origin: &Path, bytes: &[u8]) -> Result<()> {
        let invalid = |message: String| Error::InvalidComponent {
            path: origin.to_owned(),
            message,
        };
        check_header(bytes).map_err(invalid)?;
        let mut depth = 0usize;
        let mut exports_circuit = false;
        for payload in wasmparser::Parser::new(0).parse_all(bytes) {
            let payload = payload.map_err(|e| invalid(format!("not a valid component: {e}")))?;
            match payload {
                wasmparser::Payload::ModuleSection { .. }
                | wasmparser::Payload::ComponentSection { .. } => depth += 1,
                wasmparser::Payload::End(_) => depth = depth.saturating_sub(1),
                wasmparser::Payload::ComponentImportSection(imports) if depth == 0 => {
                    for import in imports {
                        let import =
                            import.map_err(|e| invalid(format!("not a valid component: {e}")))?;
                        let name = import.name.name;
                        if !(name.starts_with("wasi:") || name.starts_with("sluice:circuit/")) {
                            return Err(invalid(format!(
                                "imports {name:?}, which this host does not provide (only the \
                                 {WORLD} world and inert WASI)"
                            )));
                        }
                    }
                }
                wasmparser::Payload::ComponentExportSection(exports) if depth == 0 => {
                    for export in exports {
                        let export =
                            export.map_err(|e| invalid(format!("not a valid component: {e}")))?;
                        exports_circuit |= export.name.name == CIRCUIT_EXPORT;
                    }
                }
                _ => {}
            }
        }
        if !exports_circuit {
            return Err(invalid(format!(
                "does not implement the {WORLD} world: it does not export {CIRCUIT_EXPORT}"
            )));
        }
        Ok(())
    }

    /// Validates and compiles (or loads from the cache) a component; `origin`
    /// names it in errors. A compiled component is cached only once it
    /// passed the world check.
    pub fn load(&self, origin: &Path, bytes: &[u8]) -> Result<LoadedComponent> {
        let invalid = |message: String| Error::InvalidComponent {
            path: origin.to_owned(),
            message,
        };
        check_header(bytes).map_err(invalid)?;
        let hash = hex::encode(Sha256::digest(bytes));
        let (component, compiled) = self
            .compile_cached(&hash, bytes)
            .map_err(|e| invalid(format!("does not compile: {e:#}")))?;
        let pre = self.linker.instantiate_pre(&component).map_err(|e| {
            invalid(format!("imports something this host does not provide (only the {WORLD} world and inert WASI): {e:#}"))
        })?;
        let pre = PipelineWorkerPre::new(pre).map_err(|e| {
            let exports: Vec<String> = component
                .component_type()
                .exports(&self.engine)
                .map(|(n, _)| n.to_owned())
                .collect();
            invalid(format!(
                "does not implement the {WORLD} world ({e:#}); it must export {CIRCUIT_EXPORT}, \
                 it exports [{}]",
                exports.join(", ")
            ))
        })?;
        if let (Some(compiled), Some(file)) = (compiled, self.cache_file(&hash))
            && let Err(e) = write_atomically(&file, &compiled)
        {
            tracing::warn!(file = %file.display(), "not caching the compiled component: {e}");
        }
        Ok(LoadedComponent { hash, pre })
    }

    /// Where the compiled form of component `hash` is cached.
    fn cache_file(&self, hash: &str) -> Option<PathBuf> {
        let dir = self.cache_dir.as_ref()?;
        Some(
            dir.join("components")
                .join(format!("{hash}-{:016x}.cwasm", self.compatibility())),
        )
    }

    /// A hash of what makes compiled code usable by this engine.
    fn compatibility(&self) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.engine.precompile_compatibility_hash().hash(&mut h);
        h.finish()
    }

    /// The component from the cache, or compiled (with the compiled bytes,
    /// for the caller to cache once the component passed its checks).
    fn compile_cached(
        &self,
        hash: &str,
        bytes: &[u8],
    ) -> wasmtime::Result<(Component, Option<Vec<u8>>)> {
        let Some(file) = self.cache_file(hash) else {
            return Ok((Component::new(&self.engine, bytes)?, None));
        };
        if file.exists() {
            // SAFETY: the file was written by `precompile_component` of an
            // engine with the same compatibility hash, into our own cache, and
            // renamed into place only once complete.
            match unsafe { Component::deserialize_file(&self.engine, &file) } {
                Ok(c) => {
                    // Marks the entry as used, for pruning.
                    if let Ok(f) = std::fs::File::options().append(true).open(&file) {
                        let _ = f.set_modified(std::time::SystemTime::now());
                    }
                    return Ok((c, None));
                }
                Err(e) => {
                    tracing::warn!(file = %file.display(), "recompiling: unusable cache entry: {e:#}")
                }
            }
        }
        let compiled = self.engine.precompile_component(bytes)?;
        // SAFETY: the bytes were just produced by this engine.
        let component = unsafe { Component::deserialize(&self.engine, &compiled) }?;
        Ok((component, Some(compiled)))
    }

    /// Deletes compiled components from the cache that were made by another
    /// engine, or whose component hash is not in `keep` and that were not
    /// used for `unused_for`. Returns the files and bytes removed.
    pub fn prune_cache(
        &self,
        keep: &std::collections::BTreeSet<String>,
        unused_for: Duration,
    ) -> std::io::Result<(usize, u64)> {
        let Some(dir) = &self.cache_dir else {
            return Ok((0, 0));
        };
        let dir = dir.join("components");
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
            Err(e) => return Err(e),
        };
        let ours = format!("-{:016x}.cwasm", self.compatibility());
        let now = std::time::SystemTime::now();
        let (mut files, mut bytes) = (0, 0);
        for entry in entries {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some((hash, _)) = name.split_once('-') else {
                continue;
            };
            if !name.ends_with(".cwasm") {
                continue;
            }
            let meta = entry.metadata()?;
            let idle = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .unwrap_or_default();
            let stale = !name.ends_with(&ours) || !keep.contains(hash);
            if stale && idle >= unused_for && std::fs::remove_file(entry.path()).is_ok() {
                files += 1;
                bytes += meta.len();
            }
        }
        Ok((files, bytes))
    }
}

/// The component-model binary header, or why the bytes are not a component.
fn check_header(bytes: &[u8]) -> std::result::Result<(), String> {
    match bytes.get(..8) {
        Some([0, b'a', b's', b'm', 0x0d, 0x00, 0x01, 0x00]) => Ok(()),
        Some([0, b'a', b's', b'm', 0x01, 0x00, 0x00, 0x00]) => Err(
            "this is a core WebAssembly module, not a component; build the circuit for the \
             wasm32-wasip2 target (sluice build does)"
                .into(),
        ),
        _ => Err("not a WebAssembly component (bad header)".into()),
    }
}

fn write_atomically(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    std::io::Write::write_all(&mut tmp, bytes)?;
    tmp.persist(file).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod cache_tests {
    use super::*;

    #[test]
    fn pruning_keeps_used_and_recent_entries_and_drops_other_engines() {
        let dir = tempfile::tempdir().unwrap();
        let engine = SluiceEngine::new(Limits::default(), Some(dir.path().to_owned())).unwrap();
        let ours = format!("{:016x}", engine.compatibility());
        let cache = dir.path().join("components");
        std::fs::create_dir_all(&cache).unwrap();
        let old = std::time::SystemTime::now() - Duration::from_secs(3 * 24 * 3600);
        let file = |name: &str, at: std::time::SystemTime| {
            let path = cache.join(name);
            std::fs::write(&path, b"compiled").unwrap();
            std::fs::File::options()
                .append(true)
                .open(&path)
                .unwrap()
                .set_modified(at)
                .unwrap();
        };
        file(&format!("kept-{ours}.cwasm"), old);
        file(&format!("unused-{ours}.cwasm"), old);
        file(
            &format!("recent-{ours}.cwasm"),
            std::time::SystemTime::now(),
        );
        file("kept-0123456789abcdef.cwasm", old);
        let keep: std::collections::BTreeSet<String> = ["kept".to_owned()].into();
        let (files, bytes) = engine
            .prune_cache(&keep, Duration::from_secs(24 * 3600))
            .unwrap();
        assert_eq!((files, bytes), (2, 16));
        let mut left: Vec<String> = std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            vec![format!("kept-{ours}.cwasm"), format!("recent-{ours}.cwasm")]
        );
    }
}
