//! A route's access control as validated at load: who may come in by
//! address (`allow`, `deny`) and by credential (`auth`). The files these
//! keys name (an htpasswd file, a JWKS) are read here, at load and on every
//! reload, so a bad entry is refused before anything binds, naming its line;
//! `crate::auth` builds the checks the data path runs from them.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use http::HeaderName;
use ipnet::IpNet;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};

/// A route's `allow`, `deny`, `auth` and `forward_credentials`.
#[derive(Debug, Clone)]
pub struct AccessConfig {
    /// With any entry, a client address outside them all is refused.
    pub allow: Vec<IpNet>,
    /// A client address inside any of them is refused (before `allow`).
    pub deny: Vec<IpNet>,
    pub auth: Option<AuthConfig>,
    /// `Authorization` reaches the upstream after Basic or JWT consumed it.
    pub forward_credentials: bool,
}

impl AccessConfig {
    /// For `gateway check`: ` allow [..] deny [..] auth basic FILE (N users)`.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        if !self.allow.is_empty() {
            out += &format!(" allow {:?}", self.allow.iter().map(ToString::to_string).collect::<Vec<_>>());
        }
        if !self.deny.is_empty() {
            out += &format!(" deny {:?}", self.deny.iter().map(ToString::to_string).collect::<Vec<_>>());
        }
        match &self.auth {
            Some(AuthConfig::Basic(b)) => {
                out += &format!(" auth basic {} ({} users)", b.htpasswd.display(), b.users.len());
            }
            Some(AuthConfig::Jwt(j)) => match &j.source {
                JwksSource::File { path, keys } => {
                    out += &format!(" auth jwt {} ({} keys)", path.display(), keys.keys.len());
                }
                JwksSource::Url { url, .. } => out += &format!(" auth jwt {}", super::redact_url(&url.to_string())),
            },
            Some(AuthConfig::Forward(f)) => {
                out += &format!(" auth forward {}", super::redact_url(&f.url.to_string()));
            }
            None => {}
        }
        out
    }
}

impl AccessConfig {
    /// The request headers the route's `auth` sets in place of the
    /// client's (a JWT's `forward_claims`, a forward auth service's
    /// `response_headers`).
    pub fn sets(&self) -> Vec<HeaderName> {
        match &self.auth {
            Some(AuthConfig::Jwt(j)) => j.forward_claims.iter().map(|(n, _)| n.clone()).collect(),
            Some(AuthConfig::Forward(f)) => f.response_headers.clone(),
            Some(AuthConfig::Basic(_)) | None => Vec::new(),
        }
    }

    /// The request headers the route's `auth` sets (a JWT's
    /// `forward_claims`, a forward auth service's `response_headers`) or
    /// decides on (the token's cookie, the headers sent to the auth
    /// service): a client's request trailers may not carry them, or an
    /// upstream that merges trailers into headers would read the client's
    /// copy beside (or instead of) the one the gateway set or checked.
    pub fn guarded_headers(&self) -> Vec<HeaderName> {
        let mut names = self.sets();
        match &self.auth {
            Some(AuthConfig::Jwt(j)) if matches!(j.from, TokenSource::Cookie(_)) => names.push(http::header::COOKIE),
            Some(AuthConfig::Forward(f)) => names.extend(f.request_headers.iter().cloned()),
            _ => {}
        }
        names
    }
}

/// `auth`: one kind per route.
#[derive(Debug, Clone)]
pub enum AuthConfig {
    Basic(BasicConfig),
    Jwt(JwtConfig),
    Forward(ForwardConfig),
}

/// `auth.forward`: nginx `auth_request` / Traefik `ForwardAuth`.
#[derive(Debug, Clone)]
pub struct ForwardConfig {
    /// An `http://` URL the gateway asks (`GET`, no body).
    pub url: http::Uri,
    /// Past it (or the service unreachable): 503.
    pub timeout: Duration,
    /// Client headers sent along to the auth service.
    pub request_headers: Vec<HeaderName>,
    /// Headers of a 2xx answer copied onto the request (replacing the
    /// client's own).
    pub response_headers: Vec<HeaderName>,
    /// Asks under way at once, at most; more wait for a turn within
    /// `timeout` (then 503), so one client's burst cannot open a connection
    /// to the service for each request.
    pub max_concurrent: usize,
}

