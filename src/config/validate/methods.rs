//! The one rule for every key that lists HTTP methods (a route's
//! `methods`): a method is taken only as the IANA HTTP Method Registry
//! spells it, so a typo (`GTE`, `get`) is an error at load rather than a
//! route that answers 405 to the method that was meant.

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

/// The methods of the list at `key` (`routes[2].methods`), each refused
/// with its own index unless the registry holds it as written.
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
            if !REGISTERED.contains(&m.as_str()) {
                return Err(refused(unregistered(m)));
            }
            Method::from_bytes(m.as_bytes()).map_err(|_| refused(format!("{m:?} is not an HTTP method")))
        })
        .collect()
}

/// Why `m` is refused, with the registered methods it is nearest to.
fn unregistered(m: &str) -> String {
    let upper = m.to_ascii_uppercase();
    if REGISTERED.contains(&upper.as_str()) {
        return format!("{m:?}: methods are case-sensitive; did you mean {upper:?}?");
    }
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

/// The registered methods within a typo's reach of `upper`, nearest first.
fn near(upper: &str) -> Vec<&'static str> {
    let limit = if upper.chars().count() <= 5 { 1 } else { 2 };
    let mut found: Vec<(usize, &str)> =
        REGISTERED.iter().map(|r| (distance(upper, r), *r)).filter(|(d, _)| *d <= limit).collect();
    found.sort();
    found.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_methods_are_taken_as_written() {
        let all: Vec<String> = REGISTERED.iter().map(|m| m.to_string()).collect();
        let taken = methods("m", &all).unwrap();
        assert_eq!(taken.iter().map(Method::as_str).collect::<Vec<_>>(), REGISTERED);
    }

    #[test]
    fn typos_are_refused_with_their_index_and_near_matches() {
        let cases: &[(&[&str], &str, &str)] = &[
            (&["GTE"], "m[0]", "\"GTE\" is not an HTTP method; did you mean \"GET\"?"),
            (&["GET", "get"], "m[1]", "\"get\": methods are case-sensitive; did you mean \"GET\"?"),
            (&["Post"], "m[0]", "did you mean \"POST\"?"),
            (&["DELET"], "m[0]", "did you mean \"DELETE\"?"),
            (&["PTACH"], "m[0]", "did you mean \"PATCH\"?"),
            (&["OPTION"], "m[0]", "did you mean \"OPTIONS\"?"),
            (&["POT"], "m[0]", "did you mean one of \"POST\", \"PUT\"?"),
            (&["PURGE"], "m[0]", "not in the IANA HTTP Method Registry; use GET, HEAD"),
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
