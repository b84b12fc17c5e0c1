//! JWT bearer tokens (RFC 7519) checked as RFC 8725 asks: the algorithm
//! must be one the operator listed (never `none`, never HMAC: a public key
//! is no secret), the key is chosen by `kid` from the configured JWKS and
//! must be of the token's algorithm's family, and `exp`, `nbf`, `iss` and
//! `aud` are checked with a small leeway. Verification is fast next to a
//! password hash, so it runs in place; a verified token is remembered
//! (`jwt_cache`) so that sending it again costs a lookup instead.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, header};
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{AlgorithmFamily, Validation};
use serde_json::{Map, Value};

use super::jwks::{Jwks, Keys};
use super::jwt_cache::TokenCache;
use crate::config::access::{JwksSource, JwtConfig, TokenSource};
use crate::error::GatewayError;
use crate::headers::via::is_tchar;

const KIND: &str = "jwt";

/// A route's JWT check, built at load from the JWKS file as read then.
pub struct Jwt {
    keys: Arc<Jwks>,
    /// One per key family of the listed algorithms: jsonwebtoken wants a
    /// validation's algorithms all of one family.
    validations: Vec<(AlgorithmFamily, Validation)>,
    from: TokenSource,
    pub(super) forward_claims: Vec<(http::HeaderName, String)>,
    /// Tokens verified already; `None` with `cache_tokens = 0`.
    cache: Option<TokenCache>,
    /// An `issuer` is configured: the token's `iss` must be that one
    /// string, not an array holding it (see [`Jwt::check`]).
    issuer: bool,
}

/// A verified token's claims.
pub type Claims = Map<String, Value>;

