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

use std::sync::Arc;

use foldhash::HashMap;
use http::{HeaderMap, Uri};

pub mod conditions;
pub mod host;
pub mod redirect;
pub mod split;

pub use conditions::{Conditions, Want};
pub use host::HostPattern;

/// What the router knows of one route.
#[derive(Debug, Clone, Copy)]
pub struct RouteKey<'a> {
    /// Empty: any host.
    pub hosts: &'a [HostPattern],
    /// Normalised (see [`Router::new`]).
    pub prefix: &'a str,
    pub conditions: Option<&'a Arc<Conditions>>,
}

/// Chooses a request's route: the most specific of the host's tables (an
/// exact name, then wildcards with more labels before fewer, then the
/// routes without `hosts`) that has a route for it, in it the longest
/// matching prefix that has a route whose conditions hold, and among the
/// routes of one prefix the first in file order whose conditions hold.
#[derive(Debug, Clone, Default)]
pub struct Router {
    any: Paths,
    exact: HashMap<Box<str>, Paths>,
    wild: HashMap<Box<str>, Paths>,
    /// The label counts of the wildcards' suffixes, most first: a host is
    /// looked up once per count, not once per label it has.
    wild_labels: Box<[usize]>,
}

/// Maps normalised prefixes to the routes that have them.
#[derive(Debug, Clone, Default)]
struct Paths {
    by_prefix: HashMap<Box<str>, Slot>,
}

/// Routes by prefix as they are gathered, in file order.
type Pending = std::collections::HashMap<Box<str>, Vec<(usize, Option<Arc<Conditions>>)>>;

#[derive(Debug, Clone)]
enum Slot {
    /// One route without conditions: no more to check.
    One(usize),
    /// Routes in file order, each with its conditions.
    Choices(Box<[(usize, Option<Arc<Conditions>>)]>),
}

impl Router {
    /// Builds a router from normalised prefixes (as `config` produces them:
    /// leading `/`, no trailing `/` except for `/` itself), in route order,
    /// for routes with neither hosts nor conditions.
    pub fn new<'a>(prefixes: impl IntoIterator<Item = &'a str>) -> Self {
        Self::build(prefixes.into_iter().map(|prefix| RouteKey { hosts: &[], prefix, conditions: None }))
    }

    /// Builds a router from every route's key, in route order.
    pub fn build<'a>(routes: impl IntoIterator<Item = RouteKey<'a>>) -> Self {
        let (mut any, mut exact, mut wild) = (Pending::new(), HashMap::default(), HashMap::default());
        for (i, key) in routes.into_iter().enumerate() {
            let choice = (i, key.conditions.filter(|c| !c.is_empty()).cloned());
            let add = |table: &mut Pending| table.entry(key.prefix.into()).or_default().push(choice.clone());
            if key.hosts.is_empty() {
                add(&mut any);
            }
            for host in key.hosts {
                let (map, name): (&mut HashMap<Box<str>, Pending>, _) = match host {
                    HostPattern::Exact(name) => (&mut exact, name),
                    HostPattern::Wildcard(suffix) => (&mut wild, suffix),
                };
                add(map.entry(name.as_str().into()).or_default());
            }
        }
        let mut wild_labels: Vec<usize> = wild.keys().map(|s| host::labels(s)).collect();
        wild_labels.sort_unstable_by(|a, b| b.cmp(a));
        wild_labels.dedup();
        let tables = |map: HashMap<Box<str>, Pending>| map.into_iter().map(|(k, v)| (k, Paths::new(v))).collect();
        Router { any: Paths::new(any), exact: tables(exact), wild: tables(wild), wild_labels: wild_labels.into() }
    }

    /// The index of the route for a request with this target and headers.
    pub fn find(&self, uri: &Uri, headers: &HeaderMap) -> Option<usize> {
        self.find_on(uri.path(), uri, headers)
    }

    /// [`Router::find`] on another spelling of the request's path (see
    /// [`crate::path::routing_view`]).
    pub fn find_on(&self, path: &str, uri: &Uri, headers: &HeaderMap) -> Option<usize> {
        let query = uri.query();
        if !(self.exact.is_empty() && self.wild.is_empty())
            && let Some(host) = host::request_host(uri, headers)
        {
            let exact = self.exact.get(&*host);
            let wild = self.wild_labels.iter().filter_map(|&n| host::suffix(&host, n).and_then(|s| self.wild.get(s)));
            for table in exact.into_iter().chain(wild) {
                if let Some(i) = table.find(path, headers, query) {
                    return Some(i);
                }
            }
        }
        self.any.find(path, headers, query)
    }

    /// The index of the route for `path` among routes without hosts, for a
    /// request that no condition looks at.
    pub fn find_path(&self, path: &str) -> Option<usize> {
        self.any.find(path, &HeaderMap::new(), None)
    }
}

impl Paths {
    fn new(pending: Pending) -> Paths {
        let by_prefix = pending
            .into_iter()
            .map(|(prefix, choices)| {
                let slot = match &choices[..] {
                    [(i, None)] => Slot::One(*i),
                    _ => Slot::Choices(choices.into()),
                };
                (prefix, slot)
            })
            .collect();
        Paths { by_prefix }
    }

