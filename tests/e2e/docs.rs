//! The documentation's commands against the real CLI (issue #26): every
//! `sluice …` and `cargo run -p sluice -- …` in a shell block of README.md
//! and docs/tutorial.md must parse as the `sluice` binary parses it (clap,
//! through the crate's own `Cli`), with the file, line and command named
//! when it does not; every flag their prose names must exist; and the
//! commands that can run here in seconds run for real: the README's
//! tutorial (write, build, run, then `sluice verify` and `sluice read` from
//! "Checking exactly-once yourself" on its data), the tutorial's "Building
//! and running" block, the README's Nexmark block (on fewer events) and its
//! multi-tenant session against a test server. The commands that need
//! Kafka, an object store or etcd at the docs' addresses, or run until
//! stopped (`sluice host`, `sluice serve`), are parsed only. The shell
//! reading is in `support/docs.rs`.

use crate::support::docs::{self, Invocation};
use crate::support::server::{ADMIN, Server};
use crate::support::{cache_dir, component, repo, scratch, sluice};
use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches};
use sluice::cli::Cli;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// The documents whose commands are checked.
const DOCS: [&str; 2] = ["README.md", "docs/tutorial.md"];

/// Flags the prose names that belong to other programs: `scripts/setup.sh
/// --tests` and `--python`, cargo's `--no-default-features`.
const NOT_SLUICE_FLAGS: [&str; 3] = ["--tests", "--python", "--no-default-features"];