impl Jwt {
    /// `previous`: the running route's check, whose `jwks_url` keys a
    /// reload keeps (see [`Jwks::remote`]).
    pub fn new(c: &JwtConfig, previous: Option<&Jwt>) -> Jwt {
        let keys = match &c.source {
            JwksSource::File { keys, .. } => Jwks::fixed(keys),
            JwksSource::Url { url, refresh } => {
                Jwks::remote(url, *refresh, &c.algorithms, previous.map(|p| p.keys.as_ref()))
            }
        };
        let mut validation = Validation::new(c.algorithms[0]);
        validation.leeway = c.leeway.as_secs();
        validation.validate_nbf = true;
        let mut required = vec!["exp"];
        if let Some(iss) = &c.issuer {
            validation.set_issuer(&[iss]);
            required.push("iss");
        }
        if c.audiences.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&c.audiences);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        let mut validations: Vec<(AlgorithmFamily, Validation)> = Vec::new();
        for alg in &c.algorithms {
            match validations.iter_mut().find(|(f, _)| *f == alg.family()) {
                Some((_, v)) => v.algorithms.push(*alg),
                None => {
                    let mut v = validation.clone();
                    v.algorithms = vec![*alg];
                    validations.push((alg.family(), v));
                }
            }
        }
        let cache = (c.cache_tokens > 0).then(|| TokenCache::new(c.cache_tokens, c.leeway));
        let (from, forward_claims, issuer) = (c.from.clone(), c.forward_claims.clone(), c.issuer.is_some());
        Jwt { keys, validations, from, forward_claims, cache, issuer }
    }

    /// Whether the token is read from `Authorization` (which is then removed
    /// before forwarding unless `forward_credentials`).
    pub fn from_authorization(&self) -> bool {
        self.from == TokenSource::Authorization
    }

    /// The token's claims, when it is valid: remembered from an earlier
    /// verification with the current keys, or verified now.
    pub async fn verify(&self, headers: &HeaderMap) -> Result<Arc<Claims>, GatewayError> {
        let Some(token) = token(headers, &self.from) else {
            // RFC 6750 §3.1: a request without a token gets no error code.
            return Err(refuse("no token", HeaderValue::from_static("Bearer")));
        };
        let Some(cache) = &self.cache else { return Ok(Arc::new(self.check(token).await?.0)) };
        let key = TokenCache::key(token);
        if let Some(keys) = self.keys.current()
            && let Some(claims) = cache.get(&key, &keys)
        {
            return Ok(claims);
        }
        let (claims, keys) = self.check(token).await?;
        let claims = Arc::new(claims);
        cache.insert(key, keys, claims.clone());
        Ok(claims)
    }

    /// Verifies the token: its claims and the keys it was verified with.
    async fn check(&self, token: &str) -> Result<(Claims, Arc<Keys>), GatewayError> {
        let invalid = |reason| refuse(reason, HeaderValue::from_static("Bearer error=\"invalid_token\""));
        // `alg: none` and unknown algorithms fail to parse here.
        let head = jsonwebtoken::decode_header(token).map_err(|_| invalid("malformed token or unknown alg"))?;
        let Some((_, validation)) = self.validations.iter().find(|(_, v)| v.algorithms.contains(&head.alg)) else {
            return Err(invalid("alg not allowed"));
        };
        let kid = head.kid.as_deref().ok_or_else(|| invalid("no kid"))?;
        // None: a URL's first fetch has not succeeded (its task keeps trying).
        let Some(mut keys) = self.keys.current() else {
            return Err(GatewayError::AuthError { kind: KIND, detail: "no JWKS keys yet".into() });
        };
        if !keys.contains_key(kid)
            && let Some(fetched) = self.keys.refetch().await
        {
            keys = fetched;
        }
        let (key, pinned) = keys.get(kid).ok_or_else(|| invalid("unknown kid"))?;
        let pinned_other = pinned.as_deref().is_some_and(|p| p != format!("{:?}", head.alg));
        if key.family() != head.alg.family() || pinned_other {
            return Err(invalid("key does not fit alg"));
        }
        match jsonwebtoken::decode::<Claims>(token, key, validation) {
            // jsonwebtoken takes an array `iss` holding the issuer as a
            // match; RFC 7519 §4.1.1 makes `iss` one string, and an
            // upstream reading the forwarded claim could take another item.
            Ok(data) if self.issuer && !data.claims.get("iss").is_some_and(Value::is_string) => {
                Err(invalid("wrong issuer"))
            }
            Ok(data) => Ok((data.claims, keys)),
            Err(e) => Err(invalid(match e.kind() {
                ErrorKind::ExpiredSignature => "expired",
                ErrorKind::ImmatureSignature => "not yet valid",
                ErrorKind::InvalidIssuer => "wrong issuer",
                ErrorKind::InvalidAudience => "wrong audience",
                ErrorKind::InvalidSignature => "bad signature",
                ErrorKind::MissingRequiredClaim(_) => "missing a required claim",
                ErrorKind::InvalidAlgorithm => "alg not allowed",
                _ => "invalid token",
            })),
        }
    }
}

fn refuse(reason: &'static str, challenge: HeaderValue) -> GatewayError {
    GatewayError::Unauthorized { kind: KIND, reason, challenge }
}

/// The whitespace cookie parsers trim around a cookie's name and value.
const COOKIE_SPACE: [char; 4] = [' ', '\t', '\r', '\n'];

