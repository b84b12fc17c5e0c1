//! A proxy route's `cache = { ... }`: sizes and windows parsed, each error
//! naming its key (`routes[2].cache.max_entry`).

use super::{Problem, parse_duration, parse_size};
use crate::config::raw::RawCache;
use crate::config::{CacheConfig, DEFAULT_CACHE_MAX_ENTRY, DEFAULT_CACHE_MAX_SIZE};

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
