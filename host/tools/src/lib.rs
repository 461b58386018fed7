//! # sluice-tools: what `sluice` does besides running pipelines
//!
//! Tools built on the host's libraries, with the heavier dependencies they
//! need (plotters, the Nexmark generator, the example circuits compiled
//! natively as baselines), kept out of the libraries:
//!
//! - [`compile`]: `sluice build`, a circuit crate → a component;
//!   [`python`]: the same for a Python circuit, with componentize-py.
//! - [`bench`]: `sluice bench`, costs as ratios to same-run baselines.
//! - [`chaos`]: `sluice chaos`, the crash campaigns (on one host, and with
//!   `--hosts` across hosts).
//! - [`generate`]: `sluice gen`, Nexmark input as JSON lines.
//! - [`demo`]: `sluice demo`, word count over bundled text.
//!
//! ```no_run
//! let wasm = sluice_tools::compile::build_component(
//!     &sluice_tools::examples_dir().join("wordcount"),
//!     None,
//! )?;
//! println!("{}", wasm.display());
//! # Ok::<_, anyhow::Error>(())
//! ```

pub mod bench;
pub mod chaos;
pub mod compile;
pub mod demo;
pub mod generate;
pub mod python;

/// The source tree's `examples/` directory (the demo, the bench and the
/// campaign build their circuits from it).
pub fn examples_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}
