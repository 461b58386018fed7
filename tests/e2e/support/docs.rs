//! The commands in the documentation, read the way a shell reads them —
//! as much of it as the docs use: fenced `sh`/`bash`/`shell`/`console`
//! blocks, `\` continuations, comments, heredoc bodies, `;`, `&&`, `||`,
//! `|` and `&`, quotes, `$VAR` / `${VAR}`, `$(…)` (a placeholder value),
//! redirections, `VAR=value` prefixes and `export`. `tests/e2e/docs.rs`
//! checks every `sluice …` (or `cargo run -p sluice -- …`) found here
//! against the real CLI.

use std::collections::BTreeMap;

/// What `$(…)` expands to: the docs' command substitutions (`$(openssl rand
/// -hex 24)`) make values, never flags.
pub const SUBSTITUTED: &str = "x";

/// A fenced code block.
pub struct Block {
    /// Its info string's first word (`sh`, `toml`, …).
    pub lang: String,
    /// 1-based line of the opening fence.
    pub fence_line: usize,
    /// The content lines with their 1-based numbers, the fence's
    /// indentation removed.
    pub lines: Vec<(usize, String)>,
}

impl Block {
    /// The content as one text.
    pub fn text(&self) -> String {
        self.lines.iter().map(|(_, l)| format!("{l}\n")).collect()
    }

    /// Whether a shell reads it.
    pub fn is_shell(&self) -> bool {
        matches!(self.lang.as_str(), "sh" | "bash" | "shell" | "console")
    }
}

fn fence(t: &str) -> Option<(char, usize)> {
    let c = t.chars().next().filter(|c| *c == '`' || *c == '~')?;
    let n = t.chars().take_while(|x| *x == c).count();
    (n >= 3).then_some((c, n))
}

/// The fenced code blocks of a markdown text.
pub fn fenced_blocks(text: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<((char, usize), usize, Block)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut open {
            None => {
                if let Some(f) = fence(trimmed) {
                    let lang = trimmed[f.1..].split_whitespace().next().unwrap_or("");
                    let block = Block {
                        lang: lang.to_owned(),
                        fence_line: i + 1,
                        lines: Vec::new(),
                    };
                    open = Some((f, indent, block));
                }
            }
            Some(((c, n), fence_indent, block)) => {
                let closes = fence(trimmed).is_some_and(|(c2, n2)| c2 == *c && n2 >= *n)
                    && trimmed.trim_end().chars().all(|x| x == *c);
                if closes {
                    blocks.push(open.take().unwrap().2);
                } else {
                    block
                        .lines
                        .push((i + 1, line[indent.min(*fence_indent)..].to_owned()));
                }
            }
        }
    }
    blocks
}

/// The markdown text outside fenced blocks, line by line (fenced lines
/// blank, so line numbers stay).
pub fn prose(text: &str) -> String {
    let mut fenced = vec![false; text.lines().count()];
    for b in fenced_blocks(text) {
        for n in b.fence_line..=b.lines.last().map_or(b.fence_line, |l| l.0) + 1 {
            if let Some(f) = fenced.get_mut(n - 1) {
                *f = true;
            }
        }
    }
    text.lines()
        .zip(fenced)
        .map(|(l, f)| if f { "\n".to_owned() } else { format!("{l}\n") })
        .collect()
}

/// The inline code spans of markdown prose, with the line each starts on
/// (a span may run over a line break: it reads as a space).
pub fn inline_spans(prose: &str) -> Vec<(usize, String)> {
    let bytes = prose.as_bytes();
    let mut spans = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < bytes.len() {
        match bytes[i] {
            b'\n' => {
                line += 1;
                i += 1;
            }
            b'`' => {
                let n = bytes[i..].iter().take_while(|b| **b == b'`').count();
                let start = i + n;
                // The closing run: exactly n backticks.
                let mut j = start;
                let mut close = None;
                while j < bytes.len() {
                    if bytes[j] == b'`' {
                        let m = bytes[j..].iter().take_while(|b| **b == b'`').count();
                        if m == n {
                            close = Some(j);
                            break;
                        }
                        j += m;
                    } else {
                        j += 1;
                    }
                }
                match close {
                    Some(j) => {
                        let body = prose[start..j].replace('\n', " ");
                        spans.push((line, body.trim().to_owned()));
                        line += prose[i..j].matches('\n').count();
                        i = j + n;
                    }
                    None => i = start,
                }
            }
            _ => i += 1,
        }
    }
    spans
}

