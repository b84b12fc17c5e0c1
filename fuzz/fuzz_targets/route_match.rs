//! `router::Router::find` against a naive reference, and `rewrite_path` on
//! whatever route it picks.
//!
//! The reference scans every prefix: `p` matches `path` (trailing `/` trimmed,
//! as the router does) when they are equal, when `p` is `/`, or when `path`
//! continues with `/` right after `p`. The router must pick a matching prefix,
//! none longer may match, and it must find one whenever the reference does.

#![no_main]

use gateway::router::{Router, rewrite_path};
use libfuzzer_sys::arbitrary::{self, Arbitrary};
use libfuzzer_sys::fuzz_target;

/// Most routers have a handful of routes; more only slows the search down.
const MAX_ROUTES: usize = 8;

/// A string either taken as it is (any Unicode, to hit char boundaries) or
/// spelled from a tiny alphabet, so prefixes and paths share segments often.
#[derive(Debug, Arbitrary)]
enum Text {
    Raw(String),
    Small(Vec<u8>),
}

impl Text {
    fn render(&self) -> String {
        const ALPHABET: &[char] = &['/', 'a', 'b', '/', 'é', '.', '/', '%'];
        match self {
            Text::Raw(s) => s.clone(),
            Text::Small(bytes) => bytes.iter().map(|b| ALPHABET[*b as usize % ALPHABET.len()]).collect(),
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Input {
    prefixes: Vec<Text>,
    path: Text,
    query: Option<String>,
    rewrite: Text,
}

/// Normalises as `config` does: a leading `/`, no trailing `/` unless it is `/`.
fn normalize_prefix(raw: &str) -> String {
    let with_slash = if raw.starts_with('/') { raw.to_owned() } else { format!("/{raw}") };
    let trimmed = with_slash.trim_end_matches('/');
    if trimmed.is_empty() { "/".to_owned() } else { trimmed.to_owned() }
}

fn matches(path: &str, prefix: &str) -> bool {
    path == prefix || prefix == "/" || path.starts_with(prefix) && path[prefix.len()..].starts_with('/')
}

fuzz_target!(|input: Input| {
    let prefixes: Vec<String> = input.prefixes.iter().take(MAX_ROUTES).map(|t| normalize_prefix(&t.render())).collect();
    let path = input.path.render();
    let router = Router::new(prefixes.iter().map(String::as_str));

    let trimmed = path.trim_end_matches('/');
    let longest = prefixes.iter().filter(|p| matches(trimmed, p)).map(String::len).max();

    let found = router.find(&path);
    match (found, longest) {
        (None, None) => {}
        (None, Some(_)) => panic!("no route for {path:?}, but the reference matches: {prefixes:?}"),
        (Some(i), reference) => {
            let prefix = prefixes.get(i).unwrap_or_else(|| panic!("index {i} out of range for {prefixes:?}"));
            assert!(matches(trimmed, prefix), "{path:?} routed to {prefix:?}, which does not match it");
            assert_eq!(
                Some(prefix.len()),
                reference,
                "{path:?} routed to {prefix:?}, but a longer prefix matches: {prefixes:?}"
            );

            // A configured rewrite starts with '/' (config refuses others).
            let rewrite = input.rewrite.render();
            let rewrite = if rewrite.starts_with('/') { rewrite } else { format!("/{rewrite}") };
            let out = rewrite_path(&path, input.query.as_deref(), prefix, &rewrite);
            assert!(
                out.starts_with('/'),
                "rewrite_path({path:?}, {:?}, {prefix:?}, {rewrite:?}) = {out:?}",
                input.query
            );
        }
    }

    // Whatever the prefix, even one that does not match, it must not panic.
    for prefix in &prefixes {
        let _ = rewrite_path(&path, input.query.as_deref(), prefix, "/");
    }
});
