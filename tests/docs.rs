//! Every relative link in the README and the Markdown under `docs/`,
//! `benches/` and `deploy/` names a file that exists, and a `#fragment`
//! names a heading of that file (GitHub's anchor for it).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn markdown(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            if !path.ends_with("target") {
                markdown(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The text outside fenced code blocks, where links and headings are read.
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-`
/// and `_` dropped, spaces as `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(file: &Path) -> BTreeSet<String> {
    prose(&fs::read_to_string(file).unwrap())
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// The targets of `[text](target)` links in `text`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find([')', ' ', '\n']) {
            out.push(rest[..end].to_string());
        }
    }
    out
}

fn broken(root: &Path, file: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    for link in links(&prose(&fs::read_to_string(file).unwrap())) {
        if link.contains("://") || link.starts_with("mailto:") {
            continue;
        }
        let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
        let target = if path.is_empty() { file.to_path_buf() } else { file.parent().unwrap().join(path) };
        let shown = file.strip_prefix(root).unwrap().display();
        if !target.exists() {
            bad.push(format!("{shown}: {link}: no such file"));
        } else if !fragment.is_empty()
            && target.extension().is_some_and(|e| e == "md")
            && !anchors(&target).contains(fragment)
        {
            bad.push(format!("{shown}: {link}: no such heading"));
        }
    }
    bad
}

#[test]
fn every_link_in_the_docs_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "benches", "deploy"] {
        markdown(&root.join(dir), &mut files);
    }
    let bad: Vec<String> = files.iter().flat_map(|f| broken(root, f)).collect();
    assert!(files.len() > 5, "found only {files:?}");
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn anchors_and_links_are_read_as_github_does() {
    for (heading, want) in [
        ("Limits and failure behaviour", "limits-and-failure-behaviour"),
        (" `cache`, a hit (RFC 9111)", "cache-a-hit-rfc-9111"),
        ("What a reload keeps", "what-a-reload-keeps"),
    ] {
        assert_eq!(anchor(heading), want);
    }
    assert_eq!(links("see [a](docs/a.md#b) and [c](https://x/y) [d](e.md)"), ["docs/a.md#b", "https://x/y", "e.md"]);
    assert_eq!(prose("a\n```\n[x](y)\n```\nb\n"), "a\nb\n");
}