/// A command line of a shell block: continuations joined, comment and
/// heredoc body dropped.
pub struct Line {
    /// 1-based line where it starts.
    pub line: usize,
    /// The command text.
    pub text: String,
    /// A comment that starts with `--`: flags the docs suggest adding to
    /// the command before (`#   --tls-cert h1.pem …`).
    pub suggested_flags: bool,
}

/// Splits a line at a comment (`#` starting a word, outside quotes).
fn split_comment(line: &str) -> (&str, Option<&str>) {
    let (mut single, mut double, mut prev) = (false, false, ' ');
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && prev.is_whitespace() => {
                return (&line[..i], Some(&line[i + 1..]));
            }
            _ => {}
        }
        prev = c;
    }
    (line, None)
}

/// The delimiter of a heredoc the command opens (`<<'JSON'`, `<<EOF`).
fn heredoc_delimiter(cmd: &str) -> Option<String> {
    let at = cmd.find("<<")?;
    if cmd[at + 2..].starts_with('<') {
        return None;
    }
    let rest = cmd[at + 2..].trim_start_matches('-').trim_start();
    let word: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ';' && *c != '&' && *c != '|')
        .filter(|c| *c != '\'' && *c != '"')
        .collect();
    (!word.is_empty()).then_some(word)
}

/// The command lines of a shell block (of a `console` block: those after a
/// `$ ` prompt; the rest is output).
pub fn command_lines(block: &Block) -> Vec<Line> {
    let console = block.lang == "console";
    let mut out = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    let mut heredoc: Option<String> = None;
    for (n, raw) in &block.lines {
        if let Some(end) = &heredoc {
            if raw.trim() == end {
                heredoc = None;
            }
            continue;
        }
        let mut raw = raw.as_str();
        if console && pending.is_none() {
            match raw.trim_start().strip_prefix("$ ") {
                Some(r) => raw = r,
                None => continue,
            }
        }
        let (code, comment) = split_comment(raw);
        if pending.is_none() && code.trim().is_empty() {
            if let Some(c) = comment.map(str::trim).filter(|c| c.starts_with("--")) {
                out.push(Line {
                    line: *n,
                    text: c.to_owned(),
                    suggested_flags: true,
                });
            }
            continue;
        }
        let code = code.trim_end();
        let (code, continued) = match code.strip_suffix('\\') {
            Some(c) => (c, true),
            None => (code, false),
        };
        let entry = pending.get_or_insert_with(|| (*n, String::new()));
        entry.1.push_str(code.trim());
        entry.1.push(' ');
        if !continued {
            let (line, text) = pending.take().unwrap();
            let text = text.trim().to_owned();
            heredoc = heredoc_delimiter(&text);
            out.push(Line {
                line,
                text,
                suggested_flags: false,
            });
        }
    }
    if let Some((line, text)) = pending {
        out.push(Line {
            line,
            text: text.trim().to_owned(),
            suggested_flags: false,
        });
    }
    out
}

