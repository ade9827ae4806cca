//! The library's modules keep the layers of ARCHITECTURE.md's "Who may use whom" table: no
//! module imports through the crate root (`lib.rs` is only the door), each uses only modules of
//! its own layer or below, and no two modules use each other, directly or around a circle.
//! Test code (`tests.rs`, `tests/`, `#[cfg(test)]` items) may use anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/src");
const ARCHITECTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../ARCHITECTURE.md");

/// The table: module → layer, read from ARCHITECTURE.md.
fn layers() -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(ARCHITECTURE).unwrap_or_default();
    let section = text
        .split("\n## ")
        .find(|s| s.starts_with("Who may use whom"))
        .unwrap_or_default();
    let mut out = BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with("| ")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(Ok(layer)) = cells.get(1).map(|c| c.parse::<usize>()) else {
            continue;
        };
        for m in cells.get(3).unwrap_or(&"").split(',') {
            out.insert(m.trim().trim_matches('`').to_owned(), layer);
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "tests") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// The lines of `source` that are not comments and not test items.
fn code_lines(source: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut lines = source.lines().enumerate().peekable();
    while let Some((n, line)) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t.starts_with("#[cfg(test)]") || t.starts_with("#[cfg(all(test") {
            // Skip the item: to its `;` or to the end of its braces.
            let mut depth = 0i32;
            let mut opened = false;
            for (_, l) in lines.by_ref() {
                let code = l.split("//").next().unwrap_or_default();
                depth += code.matches('{').count() as i32 - code.matches('}').count() as i32;
                opened |= code.contains('{');
                if (opened && depth <= 0) || (!opened && code.trim_end().ends_with(';')) {
                    break;
                }
            }
            continue;
        }
        out.push((n + 1, line));
    }
    out
}

/// The top-level module a file of `src/` belongs to.
fn module_of(path: &Path) -> String {
    let rel = path.strip_prefix(SRC).unwrap_or(path);
    let first = rel
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned());
    first.unwrap_or_default().trim_end_matches(".rs").to_owned()
}

/// `crate::x` paths on a line: the `x`s (a macro's `crate::name!` is not a module).
fn crate_paths(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !rest[name.len()..].starts_with('!') {
            out.push(name);
        }
    }
    out
}

#[test]
fn modules_keep_their_layers_and_import_nothing_through_the_root() {
    let layers = layers();
    assert!(layers.len() > 10, "no table read from {ARCHITECTURE}");
    let mut files = Vec::new();
    rust_files(Path::new(SRC), &mut files);
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for file in &files {
        let module = module_of(file);
        if module == "lib" {
            continue;
        }
        let Some(&layer) = layers.get(&module) else {
            wrong.push(format!("{module}: not in ARCHITECTURE.md's table"));
            continue;
        };
        let source = std::fs::read_to_string(file).unwrap_or_default();
        for (n, line) in code_lines(&source) {
            for used in crate_paths(line) {
                let at = format!("{}:{n}", file.display());
                match layers.get(&used) {
                    _ if used == module => {}
                    None => wrong.push(format!("{at}: crate::{used} goes through the crate root")),
                    Some(&l) if l > layer => wrong.push(format!(
                        "{at}: {module} (layer {layer}) uses {used} (layer {l}) above it"
                    )),
                    Some(_) => {
                        uses.entry(module.clone()).or_default().insert(used);
                    }
                }
            }
        }
    }
    // No circle: a depth-first walk never meets a module still on its path.
    fn walk<'a>(
        m: &'a str,
        uses: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
        wrong: &mut Vec<String>,
    ) {
        if let Some(i) = path.iter().position(|p| *p == m) {
            wrong.push(format!("a circle: {} → {m}", path[i..].join(" → ")));
            return;
        }
        if !done.insert(m) {
            return;
        }
        path.push(m);
        for next in uses.get(m).into_iter().flatten() {
            walk(next, uses, path, done, wrong);
        }
        path.pop();
    }
    let mut done = BTreeSet::new();
    for m in uses.keys() {
        walk(m, &uses, &mut Vec::new(), &mut done, &mut wrong);
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_checks_see_what_they_look_for() {
    assert_eq!(
        crate_paths("use crate::error::{Error, Result}; x(crate::Locks)"),
        ["error", "Locks"]
    );
    assert!(crate_paths("crate::conformance_tests!(x); $crate::key::Key").is_empty());
    let code = code_lines(
        "use crate::a;\n#[cfg(test)]\nmod tests {\n  use crate::b;\n}\n// crate::c\nuse crate::d;",
    );
    let kept: Vec<&str> = code.iter().map(|(_, l)| *l).collect();
    assert_eq!(kept, ["use crate::a;", "use crate::d;"]);
}