/// The token from where the route reads it.
fn token<'h>(headers: &'h HeaderMap, from: &TokenSource) -> Option<&'h str> {
    match from {
        TokenSource::Authorization => {
            // Exactly one: the upstream (forward_credentials) could read
            // another copy than the one checked here.
            let mut values = headers.get_all(header::AUTHORIZATION).iter();
            let value = values.next()?.to_str().ok()?;
            if values.next().is_some() {
                return None;
            }
            let (scheme, token) = value.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim()).filter(|t| !t.is_empty())
        }
        TokenSource::Cookie(name) => {
            // Every pair whose name, trimmed, is the one configured counts
            // (`session =x`, a bare `session`), in every Cookie line, read
            // as bytes (a line with a byte past ASCII was skipped, and a
            // second copy in it went uncounted): the cookie parsers of
            // common upstreams (Go's, Python's, Node's) trim names, so a
            // copy the gateway did not count could be the one they read.
            let name = name.as_bytes();
            let lines = || headers.get_all(header::COOKIE).iter().map(HeaderValue::as_bytes);
            let mut found = lines()
                .flat_map(|line| line.split(|&b| b == b';'))
                .map(|pair| match pair.iter().position(|&b| b == b'=') {
                    Some(at) => (&pair[..at], &pair[at + 1..]),
                    None => (pair, &pair[pair.len()..]),
                })
                .filter(|(n, _)| trim_to_token(n) == name);
            let (_, value) = found.next()?;
            // Exactly one cookie of the name: the upstream gets the Cookie
            // header whole, and could read another copy than the one
            // checked; counted again where a parser splitting at `,` or
            // whitespace too (RFC 2965's, Python's `SimpleCookie`) would
            // find one.
            if found.next().is_some() || lines().map(|line| name_count(line, name)).sum::<usize>() != 1 {
                return None;
            }
            let value = std::str::from_utf8(value).ok()?;
            Some(value.trim_matches(COOKIE_SPACE).trim_matches('"')).filter(|t| !t.is_empty())
        }
    }
}

/// `name` without what no token holds at its ends: spaces and tabs, and
/// what some parsers trim too (Python's `strip()` takes U+00A0, a byte
/// past ASCII here).
fn trim_to_token(name: &[u8]) -> &[u8] {
    let start = name.iter().position(|&b| is_tchar(b)).unwrap_or(name.len());
    let end = name.iter().rposition(|&b| is_tchar(b)).map_or(start, |at| at + 1);
    &name[start..end]
}

/// How often `name` stands as a cookie's name in `line` by the loosest
/// reading: after no token character, and followed (past anything but
/// one, `=`, `;` and `,`) by `=`, `;`, `,` or the line's end.
fn name_count(line: &[u8], name: &[u8]) -> usize {
    (0..line.len())
        .filter(|&at| {
            line[at..].starts_with(name) && (at == 0 || !is_tchar(line[at - 1])) && {
                let mut rest = line[at + name.len()..].iter().skip_while(|&&b| !is_tchar(b) && !b"=;,".contains(&b));
                matches!(rest.next(), None | Some(b'=' | b';' | b','))
            }
        })
        .count()
}

/// A claim's value as a header value: numbers and booleans as JSON writes
/// them, strings as they are, a list of those joined by `, `; a string
/// (alone or a list's member) that holds a comma, a quote or edge
/// whitespace, or is empty, as a quoted string (RFC 9110 §5.6.4), so
/// neither `["users, admin"]` nor `"users, admin"` ever reads as
/// `["users", "admin"]`; `None` for anything else, or a value a header
/// cannot carry.
pub fn claim_value(claim: &Value) -> Option<HeaderValue> {
    let text = match claim {
        Value::String(s) => list_member(s),
        Value::Number(_) | Value::Bool(_) => claim.to_string(),
        Value::Array(items) => {
            let parts: Option<Vec<String>> = items
                .iter()
                .map(|i| match i {
                    Value::String(s) => Some(list_member(s)),
                    Value::Number(_) | Value::Bool(_) => Some(i.to_string()),
                    _ => None,
                })
                .collect();
            parts?.join(", ")
        }
        _ => return None,
    };
    HeaderValue::from_str(&text).ok()
}

