//! The one rule for every key that lists HTTP methods (a route's
//! `methods`): a method is taken only if the IANA HTTP Method Registry, or
//! the short list of unregistered ones in wide use, holds it, so a typo
//! (`GTE`) is an error at load rather than a route that answers 405 to the
//! method that was meant. Any case is taken, in capitals, as it always was
//! (`get` is `GET`): a configuration that loaded before still loads.

use http::Method;

use super::Problem;
use crate::config::errors::distance;

/// The IANA HTTP Method Registry
/// (<https://www.iana.org/assignments/http-methods>): RFC 9110's methods,
/// then those RFC 7237 registered (WebDAV, versioning, binding) and PATCH.
/// Left out: `*` (reserved) and `PRI` (the HTTP/2 connection preface, never
/// a request a route could take).
pub(crate) const REGISTERED: &[&str] = &[
    "GET",
    "HEAD",
    "POST",
    "PUT",
    "DELETE",
    "CONNECT",
    "OPTIONS",
    "TRACE",
    "PATCH",
    "ACL",
    "BASELINE-CONTROL",
    "BIND",
    "CHECKIN",
    "CHECKOUT",
    "COPY",
    "LABEL",
    "LINK",
    "LOCK",
    "MERGE",
    "MKACTIVITY",
    "MKCALENDAR",
    "MKCOL",
    "MKREDIRECTREF",
    "MKWORKSPACE",
    "MOVE",
    "ORDERPATCH",
    "PROPFIND",
    "PROPPATCH",
    "REBIND",
    "REPORT",
    "SEARCH",
    "UNBIND",
    "UNCHECKOUT",
    "UNLINK",
    "UNLOCK",
    "UPDATE",
    "UPDATEREDIRECTREF",
    "VERSION-CONTROL",
];

/// Methods outside the registry that caches and proxies take all the same:
/// `PURGE` (Varnish's, nginx's and most CDNs' cache purge) and `QUERY` (the
/// HTTP working group's safe method with a body, not yet registered).
pub(crate) const IN_WIDE_USE: &[&str] = &["PURGE", "QUERY"];

/// The methods of the list at `key` (`routes[2].methods`), in capitals, each
/// refused with its own index unless the registry or [`IN_WIDE_USE`] holds it.
pub(super) fn methods(key: &str, listed: &[String]) -> Result<Vec<Method>, Problem> {
    if listed.is_empty() {
        return Err((
            key.to_owned(),
            "is empty, which would refuse every request with 405; list the methods the route takes, \
             or leave `methods` out to take them all"
                .into(),
        ));
    }
    listed
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let refused = |why: String| (format!("{key}[{i}]"), why);
            let upper = m.to_ascii_uppercase();
            if !REGISTERED.contains(&upper.as_str()) && !IN_WIDE_USE.contains(&upper.as_str()) {
                return Err(refused(unregistered(m)));
            }
            Method::from_bytes(upper.as_bytes()).map_err(|_| refused(format!("{m:?} is not an HTTP method")))
        })
        .collect()
}

/// Why `m` is refused, with the registered methods it is nearest to.
fn unregistered(m: &str) -> String {
    let upper = m.to_ascii_uppercase();
    let near = near(&upper);
    let common = "GET, HEAD, POST, PUT, DELETE, PATCH, OPTIONS, CONNECT, TRACE, or a WebDAV method such as PROPFIND";
    match near.as_slice() {
        [] => format!("{m:?} is not in the IANA HTTP Method Registry; use {common} (in capitals)"),
        [one] => format!("{m:?} is not an HTTP method; did you mean {one:?}?"),
        many => {
            let quoted: Vec<String> = many.iter().map(|n| format!("{n:?}")).collect();
            format!("{m:?} is not an HTTP method; did you mean one of {}?", quoted.join(", "))
        }
    }
}

/// The methods taken within a typo's reach of `upper`, nearest first.
fn near(upper: &str) -> Vec<&'static str> {
    let limit = if upper.chars().count() <= 5 { 1 } else { 2 };
    let mut found: Vec<(usize, &str)> =
        REGISTERED.iter().chain(IN_WIDE_USE).map(|r| (distance(upper, r), *r)).filter(|(d, _)| *d <= limit).collect();
    found.sort();
    found.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_methods_are_taken_in_capitals() {
        let all: Vec<&str> = REGISTERED.iter().chain(IN_WIDE_USE).copied().collect();
        let taken = methods("m", &all.iter().map(|m| m.to_string()).collect::<Vec<_>>()).unwrap();
        assert_eq!(taken.iter().map(Method::as_str).collect::<Vec<_>>(), all);
        let lower: Vec<String> = all.iter().map(|m| m.to_ascii_lowercase()).collect();
        let taken = methods("m", &lower).unwrap();
        assert_eq!(taken.iter().map(Method::as_str).collect::<Vec<_>>(), all);
    }

    #[test]
    fn typos_are_refused_with_their_index_and_near_matches() {
        let cases: &[(&[&str], &str, &str)] = &[
            (&["GTE"], "m[0]", "\"GTE\" is not an HTTP method; did you mean \"GET\"?"),
            (&["GET", "gte"], "m[1]", "\"gte\" is not an HTTP method; did you mean \"GET\"?"),
            (&["DELET"], "m[0]", "did you mean \"DELETE\"?"),
            (&["PTACH"], "m[0]", "did you mean \"PATCH\"?"),
            (&["OPTION"], "m[0]", "did you mean \"OPTIONS\"?"),
            (&["POT"], "m[0]", "did you mean one of \"POST\", \"PUT\"?"),
            (&["PURG"], "m[0]", "did you mean \"PURGE\"?"),
            (&["FROBNICATE"], "m[0]", "not in the IANA HTTP Method Registry; use GET, HEAD"),
            (&["*"], "m[0]", "not in the IANA HTTP Method Registry"),
            (&["PRI"], "m[0]", "\"PRI\" is not in the IANA HTTP Method Registry"),
            (&["GET POST"], "m[0]", "not in the IANA HTTP Method Registry"),
            (&[], "m", "is empty"),
        ];
        for (listed, key, says) in cases {
            let listed: Vec<String> = listed.iter().map(|m| m.to_string()).collect();
            let (k, message) = methods("m", &listed).unwrap_err();
            assert_eq!(k, *key, "{listed:?}: {message}");
            assert!(message.contains(says), "{listed:?}: {message}");
        }
    }
}