    /// The route with the longest prefix matching `path` whose conditions
    /// hold: one lookup per path segment.
    fn find(&self, path: &str, headers: &HeaderMap, query: Option<&str>) -> Option<usize> {
        let chosen = |slot: &Slot| match slot {
            Slot::One(i) => Some(*i),
            Slot::Choices(choices) => {
                choices.iter().find(|(_, c)| c.as_ref().is_none_or(|c| c.hold(headers, query))).map(|(i, _)| *i)
            }
        };
        let mut candidate = path.trim_end_matches('/');
        loop {
            if candidate.is_empty() {
                return self.by_prefix.get("/").and_then(chosen);
            }
            if let Some(i) = self.by_prefix.get(candidate).and_then(chosen) {
                return Some(i);
            }
            match candidate.rfind('/') {
                Some(cut) => candidate = &candidate[..cut],
                None => return self.by_prefix.get("/").and_then(chosen),
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
        self.pieces().iter().for_each(|p| out.push_str(p));
    }

    /// The path and query in pieces, to write one after the other.
    pub fn pieces(&self) -> [&'a str; 5] {
        let slash = if self.slash { "/" } else { "" };
        let (mark, query) = self.query.map_or(("", ""), |q| ("?", q));
        [self.rewrite, self.rest, slash, mark, query]
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
            assert_eq!(router.find_path(path), *want, "path {path:?}");
        }
    }

    #[test]
    fn no_catch_all_means_unmatched() {
        let router = Router::new(["/b", "/api"]);
        for path in ["/", "/bx", "/apis", "/c/b", "", "//"] {
            assert_eq!(router.find_path(path), None, "path {path:?}");
        }
        assert_eq!(router.find_path("/api//x"), Some(1));
    }

    fn host_router(routes: &[(&[&str], &str, Option<Conditions>)]) -> Router {
        let hosts: Vec<Vec<HostPattern>> =
            routes.iter().map(|(h, _, _)| h.iter().map(|h| HostPattern::parse(h).unwrap()).collect()).collect();
        let conds: Vec<Option<Arc<Conditions>>> = routes.iter().map(|(_, _, c)| c.clone().map(Arc::new)).collect();
        Router::build(routes.iter().enumerate().map(|(i, (_, prefix, _))| RouteKey {
            hosts: &hosts[i],
            prefix,
            conditions: conds[i].as_ref(),
        }))
    }

    fn find(router: &Router, host: Option<&str>, target: &str, headers: &[(&str, &str)]) -> Option<usize> {
        let mut h = HeaderMap::new();
        if let Some(host) = host {
            h.insert(http::header::HOST, host.parse().unwrap());
        }
        for (k, v) in headers {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        router.find(&target.parse().unwrap(), &h)
    }

    #[test]
    fn host_first_then_longest_prefix_then_file_order() {
        let canary = Conditions {
            headers: vec![(http::HeaderName::from_static("x-canary"), Want::Equals("1".into()))],
            query: vec![],
        };
        let v2 = Conditions { headers: vec![], query: vec![("v".into(), Want::Equals("2".into()))] };
        let router = host_router(&[
            (&["api.example.com"], "/", None),                 // 0
            (&["*.example.com"], "/api", None),                // 1
            (&["*.b.example.com"], "/api", None),              // 2
            (&[], "/api", Some(canary.clone())),               // 3
            (&[], "/api", Some(v2)),                           // 4
            (&[], "/api", None),                               // 5
            (&[], "/", None),                                  // 6
            (&["[::1]", "Other.Example"], "/x", Some(canary)), // 7
        ]);
        type Case<'a> = (Option<&'a str>, &'a str, &'a [(&'a str, &'a str)], Option<usize>);
        let cases: &[Case] = &[
            (Some("api.example.com"), "/api/x", &[], Some(0)),
            (Some("API.Example.Com.:8443"), "/api/x", &[], Some(0)),
            (Some("www.example.com"), "/api/x", &[], Some(1)),
            (Some("a.b.example.com"), "/api/x", &[], Some(2)),
            (Some("a.c.example.com"), "/api/x", &[], Some(1)),
            (Some("a.c.b.example.com"), "/api/x", &[], Some(2)),
            (Some("x.b.example.com"), "/api", &[], Some(2)),
            (Some("b.example.com"), "/api", &[], Some(1)),
            (Some("example.com"), "/api", &[], Some(5)),
            (Some("www.example.com"), "/other", &[], Some(6)),
            (Some("elsewhere"), "/api", &[("x-canary", "1")], Some(3)),
            (Some("elsewhere"), "/api?v=2", &[("x-canary", "1")], Some(3)),
            (Some("elsewhere"), "/api?v=2", &[], Some(4)),
            (Some("elsewhere"), "/api?v=3", &[("x-canary", "0")], Some(5)),
            (None, "/api/deep", &[], Some(5)),
            (Some("[::1]:8080"), "/x", &[("x-canary", "1")], Some(7)),
            (Some("[::1]"), "/x", &[], Some(6)),
            (Some("other.example"), "/x/y", &[("x-canary", "1")], Some(7)),
            (Some("http://other.example/x"), "/", &[], Some(6)),
        ];
        for (host, target, headers, want) in cases {
            assert_eq!(find(&router, *host, target, headers), *want, "{host:?} {target} {headers:?}");
        }
    }

    #[test]
    fn conditions_that_fail_fall_back_to_a_shorter_prefix() {
        let canary =
            Conditions { headers: vec![(http::HeaderName::from_static("x-canary"), Want::Present)], query: vec![] };
        let router = host_router(&[(&[], "/api/v2", Some(canary)), (&["h.example"], "/", None), (&[], "/api", None)]);
        assert_eq!(find(&router, Some("x"), "/api/v2/x", &[("x-canary", "")]), Some(0));
        assert_eq!(find(&router, Some("x"), "/api/v2/x", &[]), Some(2));
        assert_eq!(find(&router, Some("h.example"), "/api/v2/x", &[("x-canary", "")]), Some(1));
        let no_catch_all = host_router(&[(&["h.example"], "/a", None)]);
        assert_eq!(find(&no_catch_all, Some("h.example"), "/b", &[]), None);
        assert_eq!(find(&no_catch_all, Some("g.example"), "/a", &[]), None);
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