/// A string as written in a header list (a list's member, or a string
/// claim, which a recipient must not read as a list): as it is, or quoted
/// when a recipient splitting the list at commas would read it otherwise.
fn list_member(s: &str) -> String {
    let plain = !s.is_empty() && !s.contains([',', '"']) && s.trim_matches([' ', '\t']) == s;
    if plain {
        return s.to_owned();
    }
    let mut quoted = Vec::with_capacity(s.len() + 2);
    crate::headers::push_quoted(&mut quoted, s.as_bytes());
    String::from_utf8(quoted).expect("quoting adds only ASCII to UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_sources() {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer abc.def.ghi".parse().unwrap());
        h.append(header::COOKIE, "a=1; session=tok.en.x".parse().unwrap());
        assert_eq!(token(&h, &TokenSource::Authorization), Some("abc.def.ghi"));
        assert_eq!(token(&h, &TokenSource::Cookie("session".into())), Some("tok.en.x"));
        assert_eq!(token(&h, &TokenSource::Cookie("other".into())), None);
        h.insert(header::AUTHORIZATION, "Basic abc".parse().unwrap());
        assert_eq!(token(&h, &TokenSource::Authorization), None);
        // Every cookie whose trimmed name is the one configured counts, in
        // every Cookie line; two are refused.
        let session = TokenSource::Cookie("session".into());
        let cases: Vec<(Vec<&str>, Option<&str>)> = vec![
            (vec!["session=t"], Some("t")),
            (vec!["a=1;session = t "], Some("t")),
            (vec!["session=\"t\""], Some("t")),
            (vec!["session=t; session =forged"], None),
            (vec!["session=t; session\t=forged"], None),
            (vec!["session=t;  session=forged"], None),
            (vec!["session=t", "session =forged"], None),
            (vec!["session=t; session"], None),
            (vec!["session=t; sessions=x; xsession=y; Session=z"], Some("t")),
            (vec!["session="], None),
            // A line with bytes past ASCII is read too; a copy behind a
            // comma or a space, or after a byte a parser trims, counts.
            (vec!["x=\u{ff}; session=t"], Some("t")),
            (vec!["session=t", "x=\u{ff}; session=forged"], None),
            (vec!["session=t; x=1, session=forged"], None),
            (vec!["session=t; x=1 session=forged"], None),
            (vec!["session=t", "\u{a0}session=forged"], None),
            (vec!["session=t; session\u{a0}=forged"], None),
            (vec!["session=t; a=b,sessionx=y"], Some("t")),
        ];
        for (lines, want) in cases {
            let mut h = HeaderMap::new();
            for line in &lines {
                // Bytes past ASCII as one byte each, as a client may send them.
                let bytes: Vec<u8> = line.chars().map(|c| u8::try_from(u32::from(c)).unwrap()).collect();
                h.append(header::COOKIE, HeaderValue::from_bytes(&bytes).unwrap());
            }
            assert_eq!(token(&h, &session), want, "{lines:?}");
        }
    }

    #[test]
    fn claim_values_as_headers() {
        let cases: Vec<(Value, Option<&str>)> = vec![
            (Value::from("ann"), Some("ann")),
            (Value::from(42), Some("42")),
            (Value::from(true), Some("true")),
            (serde_json::json!(["a", "b"]), Some("a, b")),
            (serde_json::json!(["users, admin"]), Some("\"users, admin\"")),
            (serde_json::json!(["a\"b", "c\\d", " e", ""]), Some("\"a\\\"b\", c\\d, \" e\", \"\"")),
            (serde_json::json!(["a", 1, true]), Some("a, 1, true")),
            (serde_json::json!({"x": 1}), None),
            (serde_json::json!([{"x": 1}]), None),
            (Value::from("line\nbreak"), None),
            // A plain string by the list members' rule: `"a,b"` is not
            // the list `["a", "b"]`, nor `""` the empty list.
            (Value::from("a,b"), Some("\"a,b\"")),
            (serde_json::json!(["a,b"]), Some("\"a,b\"")),
            (serde_json::json!(["a", "b"]), Some("a, b")),
            (Value::from("a\"b"), Some("\"a\\\"b\"")),
            (Value::from(" e"), Some("\" e\"")),
            (Value::from(""), Some("\"\"")),
            (serde_json::json!([]), Some("")),
            (Value::from("c\\d"), Some("c\\d")),
            (Value::from("ann@example.com"), Some("ann@example.com")),
        ];
        for (claim, want) in cases {
            assert_eq!(claim_value(&claim).as_ref().map(|v| v.to_str().unwrap()), want, "{claim}");
        }
    }
}
