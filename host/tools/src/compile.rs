//! `sluice build`: compiling a circuit crate into a component.
//!
//! A Python circuit (a directory with `circuit.py`, see
//! [`python`](crate::python)) is built with componentize-py instead. For a
//! Rust crate, runs `cargo build --release --target wasm32-wasip2` on the crate and finds
//! the `.wasm` it produced from cargo's JSON messages. On `wasm32-wasip2` a
//! `cdylib` is already a component.

use anyhow::{Context, Result, bail};
use cargo_metadata::Message;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The target circuits are built for.
pub const TARGET: &str = "wasm32-wasip2";

/// Builds the circuit crate at `crate_dir` (a directory with `Cargo.toml`,
/// or the manifest itself) and returns the component's path. Cargo's own
/// progress goes to stderr. `target_dir` overrides cargo's target directory.
pub fn build_component(crate_dir: &Path, target_dir: Option<&Path>) -> Result<PathBuf> {
    if crate_dir.extension().is_some_and(|e| e == "py") && crate_dir.is_file() {
        let module = crate_dir
            .file_stem()
            .and_then(|s| s.to_str())
            .context("a Python file's name")?;
        let dir = crate_dir.parent().unwrap_or(Path::new("."));
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        return crate::python::build(dir, module, target_dir);
    }
    if let Some(module) = crate::python::circuit_module(crate_dir)? {
        return crate::python::build(crate_dir, &module, target_dir);
    }
    let manifest = if crate_dir.is_file() {
        crate_dir.to_owned()
    } else {
        crate_dir.join("Cargo.toml")
    };
    if !manifest.is_file() {
        bail!(
            "{} is not a circuit: no Cargo.toml (a Rust crate) and no circuit.py (a Python circuit)",
            crate_dir.display()
        );
    }
    let manifest = manifest
        .canonicalize()
        .with_context(|| manifest.display().to_string())?;
    let dir = manifest.parent().unwrap_or(Path::new("."));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir)
        .args([
            "build",
            "--release",
            "--target",
            TARGET,
            "--message-format=json-render-diagnostics",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    if let Some(t) = target_dir {
        cmd.arg("--target-dir").arg(t);
    }
    let mut child = cmd.spawn().context("cannot run cargo")?;
    let stdout = child.stdout.take().context("cargo has no stdout")?;
    let mut wasm = None;
    for message in Message::parse_stream(BufReader::new(stdout)) {
        let message = message.context("reading cargo's output")?;
        if let Message::CompilerArtifact(a) = message
            && a.manifest_path.as_std_path() == manifest
            && let Some(f) = a.filenames.iter().find(|f| f.extension() == Some("wasm"))
        {
            wasm = Some(f.clone().into_std_path_buf());
        }
    }
    let status = child.wait().context("waiting for cargo")?;
    if !status.success() {
        bail!(
            "cargo build of {} for {TARGET} failed ({status}); see its messages above \
             (is the target installed? `rustup target add {TARGET}`)",
            manifest.display()
        );
    }
    wasm.with_context(|| {
        format!(
            "{} built no .wasm: a circuit crate needs `[lib] crate-type = [\"cdylib\"]`",
            manifest.display()
        )
    })
}
