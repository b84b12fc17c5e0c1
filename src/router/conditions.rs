//! A route's `headers` and `query` conditions: pure, table-tested.
//!
//! Each condition asks for a value equal to a text, for the field to be
//! present, absent, or for a value the whole of which a pattern matches.
//! Patterns use the `regex` crate, whose matching takes time linear in the
//! value (no backtracking), and whose compiled size is bounded at load.

use http::{HeaderMap, HeaderName};

/// The largest a compiled pattern may grow (the `regex` crate's own
/// default is ten times larger): a pattern is for a header, not a document.
const PATTERN_SIZE_LIMIT: usize = 1 << 20;

/// What one condition asks of a header field or a query parameter.
#[derive(Debug, Clone)]
pub enum Want {
    /// A value equal to this, byte for byte (a query parameter's after
    /// percent-decoding, `+` as a space).
    Equals(Box<str>),
    /// Any value, even empty.
    Present,
    /// No such field or parameter.
    Absent,
    /// A value the whole of which this pattern matches.
    Matches(regex::Regex),
}

impl PartialEq for Want {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Want::Equals(a), Want::Equals(b)) => a == b,
            (Want::Present, Want::Present) | (Want::Absent, Want::Absent) => true,
            (Want::Matches(a), Want::Matches(b)) => a.as_str() == b.as_str(),
            _ => false,
        }
    }
}

impl Want {
    /// A pattern that must match a whole value.
    pub fn pattern(pattern: &str) -> Result<Want, String> {
        Self::compiled(pattern).map_err(|e| format!("invalid pattern {pattern:?}: {e}"))
    }

    /// [`Want::pattern`] for a secret's header or parameter: the refusal
    /// says what is wrong without the pattern (`regex`'s own message
    /// quotes it).
    pub fn secret_pattern(pattern: &str) -> Result<Want, String> {
        Self::compiled(pattern).map_err(|e| {
            let why = match &e {
                regex::Error::CompiledTooBig(limit) => format!("compiled, larger than {limit} bytes"),
                e => e.to_string().lines().last().and_then(|l| l.strip_prefix("error: ")).unwrap_or("").to_owned(),
            };
            format!("invalid pattern (not shown: the name is a secret's): {why}")
        })
    }

    fn compiled(pattern: &str) -> Result<Want, regex::Error> {
        regex::RegexBuilder::new(&format!("^(?:{pattern})$")).size_limit(PATTERN_SIZE_LIMIT).build().map(Want::Matches)
    }

    /// Whether `values` (every value the field or parameter has) satisfy it.
    fn holds<V>(&self, mut values: impl Iterator<Item = V>) -> bool
    where
        V: std::ops::Deref,
        V::Target: AsRef<[u8]>,
    {
        match self {
            Want::Present => values.next().is_some(),
            Want::Absent => values.next().is_none(),
            Want::Equals(want) => values.any(|v| (*v).as_ref() == want.as_bytes()),
            Want::Matches(re) => values.any(|v| std::str::from_utf8((*v).as_ref()).is_ok_and(|v| re.is_match(v))),
        }
    }

    /// Whether this holds whenever `other` does (for the same field).
    fn implied_by(&self, other: &Want) -> bool {
        self == other || (*self == Want::Present && matches!(other, Want::Equals(_) | Want::Matches(_)))
    }

    /// For `gateway check`, as a condition on `name`, its value or pattern
    /// as `shown(name, text)` gives it.
    fn describe(&self, name: &str, shown: &dyn Fn(&str, &str) -> String) -> String {
        match self {
            Want::Equals(v) => format!("={}", shown(name, v)),
            Want::Present => " present".to_owned(),
            Want::Absent => " absent".to_owned(),
            Want::Matches(re) => format!(" ~ {}", shown(name, &re.as_str()[4..re.as_str().len() - 2])),
        }
    }
}

/// All of a route's conditions: each must hold.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Conditions {
    pub headers: Vec<(HeaderName, Want)>,
    /// Parameter names as decoded.
    pub query: Vec<(String, Want)>,
}

