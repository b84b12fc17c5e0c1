//! The source tree's layout: dependencies between top-level modules point
//! one way (no import cycle), and no source file outgrows one sitting.
//!
//! Read from the code itself: every `crate::NAME` path outside comments,
//! `use crate::{a, b::c}` groups included, is an arrow from the file's
//! top-level module (`src/NAME.rs` or `src/NAME/…`) to `NAME`, or to the
//! crate root (`lib.rs`) when `NAME` is not a module.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A source file longer than this is split along the concerns it holds.
const MAX_FILE_LINES: usize = 520;

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file belongs to (`lib` for `lib.rs`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component").as_os_str().to_string_lossy();
    first.trim_end_matches(".rs").to_owned()
}

/// The code of a file without its comments (line comments, doc comments
/// and block comments); string contents are kept, which is harmless here.
fn code(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("//") {
            rest = after.find('\n').map_or("", |i| &after[i..]);
        } else if let Some(after) = rest.strip_prefix("/*") {
            rest = after.find("*/").map_or("", |i| &after[i + 2..]);
        } else if let Some(after) = ["'\"'", "'\\\"'", "'\\''"].iter().find_map(|q| rest.strip_prefix(q)) {
            // A quote as a char literal opens no string.
            rest = after;
        } else if let Some(after) = rest.strip_prefix('"') {
            // Skip a string literal, so a `//` inside one is not a comment.
            let mut chars = after.char_indices();
            let mut end = after.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => {
                        end = i + 1;
                        break;
                    }
                    _ => {}
                }
            }
            out.push('"');
            rest = &after[end..];
        } else {
            let c = rest.chars().next().expect("non-empty");
            out.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    out
}

/// The first path segments named after each `crate::` in `code`.
fn crate_paths(code: &str) -> Vec<String> {
    let ident = |s: &str| s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect::<String>();
    let mut names = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        // `gateway_crate::` and the like are not this crate.
        if code[..at].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let after = &code[at + "crate::".len()..];
        if let Some(group) = after.strip_prefix('{') {
            // A `use crate::{a::X, b}` group: each top-level item, nested
            // braces skipped.
            let (mut depth, mut item_start) = (0usize, true);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if c.is_whitespace() => {}
                    _ if item_start && depth == 0 => {
                        names.push(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            names.push(ident(after));
        }
    }
    names.into_iter().filter(|n| !n.is_empty()).collect()
}

/// Arrows between top-level modules: module -> (module it uses -> a file
/// that does).
fn graph() -> BTreeMap<String, BTreeMap<String, String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let mut arrows: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for file in &files {
        let from = module_of(&src, file);
        let text = std::fs::read_to_string(file).expect("read source");
        for name in crate_paths(&code(&text)) {
            let to = if modules.contains(&name) { name } else { "lib".to_owned() };
            if to != from {
                let shown = file.strip_prefix(&src).expect("under src").display().to_string();
                arrows.entry(from.clone()).or_default().entry(to).or_insert(shown);
            }
        }
    }
    arrows
}

/// A cycle through `start`'s arrows, if there is one, as a path of modules.
fn cycle(arrows: &BTreeMap<String, BTreeMap<String, String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        arrows: &BTreeMap<String, BTreeMap<String, String>>,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = stack.iter().position(|n| n == node) {
            let mut found = stack[at..].to_vec();
            found.push(node.to_owned());
            return Some(found);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in arrows.get(node).into_iter().flat_map(|m| m.keys()) {
            if let Some(found) = visit(next, arrows, stack, done) {
                return Some(found);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let (mut stack, mut done) = (Vec::new(), BTreeSet::new());
    arrows.keys().find_map(|start| visit(start, arrows, &mut stack, &mut done))
}

#[test]
fn no_import_cycle_between_top_level_modules() {
    let arrows = graph();
    if let Some(found) = cycle(&arrows) {
        let steps: Vec<String> =
            found.windows(2).map(|w| format!("{} -> {} (in src/{})", w[0], w[1], arrows[&w[0]][&w[1]])).collect();
        panic!(
            "an import cycle between top-level modules:\n  {}\nmove the type both sides use down a level",
            steps.join("\n  ")
        );
    }
}

#[test]
fn no_source_file_over_the_limit() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = std::fs::read_to_string(f).expect("read source").lines().count();
            (lines > MAX_FILE_LINES).then(|| format!("{} ({lines} lines)", f.display()))
        })
        .collect();
    assert!(long.is_empty(), "split along their concerns: {}", long.join(", "));
}

/// The reader itself: paths in code count, in comments and strings do not.
#[test]
fn the_reader_finds_crate_paths_in_code_only() {
    let cases: [(&str, &[&str]); 7] = [
        ("use crate::body::Body;", &["body"]),
        ("use crate::{body::Body, config::{A, B}, net};", &["body", "config", "net"]),
        ("let x = crate::net::accept(&l);", &["net"]),
        ("// use crate::server::App;", &[]),
        ("/// see [`crate::server::App`]\nfn f() {}", &[]),
        ("/* crate::server */ let s = \"crate::server // x\";", &[]),
        ("use gateway_crate::x; use crate::Gateway;", &["Gateway"]),
    ];
    for (text, want) in cases {
        assert_eq!(crate_paths(&code(text)), want.iter().map(|s| s.to_string()).collect::<Vec<_>>(), "{text}");
    }
    let mut arrows: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a")] {
        arrows.entry(a.into()).or_default().insert(b.into(), String::new());
    }
    assert_eq!(cycle(&arrows), Some(vec!["a".into(), "b".into(), "c".into(), "a".into()]));
    arrows.get_mut("c").unwrap().clear();
    assert_eq!(cycle(&arrows), None);
}
