//! Header rules per route: `set` replaces any value the message had (one
//! remains), `remove` drops a header. Validated at load; hop-by-hop names
//! are refused there, so the hop-by-hop rules still hold after these. A
//! request's hop-by-hop headers are stripped before its rules run, so a
//! client cannot take a `set` header away by listing it in `Connection`.
//!
//! Applied with tower's `map_request` / `map_response` layers rather than
//! tower-http's `SetRequestHeaderLayer`, which sets one header per layer: a
//! list of them would need one layer each, boxed, since their number comes
//! from the config.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

/// One direction's rules.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HeaderRules {
    pub set: Vec<(HeaderName, HeaderValue)>,
    pub remove: Vec<HeaderName>,
}

impl HeaderRules {
    pub fn is_empty(&self) -> bool {
        self.set.is_empty() && self.remove.is_empty()
    }

    /// Every name the rules remove or set.
    pub fn names(&self) -> impl Iterator<Item = &HeaderName> + Clone {
        self.remove.iter().chain(self.set.iter().map(|(n, _)| n))
    }

    /// Removes, then sets. A name's other spellings of `-` and `_` go too
    /// (`X_Internal_User` for `x-internal-user`): CGI and WSGI upstreams
    /// read them as one header, so a client could otherwise slip past a
    /// rule that removes or sets it.
    pub fn apply(&self, headers: &mut HeaderMap) {
        crate::headers::remove_other_spellings(headers, self.names(), false);
        for name in &self.remove {
            headers.remove(name);
        }
        for (name, value) in &self.set {
            headers.insert(name.clone(), value.clone());
        }
    }
}

/// A route's response rules, in its request's extensions, for the
/// upstream's 1xx heads: passed on as the upstream sent them, they would
/// otherwise carry the fields the rules keep from the final answer (see
/// [`crate::headers::interim::without`]).
#[derive(Clone)]
pub struct ForInterims(pub std::sync::Arc<HeaderRules>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replaces_every_value_and_remove_drops() {
        let rules = HeaderRules {
            set: vec![(HeaderName::from_static("x-env"), HeaderValue::from_static("prod"))],
            remove: vec![HeaderName::from_static("x-debug")],
        };
        let mut h = HeaderMap::new();
        h.append("x-env", HeaderValue::from_static("a"));
        h.append("x-env", HeaderValue::from_static("b"));
        h.insert("x-debug", HeaderValue::from_static("1"));
        h.insert("x-other", HeaderValue::from_static("kept"));
        rules.apply(&mut h);
        assert_eq!(h.get_all("x-env").iter().collect::<Vec<_>>(), ["prod"]);
        assert!(h.get("x-debug").is_none());
        assert_eq!(h["x-other"], "kept");
    }
}
