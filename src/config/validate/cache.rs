//! A proxy route's `cache = { ... }`: sizes and windows parsed, each error
//! naming its key (`routes[2].cache.max_entry`).

use super::{Problem, parse_duration, parse_size};
use crate::config::raw::RawCache;
use crate::config::{CacheConfig, DEFAULT_CACHE_MAX_ENTRY, DEFAULT_CACHE_MAX_SIZE, MAX_TARGETED_NAME};

/// The targeted field a cache route obeys when `cache.targeted` is unset:
/// `CDN-Cache-Control`, the one RFC 9213 defines for the caches of whoever
/// runs the origin's front.
const DEFAULT_TARGETED: &str = "cdn-cache-control";
/// The most names `cache.targeted` takes.
const MAX_TARGETED: usize = 8;

pub(super) fn cache(raw: &RawCache, key: &dyn Fn(&str) -> String) -> Result<CacheConfig, Problem> {
    let size = |k: &str, v, default| match v {
        Some(v) => parse_size(&key(k), v),
        None => Ok(default),
    };
    let duration = |k: &str, v: &Option<String>| match v {
        Some(v) => parse_duration(&key(k), v),
        None => Ok(std::time::Duration::ZERO),
    };
    let config = CacheConfig {
        max_size: size("cache.max_size", raw.max_size.as_ref(), DEFAULT_CACHE_MAX_SIZE)?,
        max_entry: size("cache.max_entry", raw.max_entry.as_ref(), DEFAULT_CACHE_MAX_ENTRY)?,
        default_ttl: duration("cache.default_ttl", &raw.default_ttl)?,
        coalesce: raw.coalesce.unwrap_or(true),
        stale_while_revalidate: duration("cache.stale_while_revalidate", &raw.stale_while_revalidate)?,
        stale_if_error: duration("cache.stale_if_error", &raw.stale_if_error)?,
        targeted: targeted(raw.targeted.as_deref(), &key("cache.targeted"))?,
    };
    if config.max_size == 0 {
        return Err((key("cache.max_size"), "must be at least 1 byte".into()));
    }
    if config.max_entry == 0 {
        return Err((key("cache.max_entry"), "must be at least 1 byte".into()));
    }
    if config.max_entry > config.max_size {
        return Err((key("cache.max_entry"), "must not be larger than cache.max_size".into()));
    }
    // moka weighs entries in u32.
    if config.max_entry > u64::from(u32::MAX) {
        return Err((key("cache.max_entry"), "must be under 4GiB".into()));
    }
    Ok(config)
}

/// `cache.targeted`: field names (any case), each a header name that starts
/// with a letter, at most `MAX_TARGETED_NAME` bytes, not `Cache-Control`
/// and not twice; unset: `CDN-Cache-Control`; `[]`: none.
fn targeted(raw: Option<&[String]>, key: &str) -> Result<std::sync::Arc<[http::HeaderName]>, Problem> {
    let Some(raw) = raw else {
        return Ok(vec![http::HeaderName::from_static(DEFAULT_TARGETED)].into());
    };
    if raw.len() > MAX_TARGETED {
        return Err((key.to_owned(), format!("at most {MAX_TARGETED} fields")));
    }
    let mut names: Vec<http::HeaderName> = Vec::with_capacity(raw.len());
    for name in raw {
        let bad = |why: &str| Err((key.to_owned(), format!("{name:?} {why}")));
        let Ok(parsed) = http::HeaderName::from_bytes(name.as_bytes()) else {
            return bad("is not a header name");
        };
        if !name.starts_with(|c: char| c.is_ascii_alphabetic()) || name.len() > MAX_TARGETED_NAME {
            return bad(&format!("must start with a letter and be at most {MAX_TARGETED_NAME} bytes"));
        }
        if parsed == http::header::CACHE_CONTROL {
            return bad("is the field a targeted one replaces");
        }
        if names.contains(&parsed) {
            return bad("is listed twice");
        }
        names.push(parsed);
    }
    Ok(names.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targeted_lists() {
        let ok: &[(Option<&[&str]>, &[&str])] = &[
            (None, &["cdn-cache-control"]),
            (Some(&[]), &[]),
            (Some(&["Gateway-Cache-Control", "CDN-Cache-Control"]), &["gateway-cache-control", "cdn-cache-control"]),
        ];
        for (raw, want) in ok {
            let raw: Option<Vec<String>> = raw.map(|r| r.iter().map(|s| s.to_string()).collect());
            let got = targeted(raw.as_deref(), "k").unwrap();
            assert_eq!(got.iter().map(|n| n.as_str()).collect::<Vec<_>>(), *want);
        }
        let long = "x".repeat(MAX_TARGETED_NAME + 1);
        let many: Vec<String> = (0..=MAX_TARGETED).map(|i| format!("x-{i}")).collect();
        let bad: &[(&[&str], &str)] = &[
            (&["bad name"], "not a header name"),
            (&["1-cache-control"], "start with a letter"),
            (&[&long], "start with a letter"),
            (&["Cache-Control"], "replaces"),
            (&["a-cc", "A-CC"], "twice"),
            (&[""], "not a header name"),
        ];
        for (raw, want) in bad {
            let raw: Vec<String> = raw.iter().map(|s| s.to_string()).collect();
            let (k, msg) = targeted(Some(&raw), "k").unwrap_err();
            assert_eq!(k, "k");
            assert!(msg.contains(want), "{raw:?}: {msg}");
        }
        assert!(targeted(Some(&many), "k").unwrap_err().1.contains("at most"));
    }
}
