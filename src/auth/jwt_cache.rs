//! The tokens a JWT route has verified, so that a client sending the same
//! token again is not charged a signature verification on every request
//! (as Envoy's jwt_authn `jwt_cache_config` does). An entry is keyed by a
//! SHA-256 of the token (the token itself is never kept) and holds its
//! claims and the key set it was verified with. A hit counts only while
//! that set is still the route's current one (a refreshed JWKS that drops a
//! key stops its tokens at once: they are verified again, and fail), and
//! only while `exp` and `nbf` pass against the clock with the leeway, as
//! jsonwebtoken checks them. A failed verification is never remembered.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use moka::Expiry;
use moka::sync::Cache;
use sha2::{Digest, Sha256};

use super::jwks::Keys;
use super::jwt::Claims;

/// An entry outlives its deadline by this in moka, which frees it: moka's
/// timer is monotonic while `exp` is wall-clock time, so the hit's own
/// check against the clock is what refuses an expired token.
const DROP_AFTER_DEADLINE: Duration = Duration::from_secs(60);

/// A SHA-256 of a token.
pub type TokenKey = [u8; 32];

/// A route's verified tokens, at most `capacity` of them.
pub struct TokenCache {
    entries: Cache<TokenKey, Arc<Verified>>,
    /// `leeway`, in seconds: the clock skew allowed on `exp` and `nbf`.
    leeway: u64,
}

/// What a verification established.
struct Verified {
    claims: Arc<Claims>,
    /// The set the token was verified with; a hit needs the current one.
    keys: Arc<Keys>,
    exp: u64,
    nbf: Option<u64>,
}

/// Frees an entry [`DROP_AFTER_DEADLINE`] after its `exp` plus leeway.
struct UntilExpired {
    leeway: u64,
}

impl Expiry<TokenKey, Arc<Verified>> for UntilExpired {
    fn expire_after_create(&self, _: &TokenKey, v: &Arc<Verified>, _: std::time::Instant) -> Option<Duration> {
        let left = v.exp.saturating_add(self.leeway).saturating_sub(now());
        Some(Duration::from_secs(left) + DROP_AFTER_DEADLINE)
    }
}

impl TokenCache {
    pub fn new(capacity: u64, leeway: Duration) -> TokenCache {
        let leeway = leeway.as_secs();
        let entries = Cache::builder().max_capacity(capacity).expire_after(UntilExpired { leeway }).build();
        TokenCache { entries, leeway }
    }

    pub fn key(token: &str) -> TokenKey {
        Sha256::digest(token.as_bytes()).into()
    }

    /// The token's claims, if it was verified with `keys` and its time
    /// window holds now.
    pub fn get(&self, key: &TokenKey, keys: &Arc<Keys>) -> Option<Arc<Claims>> {
        let v = self.entries.get(key)?;
        let current = Arc::ptr_eq(&v.keys, keys) && within(v.exp, v.nbf, self.leeway, now());
        current.then(|| v.claims.clone())
    }

    /// Remembers a token just verified with `keys`. One without a numeric
    /// `exp` is not remembered (the validation requires one).
    pub fn insert(&self, key: TokenKey, keys: Arc<Keys>, claims: Arc<Claims>) {
        let Some(exp) = claims.get("exp").and_then(|e| e.as_u64()) else { return };
        let nbf = claims.get("nbf").and_then(|n| n.as_u64());
        self.entries.insert(key, Arc::new(Verified { claims, keys, exp, nbf }));
    }
}

/// jsonwebtoken's rule: expired when `exp < now - leeway`, not yet valid
/// when `nbf > now + leeway`.
fn within(exp: u64, nbf: Option<u64>, leeway: u64, now: u64) -> bool {
    exp >= now.saturating_sub(leeway) && nbf.is_none_or(|nbf| nbf <= now.saturating_add(leeway))
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_window_with_leeway() {
        // (exp, nbf, leeway, now, passes)
        let cases = [
            (100, None, 0, 100, true),
            (100, None, 0, 101, false),
            (100, None, 5, 105, true),
            (100, None, 5, 106, false),
            (100, Some(50), 0, 50, true),
            (100, Some(50), 0, 49, false),
            (100, Some(50), 5, 45, true),
            (100, Some(50), 5, 44, false),
            (u64::MAX, None, u64::MAX, 0, true),
        ];
        for (exp, nbf, leeway, now, passes) in cases {
            assert_eq!(within(exp, nbf, leeway, now), passes, "exp {exp} nbf {nbf:?} leeway {leeway} now {now}");
        }
    }

    #[test]
    fn a_hit_needs_the_same_key_set() {
        let cache = TokenCache::new(10, Duration::ZERO);
        let (keys, other) = (Arc::new(Keys::new()), Arc::new(Keys::new()));
        let mut claims = Claims::new();
        claims.insert("exp".into(), (now() + 60).into());
        let key = TokenCache::key("a.b.c");
        cache.insert(key, keys.clone(), Arc::new(claims));
        assert!(cache.get(&key, &keys).is_some());
        assert!(cache.get(&key, &other).is_none(), "another set, even an equal one");
        assert!(cache.get(&TokenCache::key("a.b.d"), &keys).is_none());
    }
}
