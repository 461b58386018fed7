//! `sluice build` of a Python circuit: componentize-py turns the circuit's
//! module, the Python SDK and the project's WIT world into a component.
//!
//! A directory is a Python circuit when it has a `circuit.py`, or a
//! `pyproject.toml` naming the module (`[tool.sluice] module = "…"`) and no
//! `Cargo.toml`. The SDK (`guest-sdk/python/sluice`) and the WIT files are
//! part of this binary, written out next to the build, so a build needs
//! only componentize-py ([`componentize_py`] says where it is looked for).
//! A build whose inputs (the project's `.py` files, the SDK, the WIT, the
//! componentize-py version) are unchanged reuses the component it made.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The componentize-py version the setup script installs and builds are
/// made with.
pub const COMPONENTIZE_PY_VERSION: &str = "0.25.1";

/// The Python SDK's files, as built into this binary.
const SDK: [(&str, &str); 8] = [
    (
        "__init__.py",
        include_str!("../../../guest-sdk/python/sluice/__init__.py"),
    ),
    (
        "circuit.py",
        include_str!("../../../guest-sdk/python/sluice/circuit.py"),
    ),
    (
        "component.py",
        include_str!("../../../guest-sdk/python/sluice/component.py"),
    ),
    (
        "errors.py",
        include_str!("../../../guest-sdk/python/sluice/errors.py"),
    ),
    (
        "operators.py",
        include_str!("../../../guest-sdk/python/sluice/operators.py"),
    ),
    (
        "shard.py",
        include_str!("../../../guest-sdk/python/sluice/shard.py"),
    ),
    (
        "testing.py",
        include_str!("../../../guest-sdk/python/sluice/testing.py"),
    ),
    (
        "values.py",
        include_str!("../../../guest-sdk/python/sluice/values.py"),
    ),
];

/// The WIT world circuits implement, as built into this binary.
const WIT: [(&str, &str); 4] = [
    ("types.wit", include_str!("../../../wit/types.wit")),
    ("exchange.wit", include_str!("../../../wit/exchange.wit")),
    ("circuit.wit", include_str!("../../../wit/circuit.wit")),
    ("worlds.wit", include_str!("../../../wit/worlds.wit")),
];

/// The module of the Python circuit in `dir`, if `dir` holds one: the
/// `module` of `pyproject.toml`'s `[tool.sluice]`, else `circuit` when
/// `circuit.py` exists. `None`: not a Python circuit.
pub fn circuit_module(dir: &Path) -> Result<Option<String>> {
    if !dir.is_dir() || dir.join("Cargo.toml").is_file() {
        return Ok(None);
    }
    let pyproject = dir.join("pyproject.toml");
    if pyproject.is_file() {
        let text = std::fs::read_to_string(&pyproject)
            .with_context(|| format!("reading {}", pyproject.display()))?;
        if let Some(module) = tool_sluice_module(&text) {
            if !module
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_')
                || module.is_empty()
            {
                bail!(
                    "{}: [tool.sluice] module {module:?} is not a Python module name",
                    pyproject.display()
                );
            }
            if !dir.join(format!("{module}.py")).is_file() {
                bail!(
                    "{}: [tool.sluice] names module {module:?}, but there is no {module}.py",
                    pyproject.display()
                );
            }
            return Ok(Some(module));
        }
    }
    Ok(dir
        .join("circuit.py")
        .is_file()
        .then(|| "circuit".to_owned()))
}

/// `module = "…"` in the `[tool.sluice]` table of a `pyproject.toml`.
fn tool_sluice_module(text: &str) -> Option<String> {
    let mut in_table = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_table = line == "[tool.sluice]";
        } else if in_table
            && let Some((key, value)) = line.split_once('=')
            && key.trim() == "module"
        {
            let value = value.split('#').next().unwrap_or("").trim();
            return Some(value.trim_matches(|c| c == '"' || c == '\'').to_owned());
        }
    }
    None
}

/// Where componentize-py is found: `SLUICE_COMPONENTIZE_PY`, else the
/// virtualenv the setup script fills (`SLUICE_VENV`, by default
/// `~/.cache/sluice/venv`), else `componentize-py` on the `PATH`.
pub fn componentize_py() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SLUICE_COMPONENTIZE_PY") {
        return Ok(PathBuf::from(p));
    }
    let venv = std::env::var_os("SLUICE_VENV")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/sluice/venv")));
    if let Some(p) = venv.map(|v| v.join("bin/componentize-py"))
        && p.is_file()
    {
        return Ok(p);
    }
    let on_path = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("componentize-py"))
            .find(|p| p.is_file())
    });
    on_path.with_context(|| {
        format!(
            "componentize-py is not installed: `scripts/setup.sh --python` installs \
             componentize-py {COMPONENTIZE_PY_VERSION} into ~/.cache/sluice/venv \
             (or set SLUICE_COMPONENTIZE_PY to one)"
        )
    })
}