/// The simple commands of a command line: split at `;`, `&&`, `||`, `|`
/// and `&` outside quotes and `$(…)`.
pub fn simple_commands(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let (mut single, mut double, mut depth) = (false, false, 0usize);
    let (mut start, mut i) = (0, 0);
    let mut out = Vec::new();
    let cut = |from: usize, to: usize, out: &mut Vec<String>| {
        let piece = text[from..to].trim();
        if !piece.is_empty() {
            out.push(piece.to_owned());
        }
    };
    while i < b.len() {
        let c = b[i];
        let quoted = single || double;
        match c {
            b'\\' if !single => i += 1,
            b'\'' if !double => single = !single,
            b'"' if !single => double = !double,
            b'$' if !single && b.get(i + 1) == Some(&b'(') => {
                depth += 1;
                i += 1;
            }
            b')' if !single && depth > 0 => depth -= 1,
            b';' | b'|' | b'&' if !quoted && depth == 0 => {
                let redirect = c == b'&'
                    && ((i > 0 && matches!(b[i - 1], b'>' | b'<')) || b.get(i + 1) == Some(&b'>'));
                if !redirect {
                    cut(start, i, &mut out);
                    if b.get(i + 1) == Some(&c) && c != b';' {
                        i += 1;
                    }
                    start = i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    cut(start, b.len(), &mut out);
    out
}

/// Expands `$…` at `chars[i]` into `out`; returns the index after it.
fn expand(chars: &[char], i: usize, env: &BTreeMap<String, String>, out: &mut String) -> usize {
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    match chars.get(i + 1) {
        Some('(') => {
            let (mut depth, mut j) = (0usize, i + 1);
            while j < chars.len() {
                match chars[j] {
                    '(' => depth += 1,
                    ')' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                j += 1;
            }
            out.push_str(SUBSTITUTED);
            j + 1
        }
        Some('{') => {
            let end = (i + 2..chars.len())
                .find(|j| chars[*j] == '}')
                .unwrap_or(chars.len());
            let name: String = chars[i + 2..end].iter().collect();
            out.push_str(env.get(&name).map_or("", String::as_str));
            end + 1
        }
        Some(c) if name_char(*c) => {
            let end = (i + 1..chars.len())
                .find(|j| !name_char(chars[*j]))
                .unwrap_or(chars.len());
            let name: String = chars[i + 1..end].iter().collect();
            out.push_str(env.get(&name).map_or("", String::as_str));
            end
        }
        _ => {
            out.push('$');
            i + 1
        }
    }
}

/// The words of a simple command after quote removal and expansion from
/// `env`; redirections (`> file`, `<<'EOF'`, `2>&1`) are dropped.
pub fn words(cmd: &str, env: &BTreeMap<String, String>) -> Vec<String> {
    let chars: Vec<char> = cmd.chars().collect();
    let mut out = Vec::new();
    let (mut cur, mut started, mut quoted, mut redirect_target) =
        (String::new(), false, false, false);
    let mut i = 0;
    let mut finish =
        |cur: &mut String, started: &mut bool, quoted: &mut bool, target: &mut bool| {
            if *started {
                if *target {
                    *target = false;
                } else {
                    out.push(std::mem::take(cur));
                }
            }
            cur.clear();
            *started = false;
            *quoted = false;
        };
    while i < chars.len() {
        match chars[i] {
            c if c.is_whitespace() => {
                finish(&mut cur, &mut started, &mut quoted, &mut redirect_target);
                i += 1;
            }
            '\'' => {
                let end = (i + 1..chars.len())
                    .find(|j| chars[*j] == '\'')
                    .unwrap_or(chars.len());
                cur.extend(&chars[i + 1..end]);
                (started, quoted, i) = (true, true, end + 1);
            }
            '"' => {
                (started, quoted) = (true, true);
                i += 1;
                while i < chars.len() && chars[i] != '"' {
                    match chars[i] {
                        '\\' if matches!(chars.get(i + 1), Some('"' | '\\' | '$' | '`')) => {
                            cur.push(chars[i + 1]);
                            i += 2;
                        }
                        '$' => i = expand(&chars, i, env, &mut cur),
                        c => {
                            cur.push(c);
                            i += 1;
                        }
                    }
                }
                i += 1;
            }
            '\\' => {
                if let Some(c) = chars.get(i + 1) {
                    cur.push(*c);
                }
                started = true;
                i += 2;
            }
            '$' => {
                i = expand(&chars, i, env, &mut cur);
                started |= !cur.is_empty();
            }
            '<' | '>' if !quoted && cur.chars().all(|c| c.is_ascii_digit()) => {
                // A redirection: its operator, then its target word (none
                // after `>&N`).
                cur.clear();
                started = false;
                let mut op = String::new();
                while let Some(c) = chars.get(i).filter(|c| matches!(c, '<' | '>' | '&' | '-')) {
                    op.push(*c);
                    i += 1;
                }
                if op.ends_with('&') && chars.get(i).is_some_and(char::is_ascii_digit) {
                    while chars.get(i).is_some_and(char::is_ascii_digit) {
                        i += 1;
                    }
                } else {
                    redirect_target = true;
                    while chars.get(i).is_some_and(|c| c.is_whitespace()) {
                        i += 1;
                    }
                }
            }
            c => {
                cur.push(c);
                started = true;
                i += 1;
            }
        }
    }
    finish(&mut cur, &mut started, &mut quoted, &mut redirect_target);
    out
}

/// A `NAME=value` word's name and value.
pub fn assignment(word: &str) -> Option<(&str, &str)> {
    let (name, value) = word.split_once('=')?;
    let mut chars = name.chars();
    let first = chars.next()?;
    ((first.is_ascii_alphabetic() || first == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_'))
    .then_some((name, value))
}

/// The arguments a command passes to `sluice`: `sluice ARGS` or `cargo run
/// … -p sluice … -- ARGS`; `None` for any other program.
pub fn sluice_args(program_and_args: &[String]) -> Option<Vec<String>> {
    let (program, args) = program_and_args.split_first()?;
    if program == "sluice" {
        return Some(args.to_vec());
    }
    if program != "cargo" || args.first().map(String::as_str) != Some("run") {
        return None;
    }
    let dashdash = args.iter().position(|a| a == "--");
    let own = &args[..dashdash.unwrap_or(args.len())];
    let is_sluice = own
        .windows(2)
        .any(|w| matches!(w[0].as_str(), "-p" | "--package") && w[1] == "sluice")
        || own
            .iter()
            .any(|a| a == "-psluice" || a == "--package=sluice");
    is_sluice.then(|| dashdash.map_or_else(Vec::new, |d| args[d + 1..].to_vec()))
}

/// A documented `sluice` invocation.
#[derive(Clone, Debug)]
pub struct Invocation {
    /// The markdown file.
    pub file: String,
    /// The line the command starts on.
    pub line: usize,
    /// The simple command as written (continuations joined).
    pub text: String,
    /// The words after `sluice` (after `--` of `cargo run -p sluice`).
    pub args: Vec<String>,
    /// The environment the docs' shell gives it: what was exported before
    /// it (in this file) and its own `NAME=value` prefixes.
    pub env: BTreeMap<String, String>,
    /// The fence line of its block.
    pub block: usize,
}

/// Everything the docs ask a shell to run.
#[derive(Default)]
pub struct Survey {
    /// Every `sluice` invocation, in order.
    pub sluice: Vec<Invocation>,
    /// Other commands (program, file, line), not checked here.
    pub other: Vec<(String, String, usize)>,
}

/// Reads every shell block of the markdown `text` of `file`, in order, as
/// one shell session — in which a variable the page exports anywhere is
/// set from the start (its value the latest export's): a page's blocks are
/// not all in the order a reader runs them (the README's `sluice scale`
/// comes before the section that exports `SLUICE_TOKEN`).
pub fn survey(file: &str, text: &str) -> Survey {
    let (_, exported) = session(file, text, BTreeMap::new());
    session(file, text, exported).0
}

fn session(
    file: &str,
    text: &str,
    mut env: BTreeMap<String, String>,
) -> (Survey, BTreeMap<String, String>) {
    let mut survey = Survey::default();
    for block in fenced_blocks(text).iter().filter(|b| b.is_shell()) {
        let mut last: Option<Invocation> = None;
        for line in command_lines(block) {
            if line.suggested_flags {
                if let Some(prev) = &last {
                    let mut with = prev.clone();
                    with.args.extend(words(&line.text, &prev.env));
                    with.text = format!("{} {}", prev.text, line.text);
                    with.line = line.line;
                    survey.sluice.push(with);
                }
                continue;
            }
            for cmd in simple_commands(&line.text) {
                let w = words(&cmd, &env);
                let prefix = w.iter().take_while(|w| assignment(w).is_some()).count();
                let (assignments, rest) = w.split_at(prefix);
                let assignments: Vec<(String, String)> = assignments
                    .iter()
                    .filter_map(|a| assignment(a))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                if rest.is_empty() {
                    env.extend(assignments);
                    continue;
                }
                if rest[0] == "export" {
                    for (k, v) in rest[1..].iter().filter_map(|a| assignment(a)) {
                        env.insert(k.to_owned(), v.to_owned());
                    }
                    continue;
                }
                match sluice_args(rest) {
                    Some(args) => {
                        let mut own = env.clone();
                        own.extend(assignments);
                        let inv = Invocation {
                            file: file.to_owned(),
                            line: line.line,
                            text: cmd.clone(),
                            args,
                            env: own,
                            block: block.fence_line,
                        };
                        last = Some(inv.clone());
                        survey.sluice.push(inv);
                    }
                    None => survey
                        .other
                        .push((rest[0].clone(), file.to_owned(), line.line)),
                }
            }
        }
    }
    (survey, env)
}
