//! The documentation check: every relative link in the Markdown docs (README.md, ARCHITECTURE.md,
//! CONTRIBUTING.md, CHANGELOG.md, docs/src/**/*.md) resolves to a file (and, for `file.md#anchor`,
//! to a heading of that file), and every `leasehold …` command line in their code blocks names
//! subcommands and options the `leasehold` binary has (learned from its own `--help`).
//!
//! No network: the binary is only asked for `--help`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Markdown files at the repository's root that must exist and are checked.
const ROOT_DOCS: [&str; 4] = [
    "README.md",
    "ARCHITECTURE.md",
    "CONTRIBUTING.md",
    "CHANGELOG.md",
];

/// The languages of code blocks whose lines are shell commands (and their output).
const SHELL_BLOCKS: [&str; 7] = ["", "sh", "bash", "shell", "console", "text", "sh-session"];

/// Words of a development log, which user pages must not contain (history goes in CHANGELOG.md).
const LOG_WORDS: [&str; 5] = [
    "this round",
    "round of work",
    "the round after",
    "earlier rounds",
    "the run before",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// A Markdown file, split into prose and code-block lines (1-based line numbers).
struct Doc {
    /// The path relative to the repository root, for messages.
    name: String,
    path: PathBuf,
    prose: Vec<(usize, String)>,
    code: Vec<(usize, String)>,
    /// The code lines of blocks that hold shell commands (no language, or sh, bash, console, text).
    shell: Vec<(usize, String)>,
}

impl Doc {
    fn read(root: &Path, path: PathBuf) -> Doc {
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        let name = path
            .strip_prefix(root)
            .unwrap_or(&path)
            .display()
            .to_string();
        let (mut prose, mut code, mut shell) = (Vec::new(), Vec::new(), Vec::new());
        // The open fence: its character, its length, and whether its block holds shell commands.
        let mut fence: Option<(char, usize, bool)> = None;
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            let trimmed = line.trim_start();
            let run = |c: char| trimmed.chars().take_while(|&x| x == c).count();
            match fence {
                None => {
                    let c = if trimmed.starts_with("```") {
                        Some('`')
                    } else if trimmed.starts_with("~~~") {
                        Some('~')
                    } else {
                        None
                    };
                    match c {
                        Some(c) => {
                            let lang = trimmed.trim_start_matches(c).trim();
                            let lang = lang.split([' ', ',', '{']).next().unwrap_or("");
                            fence = Some((c, run(c), SHELL_BLOCKS.contains(&lang)));
                        }
                        None => prose.push((n, line.to_owned())),
                    }
                }
                Some((c, len, is_shell)) => {
                    if run(c) >= len && trimmed.trim_start_matches(c).trim().is_empty() {
                        fence = None;
                    } else {
                        code.push((n, line.to_owned()));
                        if is_shell {
                            shell.push((n, line.to_owned()));
                        }
                    }
                }
            }
        }
        Doc {
            name,
            path,
            prose,
            code,
            shell,
        }
    }

    /// The anchors of this file's headings, as GitHub and mdBook make them.
    fn anchors(&self) -> HashSet<String> {
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut out = HashSet::new();
        for (_, line) in &self.prose {
            let Some(title) = heading(line) else { continue };
            let slug = slug(title);
            let count = seen.entry(slug.clone()).or_insert(0);
            if *count == 0 {
                out.insert(slug);
            } else {
                out.insert(format!("{slug}-{count}"));
            }
            *count += 1;
        }
        out
    }
}

/// The title of an ATX heading (`## Title`), if the line is one.
fn heading(line: &str) -> Option<&str> {
    let hashes = line.chars().take_while(|&c| c == '#').count();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let rest = &line[hashes..];
    if !rest.starts_with(' ') {
        return None;
    }
    Some(rest.trim().trim_end_matches('#').trim())
}