/// `auth.basic`.
#[derive(Debug, Clone)]
pub struct BasicConfig {
    /// The file the users were read from (for messages).
    pub htpasswd: PathBuf,
    /// The `realm` of the `WWW-Authenticate` challenge.
    pub realm: String,
    /// How long a successful verification is remembered (0: never).
    pub remember: Duration,
    pub users: Vec<HtpasswdEntry>,
}

/// One `user:hash` line of an htpasswd file.
#[derive(Clone, PartialEq, Eq)]
pub struct HtpasswdEntry {
    pub user: String,
    pub hash: String,
    pub kind: HashKind,
}

impl fmt::Debug for HtpasswdEntry {
    /// Without the hash: it is a secret too.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HtpasswdEntry").field("user", &self.user).field("kind", &self.kind).finish()
    }
}

/// The password hashes accepted, each verified by a RustCrypto or
/// well-kept crate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashKind {
    /// `$2y$`, `$2b$`, `$2a$` (the `bcrypt` crate).
    Bcrypt,
    /// `$5$` (SHA-256) and `$6$` (SHA-512) (the `sha-crypt` crate).
    ShaCrypt,
    /// `$argon2id$`, `$argon2i$`, `$argon2d$` (the `argon2` crate).
    Argon2,
}

/// `auth.jwt`.
#[derive(Debug, Clone)]
pub struct JwtConfig {
    /// Where the keys come from.
    pub source: JwksSource,
    /// The `iss` a token must carry, if set.
    pub issuer: Option<String>,
    /// A token's `aud` must hold one of these, if any.
    pub audiences: Vec<String>,
    /// Asymmetric algorithms only (RFC 8725 §3.1: HMAC with a public key).
    pub algorithms: Vec<Algorithm>,
    /// Clock skew allowed on `exp` and `nbf`.
    pub leeway: Duration,
    pub from: TokenSource,
    /// Request header to the upstream, and the claim whose value it carries.
    pub forward_claims: Vec<(HeaderName, String)>,
    /// Verified tokens remembered at most (0: none, every token verified).
    pub cache_tokens: u64,
}

/// A route's JWKS: a file read at load (and reload), or a URL fetched at
/// start and refreshed.
#[derive(Debug, Clone)]
pub enum JwksSource {
    /// Every key checked by [`parse_jwks`].
    File { path: PathBuf, keys: JwkSet },
    /// Fetched again every `refresh`, or as its `Cache-Control: max-age` says.
    Url { url: http::Uri, refresh: Duration },
}

/// A JWKS whose every key has a `kid`, is a public key (no `oct`: RFC
/// 8725 §3.2) and is meant for signatures (no `"use": "enc"`, and a
/// `key_ops` holds `verify`), less the keys whose own `alg` is not in `algorithms`: one
/// JWKS commonly serves several algorithms, and a route that accepts some
/// of them uses those keys only. Used for the file at load and for what a
/// `jwks_url` serves.
pub fn parse_jwks(text: &str, algorithms: &[Algorithm]) -> Result<JwkSet, String> {
    let set: JwkSet = serde_json::from_str(text).map_err(|e| format!("not a JWKS: {e}"))?;
    parse_jwks_keys(set, algorithms)
}

