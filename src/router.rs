//! Route matching and path rewriting: pure functions, table-tested.
//!
//! Matching is segment-aware longest-prefix: `/b` matches `/b` and `/b/x`
//! but not `/bx`. Instead of scanning every route, the router looks up each
//! ancestor of the request path (longest first) in a hash map, so a match
//! costs one lookup per path segment whatever the number of routes.
//!
//! The map hashes with foldhash, not std's SipHash: a lookup on a short path
//! costs less (see benches/README.md, Decisions). Its keys are the
//! configured prefixes, so a client choosing the looked-up paths cannot make
//! them collide; foldhash is still seeded per process.

use foldhash::HashMap;

/// Maps normalised prefixes to route indices.
#[derive(Debug, Clone, Default)]
pub struct Router {
    by_prefix: HashMap<Box<str>, usize>,
}

impl Router {
    /// Builds a router from normalised prefixes (as `config` produces them:
    /// leading `/`, no trailing `/` except for `/` itself), in route order.
    pub fn new<'a>(prefixes: impl IntoIterator<Item = &'a str>) -> Self {
        let by_prefix = prefixes.into_iter().enumerate().map(|(i, p)| (Box::from(p), i)).collect();
        Router { by_prefix }
    }

    /// The index of the route with the longest prefix matching `path`.
    pub fn find(&self, path: &str) -> Option<usize> {
        let mut candidate = path.trim_end_matches('/');
        loop {
            if candidate.is_empty() {
                return self.by_prefix.get("/").copied();
            }
            if let Some(&i) = self.by_prefix.get(candidate) {
                return Some(i);
            }
            match candidate.rfind('/') {
                Some(cut) => candidate = &candidate[..cut],
                None => return self.by_prefix.get("/").copied(),
            }
        }
    }
}

/// The part of `path` after the matched `prefix` (empty or starting with `/`).
pub fn strip_prefix<'a>(path: &'a str, prefix: &str) -> &'a str {
    if prefix == "/" {
        return path;
    }
    path.get(prefix.len()..).unwrap_or("")
}

/// Rewrites `path` (with optional `query`) by replacing the matched `prefix`
/// with `rewrite`; the rest of the path and the query are kept.
pub fn rewrite_path(path: &str, query: Option<&str>, prefix: &str, rewrite: &str) -> String {
    // Exactly as long as it will be: made into the upstream request's
    // `PathAndQuery` without a copy (see `upstream::proxy::upstream_path`).
    let rewritten = Rewritten::of(path, query, prefix, rewrite);
    let mut out = String::with_capacity(rewritten.byte_len());
    rewritten.push_to(&mut out);
    out
}

/// The pieces of a rewritten path and query, to measure and write out
/// (the cache writes them into its key, after its own fields).
pub struct Rewritten<'a> {
    rewrite: &'a str,
    rest: &'a str,
    slash: bool,
    query: Option<&'a str>,
}

impl<'a> Rewritten<'a> {
    pub fn of(path: &'a str, query: Option<&'a str>, prefix: &str, rewrite: &'a str) -> Rewritten<'a> {
        let rest = strip_prefix(path, prefix);
        let rest = if rewrite.ends_with('/') && rest.starts_with('/') { &rest[1..] } else { rest };
        let slash = rewrite.is_empty() && rest.is_empty();
        Rewritten { rewrite, rest, slash, query }
    }

    pub fn byte_len(&self) -> usize {
        self.rewrite.len() + self.rest.len() + usize::from(self.slash) + self.query.map_or(0, |q| q.len() + 1)
    }

    pub fn push_to(&self, out: &mut String) {
        out.push_str(self.rewrite);
        out.push_str(self.rest);
        if self.slash {
            out.push('/');
        }
        if let Some(q) = self.query {
            out.push('?');
            out.push_str(q);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longest_segment_aware_prefix_wins() {
        let router = Router::new(["/b", "/b/deep", "/static", "/"]);
        let cases: &[(&str, Option<usize>)] = &[
            ("/b", Some(0)),
            ("/b/", Some(0)),
            ("/b/x", Some(0)),
            ("/bx", Some(3)),
            ("/b/deep", Some(1)),
            ("/b/deeper", Some(0)),
            ("/b/deep/x/y", Some(1)),
            ("/static/a/b.txt", Some(2)),
            ("/", Some(3)),
            ("", Some(3)),
            ("/other", Some(3)),
        ];
        for (path, want) in cases {
            assert_eq!(router.find(path), *want, "path {path:?}");
        }
    }

    #[test]
    fn no_catch_all_means_unmatched() {
        let router = Router::new(["/b", "/api"]);
        for path in ["/", "/bx", "/apis", "/c/b", "", "//"] {
            assert_eq!(router.find(path), None, "path {path:?}");
        }
        assert_eq!(router.find("/api//x"), Some(1));
    }

    #[test]
    fn rewrite_replaces_prefix_and_keeps_rest_and_query() {
        let cases: &[(&str, Option<&str>, &str, &str, &str)] = &[
            ("/b", None, "/b", "/a", "/a"),
            ("/b/x/y", Some("q=1&r=2"), "/b", "/a", "/a/x/y?q=1&r=2"),
            ("/b/", None, "/b", "/a", "/a/"),
            ("/b/x", None, "/b", "/", "/x"),
            ("/b", None, "/b", "/", "/"),
            ("/b", Some("q"), "/b", "/a/", "/a/?q"),
            ("/anything", None, "/", "/api", "/api/anything"),
            ("/b/x", Some("q"), "/b", "/a/", "/a/x?q"),
            ("/b", Some(""), "/b", "", "/?"),
        ];
        for (path, query, prefix, rewrite, want) in cases {
            let out = rewrite_path(path, *query, prefix, rewrite);
            assert_eq!(out, *want, "{path} {prefix}->{rewrite}");
            // Exactly its length: it becomes `Bytes` without a second allocation.
            assert_eq!(out.capacity(), out.len(), "{path} {prefix}->{rewrite}");
        }
    }
}