impl Conditions {
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty() && self.query.is_empty()
    }

    /// Whether every condition holds for a request with these headers and
    /// query (bounded by the request head's limits: one pass over the
    /// query per query condition).
    pub fn hold(&self, headers: &HeaderMap, query: Option<&str>) -> bool {
        self.headers.iter().all(|(name, want)| want.holds(headers.get_all(name).iter().map(|v| v.as_bytes())))
            && self.query.iter().all(|(name, want)| {
                let pairs = form_urlencoded::parse(query.unwrap_or("").as_bytes());
                want.holds(pairs.filter(|(k, _)| k == name).map(|(_, v)| v))
            })
    }

    /// Whether these hold whenever `other`'s do: a route with `other`
    /// behind one with these (same host and prefix) is never chosen.
    pub fn implied_by(&self, other: &Conditions) -> bool {
        self.headers.iter().all(|(n, w)| other.headers.iter().any(|(on, ow)| on == n && w.implied_by(ow)))
            && self.query.iter().all(|(n, w)| other.query.iter().any(|(on, ow)| on == n && w.implied_by(ow)))
    }

    /// For `gateway check`: `header x-canary="1", query v present`, each
    /// value or pattern as `shown(name, text)` gives it (quoted, or
    /// redacted: `config::redact_condition`).
    pub fn describe(&self, shown: impl Fn(&str, &str) -> String) -> String {
        let headers = self.headers.iter().map(|(n, w)| format!("header {n}{}", w.describe(n.as_str(), &shown)));
        let query = self.query.iter().map(|(n, w)| format!("query {n}{}", w.describe(n, &shown)));
        headers.chain(query).collect::<Vec<_>>().join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    fn on_header(name: &str, want: Want) -> Conditions {
        Conditions { headers: vec![(HeaderName::from_bytes(name.as_bytes()).unwrap(), want)], query: vec![] }
    }

    fn on_query(name: &str, want: Want) -> Conditions {
        Conditions { headers: vec![], query: vec![(name.to_owned(), want)] }
    }

    #[test]
    fn header_conditions() {
        let eq = || Want::Equals("1".into());
        type Case<'a> = (Conditions, &'a [(&'a str, &'a str)], bool);
        let cases: &[Case] = &[
            (on_header("x-canary", eq()), &[("x-canary", "1")], true),
            (on_header("x-canary", eq()), &[("X-Canary", "1")], true),
            (on_header("x-canary", eq()), &[("x-canary", "2")], false),
            (on_header("x-canary", eq()), &[("x-canary", "2"), ("x-canary", "1")], true),
            (on_header("x-canary", eq()), &[], false),
            (on_header("x-canary", Want::Present), &[("x-canary", "")], true),
            (on_header("x-canary", Want::Present), &[], false),
            (on_header("x-canary", Want::Absent), &[], true),
            (on_header("x-canary", Want::Absent), &[("x-canary", "0")], false),
            (on_header("x-v", Want::pattern("v[0-9]+").unwrap()), &[("x-v", "v12")], true),
            (on_header("x-v", Want::pattern("v[0-9]+").unwrap()), &[("x-v", "xv12")], false),
            (on_header("x-v", Want::pattern("v[0-9]+|w").unwrap()), &[("x-v", "v1w")], false),
            (Conditions::default(), &[], true),
        ];
        for (i, (c, h, want)) in cases.iter().enumerate() {
            assert_eq!(c.hold(&headers(h), None), *want, "case {i}: {c:?} {h:?}");
        }
    }

    #[test]
    fn query_conditions_decode_and_see_every_occurrence() {
        let cases: &[(Conditions, Option<&str>, bool)] = &[
            (on_query("v", Want::Equals("2".into())), Some("v=2"), true),
            (on_query("v", Want::Equals("2".into())), Some("a=1&v=3&v=2"), true),
            (on_query("v", Want::Equals("2".into())), Some("vv=2"), false),
            (on_query("v", Want::Equals("2".into())), None, false),
            (on_query("v", Want::Equals("a b".into())), Some("v=a+b"), true),
            (on_query("v", Want::Equals("a b".into())), Some("v=a%20b"), true),
            (on_query("a b", Want::Present), Some("a%20b"), true),
            (on_query("debug", Want::Present), Some("debug"), true),
            (on_query("debug", Want::Present), Some("x=debug"), false),
            (on_query("debug", Want::Absent), Some("x=1"), true),
            (on_query("debug", Want::Absent), None, true),
            (on_query("debug", Want::Absent), Some("debug="), false),
        ];
        for (i, (c, q, want)) in cases.iter().enumerate() {
            assert_eq!(c.hold(&HeaderMap::new(), *q), *want, "case {i}: {c:?} {q:?}");
        }
    }

    #[test]
    fn implied_by_finds_routes_never_chosen() {
        let present = on_header("x", Want::Present);
        let equal = on_header("x", Want::Equals("1".into()));
        let absent = on_header("x", Want::Absent);
        let both = Conditions { query: vec![("v".into(), Want::Present)], ..equal.clone() };
        assert!(Conditions::default().implied_by(&equal));
        assert!(present.implied_by(&equal));
        assert!(equal.implied_by(&both));
        assert!(equal.implied_by(&equal.clone()));
        assert!(!equal.implied_by(&present));
        assert!(!absent.implied_by(&present));
        assert!(!both.implied_by(&equal));
        assert!(!equal.implied_by(&Conditions::default()));
    }

    #[test]
    fn patterns_are_bounded_and_checked() {
        assert!(Want::pattern("(").is_err());
        assert!(Want::pattern("a{100000}").is_err(), "a pattern past the size limit is refused");
        // A secret's pattern is refused for the same reasons, without it.
        let cases = [
            ("(Bearer S3CRET", "invalid pattern (not shown: the name is a secret's): unclosed group"),
            (
                "S3CRET{100000}",
                "invalid pattern (not shown: the name is a secret's): compiled, larger than 1048576 bytes",
            ),
        ];
        for (pattern, want) in cases {
            assert_eq!(Want::secret_pattern(pattern).unwrap_err(), want);
        }
        assert!(Want::secret_pattern("k3y-[0-9]+").is_ok());
    }
}
