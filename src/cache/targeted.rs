//! Targeted cache control (RFC 9213): a response field such as
//! `CDN-Cache-Control` that gives the caches it targets a policy of their
//! own. The first field of the route's list (`cache.targeted`) that the
//! response has with a valid, non-empty value wins wholly: the cache then
//! ignores `Cache-Control` and `Expires` (§2.1). The rules of [`super::rules`]
//! judge the head as it would be with the targeted directives for its
//! `Cache-Control`, so one set of rules serves both; the answer itself is
//! forwarded with every field unchanged.

use std::borrow::Cow;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use sfv::{BareItem, Dictionary, ListEntry, Parser};

use super::rules::DELTA_MAX;

/// `response`'s head as the cache judges it, and the targeted field that
/// decided, if one did: its directives stand for `Cache-Control` and
/// `Expires` is gone. Without a targeted field (the usual case) the head
/// is borrowed as it is.
pub fn judged<'a>(response: &'a HeaderMap, targets: &[HeaderName]) -> (Cow<'a, HeaderMap>, Option<HeaderName>) {
    let Some((name, directives)) = select(response, targets) else {
        return (Cow::Borrowed(response), None);
    };
    let mut head = response.clone();
    head.remove(header::CACHE_CONTROL);
    head.remove(header::EXPIRES);
    if let Some(directives) = directives {
        head.insert(header::CACHE_CONTROL, directives);
    }
    (Cow::Owned(head), Some(name))
}

/// The first of `targets` that `response` has with a valid, non-empty
/// value (RFC 9213 §2.2), and its directives as a `Cache-Control` value
/// (`None`: it has none the cache knows).
pub fn select(response: &HeaderMap, targets: &[HeaderName]) -> Option<(HeaderName, Option<HeaderValue>)> {
    targets.iter().find_map(|name| {
        let lines = response.get_all(name);
        lines.iter().next()?;
        directives(lines.iter()).map(|d| (name.clone(), d))
    })
}

/// A targeted field's lines, joined as one Dictionary (RFC 9651 §4.2), as
/// `Cache-Control` directives: `None` when the field is empty or invalid,
/// `Some(None)` when valid with no directive the cache acts on. The parse
/// is linear in the field, which the upstream's head limit bounds.
fn directives<'a>(lines: impl Iterator<Item = &'a HeaderValue>) -> Option<Option<HeaderValue>> {
    let mut joined = Vec::new();
    for line in lines {
        if !joined.is_empty() {
            joined.extend_from_slice(b", ");
        }
        joined.extend_from_slice(line.as_bytes());
    }
    let dictionary: Dictionary = Parser::new(&joined).parse().ok()?;
    if dictionary.is_empty() {
        return None;
    }
    let mut out = String::new();
    for (key, entry) in &dictionary {
        if let Some(text) = directive(key.as_str(), entry).ok()? {
            if !out.is_empty() {
                out.push_str(", ");
            }
            out.push_str(&text);
        }
    }
    Some((!out.is_empty()).then(|| HeaderValue::from_str(&out).expect("directives are ASCII")))
}

/// A wrongly typed known directive (`max-age="60"`, `max-age=-1`,
/// `no-store=1`): the field is invalid and ignored whole, as a parse error
/// is, rather than read as something the origin did not say.
#[derive(Debug, PartialEq, Eq)]
struct WrongType;