fn parse_jwks_keys(mut set: JwkSet, algorithms: &[Algorithm]) -> Result<JwkSet, String> {
    if set.keys.is_empty() {
        return Err("no keys".into());
    }
    for (i, jwk) in set.keys.iter().enumerate() {
        let at = |m: &str| format!("keys[{i}]: {m}");
        if jwk.common.key_id.as_deref().is_none_or(str::is_empty) {
            return Err(at("no \"kid\": tokens choose their key by it"));
        }
        if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
            return Err(at("a symmetric (\"oct\") key is refused (RFC 8725 §3.2)"));
        }
        // RFC 7517 §4.2-4.3: a key its issuer meant for encryption only
        // verifies no signature (RFC 8725 §3.12: no key for two purposes).
        if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
            return Err(at("an encryption key (\"use\": \"enc\") is refused: tokens are verified with \"sig\" keys"));
        }
        if jwk.common.key_operations.as_ref().is_some_and(|ops| !ops.contains(&KeyOperations::Verify)) {
            return Err(at("a key whose \"key_ops\" lacks \"verify\" is refused"));
        }
        if let AlgorithmParameters::RSA(rsa) = &jwk.algorithm
            && let Some(problem) = rsa_problem(&rsa.n, &rsa.e)
        {
            return Err(at(&problem));
        }
        DecodingKey::from_jwk(jwk).map_err(|e| at(&format!("unusable key: {e}")))?;
    }
    let listed =
        |alg: &jsonwebtoken::jwk::KeyAlgorithm| algorithms.iter().any(|a| format!("{a:?}") == format!("{alg:?}"));
    set.keys.retain(|jwk| jwk.common.key_algorithm.as_ref().is_none_or(listed));
    if set.keys.is_empty() {
        return Err("no key of the listed algorithms (every key's \"alg\" is another)".into());
    }
    Ok(set)
}

/// Why an RSA key (modulus `n`, exponent `e`, base64url) verifies no
/// token worth trusting, or costs too much to try: a modulus under 2048
/// bits (RFC 7518 §3.3) or over 8192 (each token, good or forged, costs a
/// verification with it), an exponent under 3 or even (no RSA key has
/// one: `e = 1` "verifies" anything its holder computes) or one the
/// verifier refuses.
fn rsa_problem(n: &str, e: &str) -> Option<String> {
    use base64::Engine;
    let decode = |v: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(v.trim_end_matches('=')).ok();
    let (Some(n), Some(e)) = (decode(n), decode(e)) else {
        return Some("an RSA key whose \"n\" or \"e\" is not base64url".into());
    };
    fn significant(b: &[u8]) -> &[u8] {
        b.iter().position(|&x| x != 0).map_or(&[][..], |i| &b[i..])
    }
    let (n, e) = (significant(&n), significant(&e));
    let bits = n.first().map_or(0, |top| (n.len() - 1) * 8 + (8 - top.leading_zeros() as usize));
    if !(2048..=8192).contains(&bits) {
        return Some(format!("an RSA key of {bits} bits is refused: 2048 to 8192 (RFC 7518 §3.3)"));
    }
    // The verifier (ring) takes exponents of 3 to 2^33 - 1 only.
    let value = (e.len() <= 8).then(|| e.iter().fold(0u64, |v, b| v << 8 | u64::from(*b)));
    let odd = e.last().is_some_and(|last| last & 1 == 1);
    if !odd || !value.is_some_and(|v| (3..1 << 33).contains(&v)) {
        return Some("an RSA key whose exponent is even, under 3 or over 2^33 - 1 is refused".into());
    }
    None
}

/// A JWKS a key server answered: its usable keys, and why the others were
/// skipped. A key server's set is not the operator's file: it may also
/// carry encryption keys, key types this verifier does not know, or keys
/// of other algorithms, and one such key must not make every token fail
/// (the file's keys are all checked, and any problem refuses it at load).
pub fn parse_fetched_jwks(text: &str, algorithms: &[Algorithm]) -> Result<(JwkSet, Vec<String>), String> {
    #[derive(serde::Deserialize)]
    struct AnySet {
        keys: Vec<serde_json::Value>,
    }
    let set: AnySet = serde_json::from_str(text).map_err(|e| format!("not a JWKS: {e}"))?;
    let (mut keys, mut skipped) = (Vec::new(), Vec::new());
    for (i, value) in set.keys.into_iter().enumerate() {
        let encryption = value.get("use").and_then(|u| u.as_str()) == Some("enc");
        let checked = match serde_json::from_value::<jsonwebtoken::jwk::Jwk>(value) {
            Err(e) => Err(format!("not a key this gateway can use: {e}")),
            Ok(_) if encryption => Err("an encryption key (\"use\": \"enc\")".into()),
            Ok(jwk) => parse_jwks_keys(JwkSet { keys: vec![jwk] }, algorithms),
        };
        match checked {
            Ok(one) => keys.extend(one.keys),
            Err(why) => skipped.push(format!("keys[{i}]: {}", why.trim_start_matches("keys[0]: "))),
        }
    }
    if keys.is_empty() {
        let why =
            if skipped.is_empty() { "no keys".to_owned() } else { format!("no usable key: {}", skipped.join("; ")) };
        return Err(why);
    }
    Ok((JwkSet { keys }, skipped))
}