fn read(file: &str) -> String {
    std::fs::read_to_string(repo().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Whether a word stands for arguments the docs leave out (`… --kafka-config
/// sasl.mechanism=PLAIN …`): it is left out of the parse, and what remains
/// must parse alone.
fn is_elision(word: &str) -> bool {
    word == "…" || word == "..."
}

/// The CLI as clap builds it, reading no environment variable: the
/// environment a documented command gets is the docs' own (see [`parse`]),
/// not the test's (CI sets `SLUICE_KAFKA_BROKERS`, a developer may have
/// `SLUICE_TOKEN`).
fn cli_without_env() -> clap::Command {
    fn strip(c: clap::Command) -> clap::Command {
        c.mut_args(|a| a.env(None::<&str>)).mut_subcommands(strip)
    }
    strip(Cli::command())
}

/// Parses `args` as the `sluice` binary does, in the environment `env`:
/// each variable a flag reads stands for that flag (placed right after
/// the subcommand it belongs to), unless the flag is given. Err: clap's
/// message.
fn parse(args: &[String], env: &BTreeMap<String, String>) -> Result<(), String> {
    let given: Vec<String> = args.iter().filter(|a| !is_elision(a)).cloned().collect();
    let cli = Cli::command();
    // Each (sub)command on the line, and where its own arguments start.
    let mut levels = vec![(&cli, 0)];
    for (i, a) in given.iter().enumerate() {
        if a.starts_with('-') {
            continue;
        }
        match levels.last().unwrap().0.find_subcommand(a) {
            Some(sub) => levels.push((sub, i + 1)),
            None => break,
        }
    }
    let mut args = given.clone();
    for (cmd, at) in levels.iter().rev() {
        for arg in cmd.get_arguments() {
            let (Some(var), Some(long)) = (arg.get_env(), arg.get_long()) else {
                continue;
            };
            let Some(value) = var.to_str().and_then(|v| env.get(v)) else {
                continue;
            };
            let flag = format!("--{long}");
            if !given
                .iter()
                .any(|a| *a == flag || a.starts_with(&format!("{flag}=")))
            {
                args.insert(*at, format!("{flag}={value}"));
            }
        }
    }
    let argv = std::iter::once("sluice".to_owned()).chain(args);
    match cli_without_env().try_get_matches_from(argv) {
        Ok(matches) => Cli::from_arg_matches(&matches)
            .map(drop)
            .map_err(|e| e.to_string()),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => Ok(()),
        Err(e) => {
            let text = e.render().to_string();
            let message = text.split("\nUsage:").next().unwrap_or(&text);
            Err(message.trim().to_owned())
        }
    }
}

fn indent(text: &str) -> String {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("    {l}\n"))
        .collect()
}

/// Every failing invocation: `FILE:LINE: \`COMMAND\`` and clap's message.
fn failures(invocations: &[Invocation]) -> Vec<String> {
    invocations
        .iter()
        .filter_map(|inv| {
            parse(&inv.args, &inv.env)
                .err()
                .map(|e| format!("{}:{}: `{}`\n{}", inv.file, inv.line, inv.text, indent(&e)))
        })
        .collect()
}

#[test]
fn every_documented_sluice_command_parses() {
    let mut problems = Vec::new();
    let mut found = BTreeMap::new();
    for file in DOCS {
        let survey = docs::survey(file, &read(file));
        problems.extend(failures(&survey.sluice));
        // The scripts they run exist.
        for (program, file, line) in &survey.other {
            if program.starts_with("scripts/") && !repo().join(program).is_file() {
                problems.push(format!(
                    "{file}:{line}: `{program}` is not in the repository\n"
                ));
            }
        }
        eprintln!(
            "{file}: {} sluice commands parsed, {} other commands not checked",
            survey.sluice.len(),
            survey.other.len()
        );
        found.insert(file, survey.sluice.len());
    }
    assert!(
        problems.is_empty(),
        "{} documented commands are wrong (fix the docs, or the CLI):\n\n{}",
        problems.len(),
        problems.join("\n")
    );
    // The reading finds them: a reader that found nothing would pass.
    assert!(found["README.md"] >= 30, "{found:?}");
    assert!(found["docs/tutorial.md"] >= 2, "{found:?}");
}

/// Whether `cmd` has a flag `name` (`--name`, `-n`, or an alias); `name*`
/// is any flag that starts so.
fn has_flag(cmd: &clap::Command, name: &str) -> bool {
    let name = name.split('=').next().unwrap_or(name);
    cmd.get_arguments().any(|a| {
        if let Some(long) = name.strip_prefix("--") {
            let names = a
                .get_long()
                .into_iter()
                .chain(a.get_all_aliases().unwrap_or_default());
            names.into_iter().any(|n| match long.strip_suffix('*') {
                Some(prefix) => n.starts_with(prefix),
                None => n == long,
            })
        } else {
            let short = name.strip_prefix('-').and_then(|s| s.chars().next());
            short.is_some() && a.get_short() == short
        }
    })
}

/// Every command of the CLI, built (help flags and globals in place).
fn all_commands(cmd: &clap::Command) -> Vec<&clap::Command> {
    std::iter::once(cmd)
        .chain(cmd.get_subcommands().flat_map(all_commands))
        .collect()
}

/// What is wrong with an inline `sluice …` span: its command does not
/// exist, or a flag is not one of that command's.
fn check_span(cli: &clap::Command, span: &str) -> Option<String> {
    let mut words = span.split_whitespace().skip(1).peekable();
    let mut cmd = cli;
    let mut path = vec!["sluice"];
    while let Some(w) = words.peek() {
        match cmd.find_subcommand(w) {
            Some(sub) => {
                cmd = sub;
                path.push(words.next().unwrap());
            }
            None => break,
        }
    }
    if path.len() == 1 && words.peek().is_some_and(|w| !w.starts_with('-')) {
        return Some(format!("no command `sluice {}`", words.peek().unwrap()));
    }
    let path = path.join(" ");
    words
        .filter(|w| w.starts_with('-') && !is_elision(w))
        .find(|w| !has_flag(cmd, w))
        .map(|w| format!("`{path}` has no flag {w}"))
}

#[test]
fn every_flag_the_prose_names_exists() {
    let mut cli = Cli::command();
    cli.build();
    let commands = all_commands(&cli);
    let mut problems = Vec::new();
    let mut checked = 0;
    for file in DOCS {
        for (line, span) in docs::inline_spans(&docs::prose(&read(file))) {
            let problem = if span.starts_with("sluice ") {
                check_span(&cli, &span)
            } else if span.starts_with("--") && span[2..].starts_with(|c: char| c.is_alphabetic()) {
                let flag = span.split_whitespace().next().unwrap_or(&span);
                let flag = flag.split('=').next().unwrap_or(flag);
                (!NOT_SLUICE_FLAGS.contains(&flag) && !commands.iter().any(|c| has_flag(c, flag)))
                    .then(|| format!("no sluice command has {flag}"))
            } else {
                continue;
            };
            checked += 1;
            if let Some(p) = problem {
                problems.push(format!("{file}:{line}: `{span}`: {p}"));
            }
        }
    }
    eprintln!("{checked} inline sluice commands and flags checked");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(checked >= 40, "only {checked} spans found");
}

/// The reading itself, on a made-up page: continuations, comments,
/// heredocs, `;`, quotes, prefixes and exports — and a wrong flag reported
/// with its file, line and command.
#[test]
fn the_reader_finds_commands_and_reports_a_wrong_flag() {
    let page = r#"
Text with `sluice verify --data /tmp/x`.

   ```sh
   export SLUICE_TOKEN=$(cat token)       # a comment
   cargo run -p sluice -- status wc \
       --json
   SLUICE_SERVER="http://h:1" sluice pause wc; sluice start 'wc'  # sluice --bogus
   cat > in.jsonl <<'EOF'
   sluice --bogus
   EOF
   sluice host w.wasm --listen 127.0.0.1:1 --data d --store file:///s \
       --log kafka
   #   --tls-cert a.pem --tls-key a.key --tls-ca ca.pem
   ```
"#;
    let survey = docs::survey("PAGE.md", page);
    let found: Vec<(usize, Vec<String>)> = survey
        .sluice
        .iter()
        .map(|i| (i.line, i.args.clone()))
        .collect();
    let words = |s: &str| s.split(' ').map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(
        found,
        vec![
            (6, words("status wc --json")),
            (8, words("pause wc")),
            (8, words("start wc")),
            (
                12,
                words("host w.wasm --listen 127.0.0.1:1 --data d --store file:///s --log kafka")
            ),
            (
                14,
                words(
                    "host w.wasm --listen 127.0.0.1:1 --data d --store file:///s --log kafka \
                     --tls-cert a.pem --tls-key a.key --tls-ca ca.pem"
                )
            ),
        ]
    );
    assert_eq!(survey.sluice[0].env["SLUICE_TOKEN"], docs::SUBSTITUTED);
    assert_eq!(survey.sluice[1].env["SLUICE_SERVER"], "http://h:1");
    assert_eq!(
        survey.other.len(),
        1,
        "export is read; cat is another program"
    );
    let failed = failures(&survey.sluice);
    assert_eq!(failed.len(), 2, "{failed:?}");
    assert!(
        failed[0].starts_with("PAGE.md:12: `sluice host w.wasm")
            && failed[0].contains("unexpected argument '--log'"),
        "{}",
        failed[0]
    );
    // Without the exported token, the status command lacks one.
    let mut bare = survey.sluice[0].clone();
    bare.env.clear();
    assert!(
        parse(&bare.args, &bare.env)
            .unwrap_err()
            .contains("--token")
    );
    // A placeholder value passes, a placeholder flag does not.
    let env = BTreeMap::new();
    assert!(parse(&words("tenant --token sl_… rotate NAME"), &env).is_ok());
    // A variable stands for the flag of the (sub)command that reads it.
    let token: BTreeMap<String, String> = [("SLUICE_TOKEN".to_owned(), "t".to_owned())].into();
    assert!(parse(&words("tenant create acme"), &token).is_ok());
    assert!(parse(&words("tenant create acme"), &env).is_err());
    assert!(parse(&words("verify --data /d …"), &env).is_ok());
    assert!(parse(&words("verify --data /d --…"), &env).is_err());
    let mut cli = Cli::command();
    cli.build();
    assert_eq!(check_span(&cli, "sluice chaos --hosts"), None);
    assert_eq!(check_span(&cli, "sluice tenant rotate NAME"), None);
    assert!(check_span(&cli, "sluice host --log kafka").is_some());
    assert!(check_span(&cli, "sluice hosts --data").is_some());
}

/// Runs `script` in bash (`-euo pipefail`) in `cwd`, the `sluice` on its
/// PATH the binary under test; no `SLUICE_*` variable and no Cargo target
/// directory from the test's environment, `env` on top.
fn shell(script: &str, cwd: &Path, bin: &Path, env: &[(&str, String)]) -> Command {
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", script])
        .current_dir(cwd);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SLUICE_") {
            cmd.env_remove(k);
        }
    }
    let path = std::env::var("PATH").unwrap_or_default();
    cmd.env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET_DIR")
        .env("SLUICE_CACHE_DIR", cache_dir())
        .env("PATH", format!("{}:{path}", bin.display()));
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// `word` quoted for bash.
fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// `shell(…).output()`, within 300 s, which must succeed.
fn run_ok(what: &str, script: &str, cwd: &Path, bin: &Path, env: &[(&str, String)]) -> Output {
    let limited = format!("timeout 300 bash -euo pipefail -c {}", quote(script));
    let out = shell(&limited, cwd, bin, env).output().unwrap();
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{script}\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A directory with `sluice`, the binary under test.
fn bin_dir(under: &Path) -> PathBuf {
    let bin = under.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(sluice(), bin.join("sluice")).unwrap();
    bin
}

/// Writes `path` only when its content differs (an unchanged source keeps
/// its build fresh), atomically (another test run may read it).
fn write_if_changed(path: &Path, content: &[u8]) {
    if std::fs::read(path).is_ok_and(|c| c == content) {
        return;
    }
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, content).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// Makes `link` a symbolic link to `to` (atomically, if it is not one yet).
fn link(to: &Path, link: &Path) {
    if std::fs::read_link(link).is_ok_and(|l| l == to) {
        return;
    }
    let tmp = link.with_extension(format!("tmp{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(to, &tmp).unwrap();
    std::fs::rename(&tmp, link)
        .unwrap_or_else(|e| panic!("cannot make {} a link: {e}", link.display()));
}

/// The README block in `lang` that holds `needle`.
fn readme_block<'a>(blocks: &'a [docs::Block], lang: &str, needle: &str) -> &'a docs::Block {
    blocks
        .iter()
        .find(|b| b.lang == lang && b.text().contains(needle))
        .unwrap_or_else(|| panic!("README.md has no {lang} block with {needle:?}"))
}

/// A README command as a test runs it: `sluice` for `cargo run -p sluice
/// --`, and the test's `data` for the README's data directory `tmp`.
fn as_run_here(script: String, tmp: &str, data: &Path) -> String {
    script
        .replace("cargo run -p sluice --", "sluice")
        .replace(tmp, data.to_str().unwrap())
}

/// Runs a README build command in `checkout`: the component path it
/// printed last.
fn built(what: &str, script: &str, checkout: &Path, bin: &Path) -> PathBuf {
    let out = run_ok(what, script, checkout, bin, &[]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    PathBuf::from(stdout.lines().last().unwrap_or(""))
}

/// Integrates an output file of JSON lines (`{"insert": v}` / `{"delete":
/// v}`, an optional `"weight"`): each value's JSON → its weight.
fn integrate(path: &Path) -> BTreeMap<String, i64> {
    let mut z = BTreeMap::new();
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        let weight = v["weight"].as_i64().unwrap_or(1);
        let (value, sign) = match (v.get("insert"), v.get("delete")) {
            (Some(x), None) => (x, 1),
            (None, Some(x)) => (x, -1),
            _ => panic!("{}: not an insert or a delete: {line}", path.display()),
        };
        *z.entry(value.to_string()).or_insert(0) += sign * weight;
    }
    z.retain(|_, w| *w != 0);
    z
}

/// Where the README's tutorial crate lives between runs (its build stays
/// fresh): the layout the README assumes, `sluice/` (this repository) and
/// `evens/` side by side, outside any Cargo workspace (so in the system's
/// temporary directory: the test scratch may be under this workspace's
/// `target/`), its build in the tests' guest target directory.
fn tutorial_home() -> PathBuf {
    use std::hash::{Hash, Hasher};
    let repo = repo().canonicalize().unwrap();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (&repo, scratch()).hash(&mut h);
    let home = std::env::temp_dir().join(format!("sluice-readme-tutorial-{:016x}", h.finish()));
    std::fs::create_dir_all(home.join("evens")).unwrap();
    link(&repo, &home.join("sluice"));
    let target = cache_dir().join("guest-target");
    std::fs::create_dir_all(&target).unwrap();
    link(&target, &home.join("evens/target"));
    // The versions this repository is tested with (and no index lookup).
    let lock = home.join("evens/Cargo.lock");
    if !lock.exists() {
        write_if_changed(&lock, &std::fs::read(repo.join("Cargo.lock")).unwrap());
    }
    home
}

#[test]
fn the_readme_tutorial_runs() {
    let readme = read("README.md");
    let blocks = docs::fenced_blocks(&readme);
    let block = |lang: &str, needle: &str| readme_block(&blocks, lang, needle);
    // 1. Write: the crate, as the README shows it.
    let home = tutorial_home();
    let manifest = block("toml", "name = \"evens\"").text();
    write_if_changed(&home.join("evens/Cargo.toml"), manifest.as_bytes());
    let lib = block("rust", "// src/lib.rs").text();
    write_if_changed(&home.join("evens/src/lib.rs"), lib.as_bytes());

    // The README's commands run in the checkout (`cargo run -p sluice --`
    // is `sluice`); here a directory of this test's, next to `evens`. Its
    // data directory is this test's, not /tmp/evens.
    let dir = tempfile::tempdir().unwrap();
    let checkout = dir.path().join("sluice");
    std::fs::create_dir(&checkout).unwrap();
    link(&home.join("evens"), &dir.path().join("evens"));
    let bin = bin_dir(dir.path());
    let data = dir.path().join("evens-data");
    let ours = |script: String| as_run_here(script, "/tmp/evens", &data);

    // 2. Build: prints the component's path last.
    let build = ours(block("sh", "build ../evens").text());
    let wasm = built("the README's build", &build, &checkout, &bin);
    assert!(
        wasm.ends_with("target/wasm32-wasip2/release/evens.wasm") && wasm.is_file(),
        "{}",
        wasm.display()
    );

    // 3. Run: input written by the heredoc, sums in sums.jsonl.
    let run = ours(block("sh", "cat > readings.jsonl").text());
    let out = run_ok("the README's run", &run, &checkout, &bin, &[]);
    let sums = integrate(&checkout.join("sums.jsonl"));
    let expected: BTreeMap<String, i64> = [("[\"a\",4]".to_owned(), 1)].into();
    assert_eq!(sums, expected, "even sums: a 2 + 4 - 2, b's 3 is odd");
    let cat = String::from_utf8_lossy(&out.stdout);
    assert!(
        cat.contains("[\"a\",4]"),
        "`cat sums.jsonl` prints them: {cat}"
    );

    // "Checking exactly-once yourself": verify and read, on this data.
    let check = block("sh", "sluice verify --data /tmp/evens").fence_line;
    let survey = docs::survey("README.md", &readme);
    let mut ran = Vec::new();
    for inv in survey.sluice.iter().filter(|i| i.block == check) {
        if !matches!(inv.args[0].as_str(), "verify" | "read") {
            continue; // chaos: minutes; the crash point: `…`
        }
        let what = format!("README.md:{} `{}`", inv.line, inv.text);
        run_ok(&what, &ours(inv.text.clone()), &checkout, &bin, &[]);
        ran.push(inv.args[0].clone());
    }
    assert_eq!(ran, ["verify", "read"]);
}

/// README.md's "Circuits in Python", run: the circuit as the README
/// writes it, built with `sluice build` (componentize-py) and run on the
/// tutorial's readings; the server commands after it are parsed only.
#[test]
fn the_readme_python_section_runs() {
    let readme = read("README.md");
    let blocks = docs::fenced_blocks(&readme);
    let block = |lang: &str, needle: &str| readme_block(&blocks, lang, needle);
    let dir = tempfile::tempdir().unwrap();
    let checkout = dir.path().join("sluice");
    std::fs::create_dir_all(checkout.join("evens-py")).unwrap();
    let circuit = block("python", "# evens-py/circuit.py").text();
    std::fs::write(checkout.join("evens-py/circuit.py"), circuit).unwrap();
    std::fs::write(
        checkout.join("readings.jsonl"),
        "{\"sensor\": \"a\", \"value\": 2}\n{\"sensor\": \"a\", \"value\": 4}\n\
         {\"sensor\": \"b\", \"value\": 3}\n{\"delete\": {\"sensor\": \"a\", \"value\": 2}}\n",
    )
    .unwrap();
    let bin = bin_dir(dir.path());
    let data = dir.path().join("evens-py-data");
    let ours = |script: String| as_run_here(script, "/tmp/evens-py", &data);
    let build = ours(block("sh", "build evens-py").text());
    let wasm = built("the README's Python build", &build, &checkout, &bin);
    assert!(
        wasm.ends_with("evens-py/target/python/evens-py.wasm") && checkout.join(&wasm).is_file(),
        "{}",
        wasm.display()
    );
    let run = ours(block("sh", "run evens-py/target/python/evens-py.wasm").text());
    run_ok("the README's Python run", &run, &checkout, &bin, &[]);
    let sums = integrate(&checkout.join("sums.jsonl"));
    let expected: BTreeMap<String, i64> = [("[\"a\",4]".to_owned(), 1)].into();
    assert_eq!(sums, expected, "even sums: a 2 + 4 - 2, b's 3 is odd");
}

#[test]
fn the_tutorials_build_and_run_block_runs() {
    let text = read("docs/tutorial.md");
    let block = docs::fenced_blocks(&text)
        .into_iter()
        .find(|b| b.is_shell() && b.text().contains("sluice build path/to/crate"))
        .expect("docs/tutorial.md: the \"Building and running\" block");
    let lines = docs::command_lines(&block);
    assert_eq!(lines.len(), 2, "build, then run");
    // The circuit the tutorial writes is examples/orders-join (which also
    // names its output); the test cache's build of it is fresh.
    let crate_dir = repo().join("examples/orders-join");
    let expected_wasm = component("examples/orders-join");
    let dir = tempfile::tempdir().unwrap();
    let bin = bin_dir(dir.path());
    let target = [(
        "CARGO_TARGET_DIR",
        cache_dir().join("guest-target").display().to_string(),
    )];
    let build = lines[0]
        .text
        .replace("path/to/crate", crate_dir.to_str().unwrap());
    let out = run_ok("the tutorial's build", &build, dir.path(), &bin, &target);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let wasm = stdout.lines().last().unwrap_or("").to_owned();
    assert_eq!(Path::new(&wasm), expected_wasm, "{stdout}");

    std::fs::write(
        dir.path().join("customers.jsonl"),
        "{\"id\": 1, \"name\": \"ann\", \"region\": \"north\"}\n\
         {\"id\": 2, \"name\": \"bob\", \"region\": \"south\"}\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("orders.jsonl"),
        "{\"id\": 1, \"customer\": 1, \"amount\": 100}\n\
         {\"id\": 2, \"customer\": 2, \"amount\": 50}\n\
         {\"id\": 3, \"customer\": 1, \"amount\": 25}\n",
    )
    .unwrap();
    let data = dir.path().join("p");
    let run = lines[1]
        .text
        .replace("path/to/crate.wasm", &wasm)
        .replace("/tmp/p", data.to_str().unwrap());
    run_ok("the tutorial's run", &run, dir.path(), &bin, &[]);
    let revenue = integrate(&dir.path().join("revenue.jsonl"));
    let expected: BTreeMap<String, i64> = [
        ("{\"region\":\"north\",\"revenue\":125}".to_owned(), 1),
        ("{\"region\":\"south\",\"revenue\":50}".to_owned(), 1),
    ]
    .into();
    assert_eq!(revenue, expected);
}

#[test]
fn the_readme_nexmark_block_runs() {
    let readme = read("README.md");
    let block = docs::fenced_blocks(&readme)
        .into_iter()
        .find(|b| b.is_shell() && b.text().contains("gen nexmark --events"))
        .expect("README.md: the \"Examples and Nexmark\" block");
    // Run from a directory laid out like the checkout: `examples/` is the
    // repository's, `target/` the tests' guest target directory (where
    // `sluice build` puts nexmark-q4, as CARGO_TARGET_DIR). 20 000 events
    // instead of a million (seconds, not minutes); its /tmp/… paths are
    // this test's.
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path().join("sluice");
    std::fs::create_dir(&cwd).unwrap();
    let target = cache_dir().join("guest-target");
    std::fs::create_dir_all(&target).unwrap();
    link(&repo().join("examples"), &cwd.join("examples"));
    link(&target, &cwd.join("target"));
    let tmp = dir.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let script = block
        .text()
        .replace("cargo run -p sluice --", "sluice")
        .replace("--events 1000000", "--events 20000")
        .replace("/tmp/", &format!("{}/", tmp.display()));
    let bin = bin_dir(dir.path());
    let env = [("CARGO_TARGET_DIR", target.display().to_string())];
    run_ok("the README's Nexmark block", &script, &cwd, &bin, &env);
    let averages = integrate(&tmp.join("q4.jsonl"));
    assert!(!averages.is_empty(), "q4 wrote no averages");
    for (value, weight) in &averages {
        // (category, average price), once each.
        let pair: (u64, f64) = serde_json::from_str(value).unwrap();
        assert!(pair.1 > 0.0 && *weight == 1, "{value}: {weight}");
    }
}

/// Runs a documented `… --follow` until its first line: returns it.
fn first_line(script: &str, cwd: &Path, bin: &Path, env: &[(&str, String)]) -> String {
    use std::io::BufRead;
    let mut child = shell(&format!("exec {script}"), cwd, bin, env)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(std::time::Duration::from_secs(60));
    let _ = child.kill();
    let _ = child.wait();
    line.unwrap_or_else(|_| panic!("`{script}` printed nothing in 60 s"))
}

#[test]
fn the_readme_multi_tenant_session_runs() {
    let readme = read("README.md");
    let block = docs::fenced_blocks(&readme)
        .into_iter()
        .find(|b| {
            b.is_shell()
                && b.text()
                    .contains("sluice serve --data /var/lib/sluice --listen")
        })
        .expect("README.md: the \"Running a multi-tenant host\" block");
    let session: Vec<Invocation> = docs::survey("README.md", &readme)
        .sluice
        .into_iter()
        .filter(|i| i.block == block.fence_line)
        .collect();
    // The test's server stands for `sluice serve … &`, with the admin token
    // the block exports; the block runs where its component and input are.
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let cwd = dir.path().join("work");
    let release = cwd.join("target/wasm32-wasip2/release");
    std::fs::create_dir_all(&release).unwrap();
    std::fs::copy(
        component("examples/wordcount"),
        release.join("wordcount.wasm"),
    )
    .unwrap();
    let book: String = (0..20)
        .map(|i| format!("\"it was the best of times {i}\"\n"))
        .collect();
    std::fs::write(cwd.join("book.jsonl"), book).unwrap();
    let bin = bin_dir(dir.path());
    let mut env = vec![
        ("SLUICE_SERVER", server.url.clone()),
        ("SLUICE_ADMIN_TOKEN", ADMIN.to_owned()),
    ];
    let mut ran = Vec::new();
    for inv in &session {
        let what = format!("README.md:{} `{}`", inv.line, inv.text);
        let sub = inv.args[0].as_str();
        if sub == "serve" {
            continue;
        }
        if inv.args.iter().any(|a| a == "--follow" || a == "-f") {
            let line = first_line(&inv.text, &cwd, &bin, &env);
            assert!(line.contains("\"position\""), "{what}: {line}");
        } else {
            let out = run_ok(&what, &inv.text, &cwd, &bin, &env);
            if inv.args.len() > 1 && inv.args[..2] == ["tenant", "create"] {
                // `export SLUICE_TOKEN=sl_…   # acme's token`
                let stdout = String::from_utf8(out.stdout).unwrap();
                let token = stdout
                    .lines()
                    .find_map(|l| l.strip_prefix("token: "))
                    .unwrap_or_else(|| panic!("{what} printed no token: {stdout}"));
                env.push(("SLUICE_TOKEN", token.to_owned()));
            }
        }
        ran.push(sub.to_owned());
    }
    assert_eq!(
        ran,
        [
            "tenant",
            "tenant",
            "deploy",
            "push",
            "tail",
            "pipelines",
            "status",
            "pause",
            "start",
            "stop",
            "delete"
        ]
    );
}
