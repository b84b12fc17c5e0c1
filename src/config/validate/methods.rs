//! The one rule for every key that lists HTTP methods (a route's
//! `methods`): any HTTP token, in capitals, as it always was (`get` is
//! `GET`), so a configuration that loaded before still loads; one that the
//! IANA HTTP Method Registry, or the short list of unregistered ones in
//! wide use, does not hold is warned of with the nearest ones, as a typo
//! (`GTE`) would otherwise be a route that answers 405 to the method meant.

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

/// The methods of the list at `key` (`routes[2].methods`), in capitals (as
/// they always were taken), each refused with its own index unless it is
/// an HTTP token. One outside the registry and [`IN_WIDE_USE`] loads, as
/// it did before the registry was looked at (a custom method, `BAN`,
/// `M-SEARCH`), and [`unregistered`] says so in `check` and at the start.
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
            Method::from_bytes(m.to_ascii_uppercase().as_bytes()).map_err(|_| {
                let why = "is not an HTTP method: a method is a word of letters, digits and !#$%&'*+-.^_`|~";
                (format!("{key}[{i}]"), format!("{:?} {why}", shown(m)))
            })
        })
        .collect()
}

/// A warning for a route's method outside the registry and [`IN_WIDE_USE`]
/// (most likely a typo: `GTE`), with the methods it is nearest to; `None`
/// for one they hold.
pub fn unregistered(m: &Method) -> Option<String> {
    let m = m.as_str();
    if REGISTERED.contains(&m) || IN_WIDE_USE.contains(&m) {
        return None;
    }
    let near = near(m);
    let m = shown(m);
    Some(match near.as_slice() {
        [] => format!("{m:?} is not in the IANA HTTP Method Registry; a request must use it as written"),
        [one] => format!("{m:?} is not a registered HTTP method; did you mean {one:?}?"),
        many => {
            let quoted: Vec<String> = many.iter().map(|n| format!("{n:?}")).collect();
            format!("{m:?} is not a registered HTTP method; did you mean one of {}?", quoted.join(", "))
        }
    })
}

/// A method as a message shows it: its first 64 bytes at most.
fn shown(m: &str) -> &str {
    m.char_indices().nth(64).map_or(m, |(i, _)| &m[..i])
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
    fn typos_are_warned_of_with_near_matches() {
        let cases: &[(&str, &str)] = &[
            ("GTE", "\"GTE\" is not a registered HTTP method; did you mean \"GET\"?"),
            ("gte", "\"GTE\" is not a registered HTTP method; did you mean \"GET\"?"),
            ("DELET", "did you mean \"DELETE\"?"),
            ("PTACH", "did you mean \"PATCH\"?"),
            ("OPTION", "did you mean \"OPTIONS\"?"),
            ("POT", "did you mean one of \"POST\", \"PUT\"?"),
            ("PURG", "did you mean \"PURGE\"?"),
            ("FROBNICATE", "not in the IANA HTTP Method Registry"),
            ("BAN", "not in the IANA HTTP Method Registry"),
        ];
        for (listed, says) in cases {
            let taken = methods("m", &[listed.to_string()]).unwrap();
            let warning = unregistered(&taken[0]).unwrap_or_default();
            assert!(warning.contains(says), "{listed:?}: {warning}");
        }
        for m in ["GET", "PROPFIND", "PURGE", "QUERY"] {
            assert_eq!(unregistered(&Method::from_bytes(m.as_bytes()).unwrap()), None);
        }
        let long = Method::from_bytes("X".repeat(100_000).as_bytes()).unwrap();
        assert!(unregistered(&long).unwrap().len() < 200);
    }

    #[test]
    fn what_is_no_method_or_no_list_is_refused() {
        for (listed, key, says) in [
            (&["GET POST"][..], "m[0]", "is not an HTTP method"),
            (&["G\u{e9}T"], "m[0]", "is not an HTTP method"),
            (&[], "m", "is empty"),
        ] {
            let listed: Vec<String> = listed.iter().map(|m| m.to_string()).collect();
            let (k, message) = methods("m", &listed).unwrap_err();
            assert_eq!(k, key, "{listed:?}: {message}");
            assert!(message.contains(says), "{listed:?}: {message}");
        }
    }
}