/// Where a bearer token is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `Authorization: Bearer <token>` (RFC 6750 §2.1).
    Authorization,
    /// The cookie of this name.
    Cookie(String),
}

/// The entries of an htpasswd file; an error names the line (1-based).
/// Plain-text, crypt(3) DES, MD5-crypt (`$apr1$`, `$1$`) and SHA-1
/// (`{SHA}`) entries are refused: they fall to an offline attack in hours.
pub fn parse_htpasswd(text: &str) -> Result<Vec<HtpasswdEntry>, (usize, String)> {
    let mut entries: Vec<HtpasswdEntry> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((user, hash)) = line.split_once(':') else {
            return Err((n, "not a user:hash line".into()));
        };
        if user.is_empty() {
            return Err((n, "empty user name".into()));
        }
        if entries.iter().any(|e| e.user == user) {
            return Err((n, format!("user {user:?} is listed twice")));
        }
        let kind = hash_kind(hash).map_err(|m| (n, format!("user {user:?}: {m}")))?;
        entries.push(HtpasswdEntry { user: user.to_owned(), hash: hash.to_owned(), kind });
    }
    Ok(entries)
}

/// The highest bcrypt cost accepted, as Apache's `htpasswd -C` allows: each
/// step doubles the work of every verification, a wrong password's too.
pub const MAX_BCRYPT_COST: u32 = 17;
/// The most SHA-crypt rounds accepted: about as long to verify as bcrypt
/// at [`MAX_BCRYPT_COST`] (the format allows nearly a billion).
pub const MAX_SHA_CRYPT_ROUNDS: u64 = 10_000_000;
/// The most memory (KiB) an Argon2 hash may ask for: RFC 9106's first
/// recommended setting.
pub const MAX_ARGON2_MEMORY_KIB: u64 = 2 * 1024 * 1024;
/// The most memory times passes (KiB) an Argon2 hash may ask for, which
/// its verification time follows.
pub const MAX_ARGON2_WORK_KIB: u64 = 2 * MAX_ARGON2_MEMORY_KIB;

/// Which accepted kind `hash` is, its form and cost checked (not the
/// password). A cost past the bounds above is refused: one wrong password
/// for such an entry (or for an unknown user, when it is the decoy) would
/// hold a verification slot for minutes or hours.
fn hash_kind(hash: &str) -> Result<HashKind, String> {
    const USE: &str = "use bcrypt (htpasswd -B), SHA-crypt ($5$/$6$) or Argon2";
    if hash.starts_with("$apr1$") || hash.starts_with("$1$") {
        return Err(format!("MD5-crypt is refused; {USE}"));
    }
    if hash.starts_with("{SHA}") {
        return Err(format!("SHA-1 ({{SHA}}) is refused; {USE}"));
    }
    if !hash.starts_with('$') {
        return Err(format!("plain-text or crypt(3) DES entry is refused; {USE}"));
    }
    let bcrypt = ["$2y$", "$2b$", "$2a$"].iter().any(|p| hash.starts_with(p));
    if bcrypt {
        let cost = hash.get(4..6).and_then(|c| c.parse::<u32>().ok());
        let valid = hash.len() == 60 && hash.as_bytes()[6] == b'$' && cost.is_some_and(|c| (4..=31).contains(&c));
        return match cost {
            _ if !valid => Err("malformed bcrypt hash".into()),
            Some(c) if c > MAX_BCRYPT_COST => {
                Err(format!("bcrypt cost {c} is refused: at most {MAX_BCRYPT_COST} (htpasswd -B -C {MAX_BCRYPT_COST})"))
            }
            _ => Ok(HashKind::Bcrypt),
        };
    }
    if hash.starts_with("$5$") || hash.starts_with("$6$") {
        sha_crypt::PasswordHashRef::new(hash).map_err(|_| "malformed SHA-crypt hash".to_owned())?;
        // Fewer than 1,000 rounds (crypt(5)'s least) or a count that is no
        // number loaded before, and the user could never log in.
        return match sha_crypt_rounds(hash) {
            Some(Some(r)) if r > MAX_SHA_CRYPT_ROUNDS => {
                Err(format!("SHA-crypt rounds={r} is refused: at most {MAX_SHA_CRYPT_ROUNDS}"))
            }
            Some(Some(r)) if r < 1000 => Err(format!("SHA-crypt rounds={r} is refused: at least 1000")),
            Some(None) => Err("malformed SHA-crypt rounds".to_owned()),
            _ => Ok(HashKind::ShaCrypt),
        };
    }
    if hash.starts_with("$argon2") {
        let parsed = argon2::PasswordHash::new(hash).map_err(|e| format!("malformed Argon2 hash: {e}"))?;
        let params = argon2::Params::try_from(&parsed).map_err(|e| format!("malformed Argon2 hash: {e}"))?;
        let (m, t) = (u64::from(params.m_cost()), u64::from(params.t_cost()));
        if m > MAX_ARGON2_MEMORY_KIB || m * t > MAX_ARGON2_WORK_KIB {
            return Err(format!(
                "Argon2 m={m},t={t} is refused: at most m={MAX_ARGON2_MEMORY_KIB} (KiB), and m*t at most \
                 {MAX_ARGON2_WORK_KIB}"
            ));
        }
        return Ok(HashKind::Argon2);
    }
    Err(format!("unknown hash scheme; {USE}"))
}