/// One member of a targeted field as a `Cache-Control` directive:
/// `Ok(None)` for one the cache does not act on (an extension, or a flag
/// set to `?0`). Parameters are ignored (RFC 9213 §2.1). The field-name
/// forms of `private` and `no-cache` (a String or an Inner List) count as
/// the plain directive: the cache stores no part of an answer.
fn directive(key: &str, entry: &ListEntry) -> Result<Option<String>, WrongType> {
    let item = match entry {
        ListEntry::Item(item) => Some(&item.bare_item),
        ListEntry::InnerList(_) => None,
    };
    match key {
        "max-age" | "s-maxage" | "stale-while-revalidate" | "stale-if-error" => match item {
            Some(BareItem::Integer(n)) if i64::from(*n) >= 0 => {
                let seconds = u64::try_from(i64::from(*n)).unwrap_or(0).min(DELTA_MAX);
                Ok(Some(format!("{key}={seconds}")))
            }
            _ => Err(WrongType),
        },
        "no-store" | "public" | "must-revalidate" | "proxy-revalidate" => match item {
            Some(BareItem::Boolean(set)) => Ok(set.then(|| key.to_owned())),
            _ => Err(WrongType),
        },
        "private" | "no-cache" => match item {
            Some(BareItem::Boolean(set)) => Ok(set.then(|| key.to_owned())),
            Some(BareItem::String(_)) | None => Ok(Some(key.to_owned())),
            _ => Err(WrongType),
        },
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(fields: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (n, v) in fields {
            h.append(HeaderName::from_bytes(n.as_bytes()).unwrap(), HeaderValue::from_str(v).unwrap());
        }
        h
    }

    fn names(list: &[&str]) -> Vec<HeaderName> {
        list.iter().map(|n| HeaderName::from_bytes(n.as_bytes()).unwrap()).collect()
    }

    /// A targeted field's value as the cache reads it: `None` invalid or
    /// empty (ignored), `Some("")` valid with nothing the cache acts on.
    #[test]
    fn targeted_values() {
        let cases: &[(&str, Option<&str>)] = &[
            ("max-age=3600", Some("max-age=3600")),
            ("max-age=0", Some("max-age=0")),
            ("MaX-aGe=3600", None),
            ("max-age =100", None),
            ("max-age= 100", None),
            ("max-age=10000, &&&&&", None),
            ("max-age=\"10000\"", None),
            ("max-age=-1", None),
            ("max-age=1.5", None),
            ("max-age=(1 2)", None),
            ("max-age=99999999999", Some("max-age=2147483648")),
            ("max-age=2147483648", Some("max-age=2147483648")),
            ("max-age=9999999999999999", None),
            ("foobar, max-age=3600", Some("max-age=3600")),
            ("max-age=60;x=1, no-store;y=?1", Some("max-age=60, no-store")),
            ("max-age=60, max-age=5", Some("max-age=5")),
            ("private", Some("private")),
            ("private=\"set-cookie\"", Some("private")),
            ("no-cache=(\"a\" \"b\")", Some("no-cache")),
            ("no-cache=?0, max-age=5", Some("max-age=5")),
            ("no-store", Some("no-store")),
            ("no-store=1", None),
            ("public=?1, s-maxage=10, must-revalidate", Some("public, s-maxage=10, must-revalidate")),
            ("stale-while-revalidate=30, stale-if-error=60", Some("stale-while-revalidate=30, stale-if-error=60")),
            ("foo", Some("")),
            ("foo=\"a, max-age=9\"", Some("")),
            ("", None),
            ("   ", None),
            (",", None),
        ];
        for (value, want) in cases {
            let h = head(&[("cdn-cache-control", value)]);
            let got = select(&h, &names(&["cdn-cache-control"]));
            let got = got.map(|(_, d)| d.map(|d| d.to_str().unwrap().to_owned()).unwrap_or_default());
            assert_eq!(got.as_deref(), *want, "{value:?}");
        }
    }

    /// The first listed field with a valid value wins; lines of one field
    /// join as one dictionary; the judged head keeps every other field and
    /// loses `Cache-Control` and `Expires`.
    #[test]
    fn selection_and_the_judged_head() {
        let targets = names(&["gateway-cache-control", "cdn-cache-control"]);
        type Case<'a> = (&'a [(&'a str, &'a str)], Option<(&'a str, Option<&'a str>)>);
        let cases: &[Case] = &[
            (&[("cache-control", "max-age=5")], None),
            (
                &[("cdn-cache-control", "max-age=9"), ("cache-control", "no-store")],
                Some(("cdn-cache-control", Some("max-age=9"))),
            ),
            (
                &[("cdn-cache-control", "max-age=9"), ("gateway-cache-control", "no-store")],
                Some(("gateway-cache-control", Some("no-store"))),
            ),
            (
                &[("gateway-cache-control", "max-age=\"1\""), ("cdn-cache-control", "max-age=9")],
                Some(("cdn-cache-control", Some("max-age=9"))),
            ),
            (
                &[("gateway-cache-control", ""), ("cdn-cache-control", "private")],
                Some(("cdn-cache-control", Some("private"))),
            ),
            (
                &[("cdn-cache-control", "max-age=9"), ("cdn-cache-control", "private")],
                Some(("cdn-cache-control", Some("max-age=9, private"))),
            ),
            (&[("cdn-cache-control", "max-age=9"), ("cdn-cache-control", "&")], None),
            (
                &[("cdn-cache-control", "foo"), ("cache-control", "max-age=60"), ("expires", "x")],
                Some(("cdn-cache-control", None)),
            ),
            (&[("surrogate-control", "max-age=9")], None),
        ];
        for (fields, want) in cases {
            let h = head(fields);
            let (judged, decided) = judged(&h, &targets);
            match want {
                None => {
                    assert!(matches!(judged, Cow::Borrowed(_)), "{fields:?}");
                    assert_eq!(decided, None, "{fields:?}");
                }
                Some((name, cc)) => {
                    assert_eq!(decided.as_ref().map(HeaderName::as_str), Some(*name), "{fields:?}");
                    let got = judged.get(header::CACHE_CONTROL).map(|v| v.to_str().unwrap());
                    assert_eq!(got, *cc, "{fields:?}");
                    assert_eq!(judged.get_all(header::CACHE_CONTROL).iter().count(), usize::from(cc.is_some()));
                    assert!(!judged.contains_key(header::EXPIRES), "{fields:?}");
                    for n in targets.iter() {
                        assert_eq!(judged.get_all(n).iter().count(), h.get_all(n).iter().count(), "{fields:?}");
                    }
                }
            }
        }
        assert_eq!(judged(&head(&[("cdn-cache-control", "max-age=9")]), &[]).1, None);
    }

    /// A huge targeted field (a dictionary of many members, one long
    /// string, deep nesting is not in the grammar) parses in one pass.
    #[test]
    fn huge_targeted_values_are_read_in_one_pass() {
        let members = vec!["x=1"; 20_000].join(", ") + ", max-age=7";
        let long = format!("max-age=7, x=\"{}\"", "a".repeat(200_000));
        for value in [members, long] {
            let h = head(&[("cdn-cache-control", &value)]);
            let (_, d) = select(&h, &names(&["cdn-cache-control"])).expect("valid");
            assert_eq!(d.unwrap(), "max-age=7");
        }
    }
}