/// Builds the Python circuit `module` in `dir` into a component under
/// `target_dir` (default `dir/target`) and returns its path.
pub fn build(dir: &Path, module: &str, target_dir: Option<&Path>) -> Result<PathBuf> {
    let dir = dir
        .canonicalize()
        .with_context(|| dir.display().to_string())?;
    let out_dir = target_dir
        .map(Path::to_owned)
        .unwrap_or_else(|| dir.join("target"))
        .join("python");
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(module)
        .to_owned();
    let wasm = out_dir.join(format!("{name}.wasm"));
    let stamp = out_dir.join(format!("{name}.inputs"));
    let tool = componentize_py()?;
    let inputs = inputs_digest(&dir, &tool)?;
    if wasm.is_file() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&inputs) {
        eprintln!("sluice build: {name} unchanged, reusing {}", wasm.display());
        return Ok(wasm);
    }
    // The SDK and the WIT, as this binary knows them, beside the build.
    let support = out_dir.join(format!("{name}.support"));
    let _ = std::fs::remove_dir_all(&support);
    for (file, text) in SDK {
        write(&support.join("sluice").join(file), text)?;
    }
    for (file, text) in WIT {
        write(&support.join("wit").join(file), text)?;
    }
    eprintln!(
        "sluice build: componentize-py {} (CPython and the circuit in one component, ~20 s)",
        dir.display()
    );
    let partial = out_dir.join(format!("{name}.wasm.partial"));
    let status = Command::new(&tool)
        .arg("-d")
        .arg(support.join("wit"))
        .args(["-w", "pipeline-worker", "componentize"])
        .arg("-p")
        .arg(&dir)
        .arg("-p")
        .arg(&support)
        .arg(module)
        .arg("-o")
        .arg(&partial)
        .current_dir(&dir)
        .status()
        .with_context(|| format!("running {}", tool.display()))?;
    if !status.success() {
        bail!(
            "componentize-py could not build {} ({status}); see its messages above",
            dir.join(format!("{module}.py")).display()
        );
    }
    std::fs::rename(&partial, &wasm).with_context(|| wasm.display().to_string())?;
    std::fs::write(&stamp, inputs).with_context(|| stamp.display().to_string())?;
    Ok(wasm)
}

fn write(path: &Path, text: &str) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| parent.display().to_string())?;
    }
    std::fs::write(path, text).with_context(|| path.display().to_string())
}

/// A digest of what a build reads: the project's `.py` files (not under
/// `target/` or hidden directories), the SDK, the WIT, and componentize-py
/// itself (its path and size).
fn inputs_digest(dir: &Path, tool: &Path) -> Result<String> {
    use std::hash::{Hash, Hasher};
    let mut files = Vec::new();
    collect_py(dir, dir, &mut files)?;
    files.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (rel, bytes) in &files {
        rel.hash(&mut h);
        bytes.hash(&mut h);
    }
    SDK.hash(&mut h);
    WIT.hash(&mut h);
    tool.hash(&mut h);
    std::fs::metadata(tool)
        .map(|m| m.len())
        .unwrap_or(0)
        .hash(&mut h);
    COMPONENTIZE_PY_VERSION.hash(&mut h);
    Ok(format!("{:016x}\n", h.finish()))
}

fn collect_py(root: &Path, dir: &Path, out: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let entry = entry?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if entry.file_type()?.is_dir() {
            if !name.starts_with('.') && name != "target" && name != "__pycache__" {
                collect_py(root, &path, out)?;
            }
        } else if name.ends_with(".py") || name == "pyproject.toml" {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            out.push((rel.display().to_string(), std::fs::read(&path)?));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_a_python_circuit_by_its_files() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(circuit_module(d.path()).unwrap(), None);
        std::fs::write(d.path().join("circuit.py"), "").unwrap();
        assert_eq!(
            circuit_module(d.path()).unwrap().as_deref(),
            Some("circuit")
        );
        std::fs::write(
            d.path().join("pyproject.toml"),
            "[project]\nname = \"x\"\n[tool.sluice]\nmodule = \"app\" # the circuit\n",
        )
        .unwrap();
        let err = circuit_module(d.path()).unwrap_err().to_string();
        assert!(err.contains("no app.py"), "{err}");
        std::fs::write(d.path().join("app.py"), "").unwrap();
        assert_eq!(circuit_module(d.path()).unwrap().as_deref(), Some("app"));
        std::fs::write(d.path().join("Cargo.toml"), "").unwrap();
        assert_eq!(circuit_module(d.path()).unwrap(), None, "a crate is Rust");
    }

    #[test]
    fn the_sdk_built_in_is_the_one_in_the_tree() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest-sdk/python/sluice");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".py"))
            .collect();
        on_disk.sort();
        let mut built_in: Vec<String> = SDK.iter().map(|(n, _)| n.to_string()).collect();
        built_in.sort();
        assert_eq!(on_disk, built_in, "every SDK file is built in");
    }
}