/// A heading's anchor: lower case, letters, digits, `-` and `_` kept, spaces made `-`, the rest
/// dropped.
fn slug(title: &str) -> String {
    title
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The line with its inline code spans' contents removed (their backticks kept), so that
/// `[a](b)` inside backticks is not taken for a link.
fn strip_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        let closing = "`".repeat(ticks);
        match after.find(&closing) {
            Some(end) => {
                out.push_str("``");
                rest = &after[end + ticks..];
            }
            None => {
                out.push_str(&rest[start..start + ticks]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The link targets on a prose line: inline links `[text](target "title")` and reference
/// definitions `[label]: target`.
fn link_targets(line: &str) -> Vec<String> {
    let line = strip_code_spans(line);
    let mut out = Vec::new();
    let trimmed = line.trim_start();
    if trimmed.starts_with('[') {
        if let Some(i) = trimmed.find("]: ") {
            if let Some(t) = trimmed[i + 3..].split_whitespace().next() {
                out.push(t.to_owned());
            }
        }
    }
    let mut rest = line.as_str();
    while let Some(i) = rest.find("](") {
        let after = &rest[i + 2..];
        let end = after.find(')').unwrap_or(after.len());
        let target = after[..end].split_whitespace().next().unwrap_or("");
        out.push(
            target
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_owned(),
        );
        rest = &after[end..];
    }
    out
}

/// Every checked Markdown file.
fn docs(root: &Path) -> Vec<Doc> {
    let mut paths: Vec<PathBuf> = ROOT_DOCS
        .iter()
        .map(|name| {
            let p = root.join(name);
            assert!(p.is_file(), "{name} is missing at the repository root");
            p
        })
        .collect();
    let mut book = Vec::new();
    collect_md(&root.join("docs/src"), &mut book);
    assert!(
        !book.is_empty(),
        "no Markdown files under docs/src (the mdBook)"
    );
    book.sort();
    paths.extend(book);
    paths.into_iter().map(|p| Doc::read(root, p)).collect()
}

fn collect_md(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            collect_md(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

#[test]
fn relative_links_resolve() {
    let root = root();
    let docs = docs(&root);
    let mut anchors: HashMap<PathBuf, HashSet<String>> = HashMap::new();
    let mut failures = String::new();
    let mut checked = 0;
    for doc in &docs {
        let dir = doc.path.parent().expect("a file's directory");
        for (n, line) in &doc.prose {
            for target in link_targets(line) {
                if target.is_empty()
                    || target.starts_with('#')
                    || target.contains("://")
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                checked += 1;
                let (file, anchor) = match target.split_once('#') {
                    Some((f, a)) => (f, Some(a)),
                    None => (target.as_str(), None),
                };
                let path = dir.join(file);
                if !path.exists() {
                    let _ = writeln!(
                        failures,
                        "{}:{n}: link to {target}: {} does not exist",
                        doc.name,
                        path.display()
                    );
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if path.extension().is_none_or(|e| e != "md") {
                    continue;
                }
                let path = path.canonicalize().expect("an existing path");
                let known = anchors
                    .entry(path.clone())
                    .or_insert_with(|| Doc::read(&root, path.clone()).anchors());
                if !known.contains(anchor) {
                    let _ = writeln!(
                        failures,
                        "{}:{n}: link to {target}: {file} has no heading with anchor #{anchor}",
                        doc.name
                    );
                }
            }
        }
    }
    assert!(failures.is_empty(), "broken links in the docs:\n{failures}");
    assert!(
        checked > 20,
        "only {checked} relative links found: is the link parser broken?"
    );
}

/// What `leasehold [PATH…] --help` says.
struct Help {
    ok: bool,
    text: String,
    subcommands: HashSet<String>,
    /// Long options, and whether each takes a value.
    options: HashMap<String, bool>,
}

impl Help {
    fn of(path: &[String]) -> Help {
        let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(path)
            .arg("--help")
            .env_remove("LEASEHOLD_STORE")
            .env_remove("LEASEHOLD_QUEUE")
            .output()
            .expect("run leasehold --help");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let mut help = Help {
            ok: out.status.success(),
            text: format!("{text}{}", String::from_utf8_lossy(&out.stderr)),
            subcommands: HashSet::new(),
            options: HashMap::new(),
        };
        let mut section = "";
        for line in text.lines() {
            let indent = line.len() - line.trim_start().len();
            if indent == 0 && line.ends_with(':') {
                section = line;
                continue;
            }
            match section {
                "Commands:" if indent == 2 => {
                    if let Some(name) = line.split_whitespace().next() {
                        help.subcommands.insert(name.to_owned());
                    }
                }
                "Options:" if indent < 8 && line.trim_start().starts_with('-') => {
                    // The option's head, before its description (two spaces apart).
                    let head = line.trim_start().split("  ").next().unwrap_or("");
                    for word in head.split([' ', ',']) {
                        if let Some(name) = word.strip_prefix("--") {
                            let name = name.split(['=', '[']).next().unwrap_or(name);
                            help.options.insert(format!("--{name}"), head.contains('<'));
                        }
                    }
                }
                _ => {}
            }
        }
        help
    }
}

/// Splits a shell command line into words: quotes and backslashes as the shell reads them; an
/// unquoted `#` starting a word begins a comment, an unquoted `;`, `|` or `&` ends the command.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        q => word.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            '#' if !in_word => break,
            ';' | '|' | '&' => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The arguments a command line gives `leasehold`, if it runs it: `leasehold ARGS…` (after an
/// optional `$ ` prompt and `NAME=value` assignments), or `cargo run … -p leasehold-cli -- ARGS…`.
fn leasehold_args(line: &str) -> Option<Vec<String>> {
    let line = line.trim_start();
    let line = line.strip_prefix("$ ").unwrap_or(line);
    let words = shell_words(line);
    let is_assignment = |w: &String| {
        w.split_once('=').is_some_and(|(name, _)| {
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
        })
    };
    let words: Vec<String> = words.into_iter().skip_while(is_assignment).collect();
    match words.first().map(String::as_str) {
        Some("leasehold") => Some(words[1..].to_vec()),
        Some("cargo")
            if words.get(1).is_some_and(|w| w == "run")
                && words.iter().any(|w| w == "leasehold-cli") =>
        {
            let dashes = words.iter().position(|w| w == "--")?;
            Some(words[dashes + 1..].to_vec())
        }
        _ => None,
    }
}

/// A placeholder in a synopsis (`<command>`, `[options]`, `…`), not a word to check.
fn placeholder(word: &str) -> bool {
    word.starts_with('<') || word.starts_with('[') || word.contains('…')
}

/// Checks one invocation's words against the binary's help; returns what is wrong, if anything.
fn check_invocation(args: &[String], helps: &mut HashMap<Vec<String>, Help>) -> Option<String> {
    let mut path: Vec<String> = Vec::new();
    let mut positional = false;
    let mut words = args.iter();
    while let Some(word) = words.next() {
        let help = helps.entry(path.clone()).or_insert_with(|| Help::of(&path));
        if !help.ok {
            return Some(format!(
                "`leasehold {} --help` failed:\n{}",
                path.join(" "),
                help.text
            ));
        }
        if word == "--" {
            break;
        }
        if let Some(option) = word.strip_prefix("--").filter(|o| !o.is_empty()) {
            let name = format!("--{}", option.split('=').next().unwrap_or(option));
            // Options of this level or of one above it (global options are shown at every level).
            let takes_value = (0..=path.len())
                .rev()
                .find_map(|depth| helps.get(&path[..depth])?.options.get(&name).copied());
            match takes_value {
                Some(true) if !option.contains('=') => {
                    words.next();
                }
                Some(_) => {}
                None => {
                    return Some(format!(
                        "`leasehold {}` has no option {name}",
                        path.join(" ")
                    ))
                }
            }
            continue;
        }
        if word.starts_with('-') || placeholder(word) {
            // A short option (-h), or a placeholder: nothing more to learn from the words.
            if placeholder(word) {
                positional = true;
            }
            continue;
        }
        if positional || help.subcommands.is_empty() {
            positional = true;
            continue;
        }
        if help.subcommands.contains(word) {
            path.push(word.clone());
        } else {
            let mut known: Vec<&str> = help.subcommands.iter().map(String::as_str).collect();
            known.sort_unstable();
            return Some(format!(
                "`leasehold {}` has no subcommand {word:?} (it has: {})",
                path.join(" "),
                known.join(", ")
            ));
        }
    }
    let help = helps.entry(path.clone()).or_insert_with(|| Help::of(&path));
    (!help.ok).then(|| {
        format!(
            "`leasehold {} --help` failed:\n{}",
            path.join(" "),
            help.text
        )
    })
}

#[test]
fn command_lines_name_real_subcommands_and_options() {
    let root = root();
    let mut helps: HashMap<Vec<String>, Help> = HashMap::new();
    let mut failures = String::new();
    let mut checked = 0;
    for doc in docs(&root) {
        // A line ending in a backslash continues on the next one.
        let mut pending: Option<(usize, String)> = None;
        for (n, line) in &doc.shell {
            let (start, joined) = match pending.take() {
                Some((start, head)) => (start, format!("{head} {}", line.trim_start())),
                None => (*n, line.clone()),
            };
            if let Some(head) = joined.strip_suffix('\\') {
                pending = Some((start, head.to_owned()));
                continue;
            }
            let Some(args) = leasehold_args(&joined) else {
                continue;
            };
            checked += 1;
            if let Some(problem) = check_invocation(&args, &mut helps) {
                let _ = writeln!(
                    failures,
                    "{}:{start}: `{}`: {problem}",
                    doc.name,
                    joined.trim()
                );
            }
        }
    }
    assert!(
        failures.is_empty(),
        "command lines in the docs that leasehold would refuse:\n{failures}"
    );
    assert!(
        checked > 20,
        "only {checked} leasehold command lines found: is the parser broken?"
    );
}

#[test]
fn user_pages_are_no_development_log() {
    let root = root();
    let mut failures = String::new();
    for doc in docs(&root) {
        if doc.name == "CHANGELOG.md" {
            continue;
        }
        for (n, line) in doc.prose.iter().chain(&doc.code) {
            let lower = line.to_lowercase();
            for words in LOG_WORDS {
                if lower.contains(words) {
                    let _ = writeln!(
                        failures,
                        "{}:{n}: {words:?} (history goes in CHANGELOG.md)",
                        doc.name
                    );
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "development-log wording in user docs:\n{failures}"
    );
}

#[test]
fn the_readme_stays_short() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 250,
        "README.md has {lines} lines; keep it to 250 and move details into docs/src"
    );
}

#[test]
fn the_parsers_read_what_they_should() {
    assert_eq!(
        link_targets("see [a](x.md#y) and `[b](not-a-link)` and [c](<z.md> \"t\")"),
        ["x.md#y", "z.md"]
    );
    assert_eq!(link_targets("[ref]: other.md"), ["other.md"]);
    assert_eq!(slug("release --force"), "release---force");
    assert_eq!(
        slug("What runs under a `lost` lease"),
        "what-runs-under-a-lost-lease"
    );
    assert_eq!(
        shell_words(r#"leasehold --store 'a b' run -- sh -c "x \"y\"" # comment"#),
        [
            "leasehold",
            "--store",
            "a b",
            "run",
            "--",
            "sh",
            "-c",
            "x \"y\""
        ]
    );
    assert_eq!(
        leasehold_args("$ LEASEHOLD_LOG=debug leasehold ls --json | head"),
        Some(vec!["ls".to_owned(), "--json".to_owned()])
    );
    assert_eq!(
        leasehold_args("cargo run --release -p leasehold-cli -- run --key k -- true"),
        Some(
            ["run", "--key", "k", "--", "true"]
                .map(String::from)
                .to_vec()
        )
    );
    assert_eq!(leasehold_args("kubectl get leases"), None);
    let mut helps = HashMap::new();
    let words = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    assert_eq!(
        check_invocation(&words("queue work --slots 4"), &mut helps),
        None
    );
    assert_eq!(
        check_invocation(
            &words("--store memory:// inspect some-key --json"),
            &mut helps
        ),
        None
    );
    let wrong = check_invocation(&words("queue get 3"), &mut helps).expect("no such subcommand");
    assert!(wrong.contains("no subcommand \"get\""), "{wrong}");
    let wrong =
        check_invocation(&words("run --colour red -- true"), &mut helps).expect("no such option");
    assert!(wrong.contains("no option --colour"), "{wrong}");
}

/// The contributor docs whose backticked paths must name files of the repository.
const MAP_DOCS: [&str; 2] = ["ARCHITECTURE.md", "CONTRIBUTING.md"];

/// Paths the contributor docs name that tools create (cargo-fuzz's corpus and crash inputs).
const GENERATED: [&str; 2] = ["fuzz/corpus/", "fuzz/artifacts/"];

/// The inline code spans of a prose line.
fn code_spans(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => {
                out.push(after[..end].trim());
                rest = &after[end + ticks..];
            }
            None => break,
        }
    }
    out
}

/// Whether a code span reads as a path in the repository (`crates/…`, `stores/mod.rs`,
/// `docs/`), not a URL, a shell line, a pattern or a Kubernetes field.
fn names_a_path(span: &str) -> bool {
    const EXTENSIONS: [&str; 9] = [
        ".rs", ".md", ".toml", ".py", ".sh", ".lock", ".lua", ".yaml", ".json",
    ];
    const ROOTS: [&str; 6] = ["crates/", "docs/", "scripts/", ".ci/", "./", "fuzz/"];
    if span.is_empty()
        || span
            .chars()
            .any(|c| c.is_whitespace() || "<>…*{}$".contains(c))
        || span.contains("://")
        || span.starts_with('/')
        || span.starts_with('-')
    {
        return false;
    }
    EXTENSIONS.iter().any(|e| span.ends_with(e))
        || (span.ends_with('/') && span.len() > 1)
        || ROOTS.iter().any(|r| span.starts_with(r))
}

/// Every file and directory of the repository (relative, `/`-separated; directories end with
/// `/`), build output and dependencies left out.
fn repository_paths(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if ["target", ".git", "node_modules", "book"].contains(&name.as_str()) {
                continue;
            }
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .into_owned();
            if path.is_dir() {
                out.push(format!("{rel}/"));
                walk(root, &path, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out
}

/// Whether `span` names something in the repository: from its root, or as the tail of a path
/// (whole components: `stores/mod.rs` names `crates/leasehold/src/stores/mod.rs`).
fn exists_in(paths: &[String], span: &str) -> bool {
    let span = span.trim_start_matches("./");
    let as_dir = format!("{}/", span.trim_end_matches('/'));
    paths.iter().any(|p| {
        let matches = |s: &str| p == s || p.ends_with(&format!("/{s}"));
        matches(span) || (!span.ends_with('/') && matches(&as_dir)) || matches(&as_dir)
    })
}

#[test]
fn contributor_docs_name_files_that_exist() {
    let root = root();
    let paths = repository_paths(&root);
    let mut failures = String::new();
    let mut checked = 0;
    for name in MAP_DOCS {
        let doc = Doc::read(&root, root.join(name));
        for (n, line) in &doc.prose {
            for span in code_spans(line) {
                if !names_a_path(span) || GENERATED.iter().any(|g| span.starts_with(g)) {
                    continue;
                }
                checked += 1;
                if !exists_in(&paths, span) {
                    let _ = writeln!(failures, "{name}:{n}: `{span}` names no file or folder");
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "paths in the contributor docs that do not exist:\n{failures}"
    );
    assert!(
        checked > 40,
        "only {checked} paths found in the contributor docs: is the parser broken?"
    );
}
