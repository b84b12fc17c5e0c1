//! `Via` (RFC 9110 §7.6.3): the entry this gateway appends to every request
//! and response it forwards, under a name of its own (a pseudonym, random
//! per process unless `server.via` names it), and whether a request has
//! passed this gateway already. A route whose upstream leads back to the
//! gateway (a discovered name that resolves to its own Service) would send
//! each request round until descriptors run out; seeing its own name, the
//! gateway answers 508 Loop Detected (RFC 5842 §7.2) instead.

use std::sync::{Arc, OnceLock};

use http::Version;
use http::header::{self, HeaderMap, HeaderValue};

/// The longest `server.via` name taken.
pub const MAX_NAME: usize = 64;

/// This gateway's `Via` entries, one per protocol version, and its name;
/// shared, as every proxy route holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Via(Arc<Entries>);

#[derive(Debug, PartialEq, Eq)]
struct Entries {
    name: Box<str>,
    /// `1.0 name`, `1.1 name`, `2 name`, `3 name`: made once, cloned per
    /// message.
    entries: [HeaderValue; 4],
}

impl Default for Via {
    /// The process's own pseudonym.
    fn default() -> Via {
        Via::new(default_name()).expect("the random name is a token")
    }
}

impl Via {
    /// The entries for `name`, which must be a token (RFC 9110 §5.6.2) of
    /// at most [`MAX_NAME`] bytes.
    pub fn new(name: &str) -> Result<Via, String> {
        if name.is_empty() || name.len() > MAX_NAME || !name.bytes().all(is_tchar) {
            return Err(format!(
                "{name:?}: must be 1 to {MAX_NAME} letters, digits or any of !#$%&'*+-.^_`|~ (a token)"
            ));
        }
        let entry = |protocol: &str| {
            HeaderValue::from_str(&format!("{protocol} {name}")).expect("a token makes a valid header value")
        };
        let entries = [entry("1.0"), entry("1.1"), entry("2"), entry("3")];
        Ok(Via(Arc::new(Entries { name: name.into(), entries })))
    }

    /// The name in this gateway's entries.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The entry for a message of `version` passing this gateway.
    pub fn entry(&self, version: Version) -> &HeaderValue {
        let entries = &self.0.entries;
        match version {
            Version::HTTP_10 => &entries[0],
            Version::HTTP_2 => &entries[2],
            Version::HTTP_3 => &entries[3],
            _ => &entries[1],
        }
    }

    /// Whether some `Via` entry of `headers` was received by this gateway
    /// (its name, in any case). A comment holding a comma may be read as
    /// an entry of its own: only the client who wrote it can be refused
    /// for that. Linear in the header's length.
    pub fn seen_in(&self, headers: &HeaderMap) -> bool {
        headers.get_all(header::VIA).iter().any(|v| {
            v.as_bytes().split(|&b| b == b',').any(|entry| {
                let mut words = entry.split(|b| *b == b' ' || *b == b'\t').filter(|w| !w.is_empty());
                // The received-protocol, then the received-by.
                words.next();
                words.next().is_some_and(|by| by.eq_ignore_ascii_case(self.0.name.as_bytes()))
            })
        })
    }
}

/// `gateway-` and eight random hex digits, the same for the whole process
/// (a reload keeps it, so a loop is seen across one).
pub fn default_name() -> &'static str {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| format!("gateway-{:08x}", fastrand::u32(..)))
}

/// Whether `b` may be part of a token (RFC 9110 §5.6.2).
pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_table() {
        let cases = [
            ("edge", true),
            ("edge-eu.1", true),
            ("", false),
            ("two words", false),
            ("host:8080", false),
            ("a,b", false),
            ("é", false),
        ];
        for (name, ok) in cases {
            assert_eq!(Via::new(name).is_ok(), ok, "{name:?}");
        }
        assert!(Via::new(&"a".repeat(MAX_NAME)).is_ok());
        assert!(Via::new(&"a".repeat(MAX_NAME + 1)).is_err());
        let d = Via::default();
        assert!(d.name().starts_with("gateway-") && d.name().len() == 16, "{}", d.name());
        assert_eq!(Via::default(), d, "one name for the process");
    }

    #[test]
    fn seen_in_table() {
        let via = Via::new("edge").unwrap();
        let cases: &[(&[&str], bool)] = &[
            (&[], false),
            (&["1.1 other"], false),
            (&["1.1 edge"], true),
            (&["1.0 EDGE"], true),
            (&["HTTP/1.1 edge (comment)"], true),
            (&["1.1 a, 1.1 b,1.1  edge"], true),
            (&["1.1 a", "2 edge"], true),
            (&["1.1 edge2", "1.1 xedge", "1.1 edge:8080"], false),
            // The protocol, not the received-by.
            (&["edge other"], false),
            (&["1.1 other (via edge)"], false),
            (&["", ",,", "1.1"], false),
        ];
        for (values, want) in cases {
            let mut h = HeaderMap::new();
            for v in *values {
                h.append(header::VIA, HeaderValue::from_str(v).unwrap());
            }
            assert_eq!(via.seen_in(&h), *want, "{values:?}");
        }
        assert_eq!(via.entry(Version::HTTP_2), "2 edge");
        assert_eq!(via.entry(Version::HTTP_11), "1.1 edge");
        assert_eq!(via.entry(Version::HTTP_10), "1.0 edge");
    }
}