/// The `rounds=N` of a SHA-crypt hash (`$6$rounds=N$salt$digest`), `None`
/// within when it is no number; `None` for the default (5,000).
fn sha_crypt_rounds(hash: &str) -> Option<Option<u64>> {
    let rounds = hash.get(3..)?.strip_prefix("rounds=")?;
    Some(rounds.split('$').next().and_then(|r| r.parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BCRYPT: &str = "$2y$05$9EVlwSB2NC6UXZ8IVpCCUOGmBqdEtn6PcW2ph08rsBE/GChz6Cbbq";

    #[test]
    fn rsa_keys_by_size_and_exponent() {
        use base64::Engine;
        let b64 = |bytes: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        // A modulus of `bits` bits (its top bit set), with `zeros` leading zero bytes.
        let modulus = |bits: usize, zeros: usize| {
            let mut n = vec![0u8; zeros];
            n.push(1u8 << ((bits - 1) % 8));
            n.extend(std::iter::repeat_n(0xffu8, (bits - 1) / 8));
            b64(&n)
        };
        let f4 = b64(&[1, 0, 1]);
        let cases = [
            (modulus(2048, 0), f4.clone(), true),
            (modulus(2048, 1), f4.clone(), true),
            (modulus(4096, 0), b64(&[3]), true),
            (modulus(8192, 0), f4.clone(), true),
            (modulus(2047, 0), f4.clone(), false),
            (modulus(1024, 0), f4.clone(), false),
            (modulus(512, 0), f4.clone(), false),
            (modulus(8193, 0), f4.clone(), false),
            (modulus(16384, 0), f4.clone(), false),
            (modulus(2048, 0), b64(&[1]), false),
            (modulus(2048, 0), b64(&[0, 1]), false),
            (modulus(2048, 0), b64(&[1, 0, 0]), false),
            (modulus(2048, 0), "!!".into(), false),
            (modulus(2048, 0), b64(&[1, 0, 0, 0, 1]), true),
            (modulus(2048, 0), b64(&[2, 0, 0, 0, 1]), false),
            (modulus(2048, 0), b64(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 1]), false),
        ];
        for (n, e, ok) in cases {
            assert_eq!(rsa_problem(&n, &e).is_none(), ok, "{} bytes, e {e}: {:?}", n.len(), rsa_problem(&n, &e));
        }
    }

    #[test]
    fn htpasswd_lines_by_kind() {
        let cases: Vec<(String, Result<HashKind, &str>)> = vec![
            (format!("a:{BCRYPT}"), Ok(HashKind::Bcrypt)),
            (format!("a:{}", BCRYPT.replace("$2y$", "$2b$")), Ok(HashKind::Bcrypt)),
            ("a:$5$rounds=5000$saltsalt$Gbmxz7AL/7/V8CNyZQmvhPuqmpSPnEXyC8XiaEJI3sC".into(), Ok(HashKind::ShaCrypt)),
            ("a:$argon2id$v=19$m=16,t=2,p=1$c2FsdHNhbHQ$L0Z9S3cvszSYv7jVqfIbTg".into(), Ok(HashKind::Argon2)),
            ("a:secret".into(), Err("plain-text")),
            ("a:$apr1$salt$hash".into(), Err("MD5-crypt")),
            ("a:$1$salt$hash".into(), Err("MD5-crypt")),
            ("a:{SHA}W6ph5Mm5Pz8GgiULbPgzG37mj9g=".into(), Err("SHA-1")),
            ("a:$2y$05$short".into(), Err("malformed bcrypt")),
            ("a:$2x$05$9EVlwSB2NC6UXZ8IVpCCUOGmBqdEtn6PcW2ph08rsBE/GChz6Cbbq".into(), Err("unknown")),
            ("a:$9$x".into(), Err("unknown")),
            (format!("a:{}", BCRYPT.replace("$05$", "$17$")), Ok(HashKind::Bcrypt)),
            (format!("a:{}", BCRYPT.replace("$05$", "$18$")), Err("bcrypt cost 18 is refused: at most 17")),
            (format!("a:{}", BCRYPT.replace("$05$", "$31$")), Err("bcrypt cost 31 is refused")),
            (format!("a:{}", BCRYPT.replace("$05$", "$32$")), Err("malformed bcrypt")),
            (
                "a:$6$rounds=10000000$saltsalt$Gbmxz7AL/7/V8CNyZQmvhPuqmpSPnEXyC8XiaEJI3sC".into(),
                Ok(HashKind::ShaCrypt),
            ),
            (
                "a:$5$rounds=10000001$saltsalt$Gbmxz7AL/7/V8CNyZQmvhPuqmpSPnEXyC8XiaEJI3sC".into(),
                Err("SHA-crypt rounds=10000001 is refused: at most 10000000"),
            ),
            (
                "a:$6$rounds=999999999$saltsalt$Gbmxz7AL/7/V8CNyZQmvhPuqmpSPnEXyC8XiaEJI3sC".into(),
                Err("SHA-crypt rounds=999999999 is refused"),
            ),
            (
                "a:$6$rounds=999$saltsalt$Gbmxz7AL/7/V8CNyZQmvhPuqmpSPnEXyC8XiaEJI3sC".into(),
                Err("SHA-crypt rounds=999 is refused: at least 1000"),
            ),
            ("a:$6$rounds=1000$saltsalt$Gbmxz7AL/7/V8CNyZQmvhPuqmpSPnEXyC8XiaEJI3sC".into(), Ok(HashKind::ShaCrypt)),
            ("a:$argon2id$v=19$m=2097152,t=2,p=1$c2FsdHNhbHQ$L0Z9S3cvszSYv7jVqfIbTg".into(), Ok(HashKind::Argon2)),
            (
                "a:$argon2id$v=19$m=2097153,t=1,p=1$c2FsdHNhbHQ$L0Z9S3cvszSYv7jVqfIbTg".into(),
                Err("Argon2 m=2097153,t=1"),
            ),
            ("a:$argon2id$v=19$m=65536,t=65,p=1$c2FsdHNhbHQ$L0Z9S3cvszSYv7jVqfIbTg".into(), Err("is refused")),
            ("nocolon".into(), Err("user:hash")),
        ];
        for (line, want) in cases {
            let text = format!("# users\n\n{line}\n");
            match (parse_htpasswd(&text), want) {
                (Ok(entries), Ok(kind)) => assert_eq!(entries[0].kind, kind, "{line}"),
                (Err((n, message)), Err(part)) => {
                    assert_eq!(n, 3, "{line}");
                    assert!(message.contains(part), "{line}: {message}");
                }
                (got, want) => panic!("{line}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn duplicate_users_are_refused_and_debug_hides_hashes() {
        let text = format!("a:{BCRYPT}\na:{BCRYPT}\n");
        assert_eq!(parse_htpasswd(&text).unwrap_err().0, 2);
        let one = parse_htpasswd(&format!("a:{BCRYPT}")).unwrap();
        assert!(!format!("{one:?}").contains("$2y$"));
    }
}
