//! A route's access keys (`allow`, `deny`, `auth`, `forward_credentials`),
//! validated into [`AccessConfig`]: the htpasswd file and the JWKS are read
//! and checked here, so a bad entry stops the load (exit 64) naming its line
//! or key.

use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use http::HeaderName;
use ipnet::IpNet;
use jsonwebtoken::Algorithm;
use jsonwebtoken::jwk::JwkSet;

use super::{Problem, parse_duration};
use crate::config::access::{
    AccessConfig, AuthConfig, BasicConfig, ForwardConfig, JwksSource, JwtConfig, TokenSource, parse_htpasswd,
    parse_jwks,
};
use crate::config::raw_access::{RawAuth, RawBasic, RawForward, RawJwt};
use crate::config::refused_name;

/// How long a successful Basic verification is remembered by default.
const DEFAULT_REMEMBER: Duration = Duration::from_secs(60);
/// How long the forward auth service may take by default.
const DEFAULT_FORWARD_TIMEOUT: Duration = Duration::from_secs(1);
/// Asks of one route under way at once by default (`max_concurrent`).
const DEFAULT_FORWARD_CONCURRENT: usize = 100;
const MAX_FORWARD_CONCURRENT: usize = 100_000;

/// How often a `jwks_url` is fetched again by default (unless its
/// `Cache-Control: max-age` says otherwise).
const DEFAULT_JWKS_REFRESH: Duration = Duration::from_secs(300);
/// The `exp`/`nbf` clock skew allowed by default.
const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);
/// Verified tokens a JWT route remembers by default: a few MiB of claims.
const DEFAULT_CACHE_TOKENS: u64 = 10_000;

/// The route's raw access keys.
pub(super) struct RawAccessKeys<'a> {
    pub allow: Option<&'a [String]>,
    pub deny: Option<&'a [String]>,
    pub auth: Option<&'a RawAuth>,
    pub forward_credentials: Option<bool>,
}

/// `None` when the route sets none of the keys.
pub(super) fn access(
    r: RawAccessKeys<'_>,
    key: &dyn Fn(&str) -> String,
    base_dir: &Path,
) -> Result<Option<AccessConfig>, Problem> {
    if r.allow.is_none() && r.deny.is_none() && r.auth.is_none() {
        if r.forward_credentials.is_some() {
            return Err((key("forward_credentials"), "only applies with auth".into()));
        }
        return Ok(None);
    }
    let allow = cidrs(r.allow, &key("allow"))?;
    let deny = cidrs(r.deny, &key("deny"))?;
    if r.allow.is_some_and(|a| a.is_empty()) {
        return Err((key("allow"), "an empty list refuses every client; leave it out to allow all".into()));
    }
    let auth = r.auth.map(|a| auth(a, &key("auth"), base_dir)).transpose()?;
    if auth.is_none() && r.forward_credentials.is_some() {
        return Err((key("forward_credentials"), "only applies with auth".into()));
    }
    Ok(Some(AccessConfig { allow, deny, auth, forward_credentials: r.forward_credentials.unwrap_or(false) }))
}

/// An address list (also `metrics.allow`).
pub(super) fn cidrs(list: Option<&[String]>, key: &str) -> Result<Vec<IpNet>, Problem> {
    list.unwrap_or_default().iter().enumerate().map(|(i, c)| parse_cidr(&format!("{key}[{i}]"), c)).collect()
}

/// A CIDR block; a bare address is a block of one. An IPv4-mapped IPv6
/// block (`::ffff:10.0.0.0/104`) is the IPv4 one (see [`canonical_net`]).
pub(super) fn parse_cidr(key: &str, value: &str) -> Result<IpNet, Problem> {
    let value = value.trim();
    value
        .parse::<IpNet>()
        .or_else(|_| value.parse::<std::net::IpAddr>().map(IpNet::from))
        .map(|net| canonical_net(net.trunc()))
        .map_err(|_| (key.to_owned(), format!("invalid CIDR {value:?} (use e.g. \"10.0.0.0/8\", \"::1\")")))
}

/// A block inside `::ffff:0:0/96` as the IPv4 block it maps: client
/// addresses are compared as IPv4 once mapped (`Peer::client`), so the
/// IPv6 form would never match, and a `deny` would fail open.
fn canonical_net(net: IpNet) -> IpNet {
    if let IpNet::V6(v6) = net
        && v6.prefix_len() >= 96
        && let Some(v4) = v6.addr().to_ipv4_mapped()
    {
        return IpNet::V4(ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).expect("a prefix of at most 32"));
    }
    net
}

fn auth(a: &RawAuth, key: &str, base_dir: &Path) -> Result<AuthConfig, Problem> {
    match (&a.basic, &a.jwt, &a.forward) {
        (Some(b), None, None) => basic(b, &format!("{key}.basic"), base_dir).map(AuthConfig::Basic),
        (None, Some(j), None) => jwt(j, &format!("{key}.jwt"), base_dir).map(AuthConfig::Jwt),
        (None, None, Some(f)) => forward(f, &format!("{key}.forward")).map(AuthConfig::Forward),
        _ => Err((key.to_owned(), "set exactly one of basic, jwt, forward".into())),
    }
}

fn basic(b: &RawBasic, key: &str, base_dir: &Path) -> Result<BasicConfig, Problem> {
    let k = |s: &str| format!("{key}.{s}");
    let file = b.htpasswd.as_deref().ok_or_else(|| (k("htpasswd"), "missing: an htpasswd file".into()))?;
    let path = base_dir.join(file);
    let text = std::fs::read_to_string(&path).map_err(|e| (k("htpasswd"), format!("{}: {e}", path.display())))?;
    let users = parse_htpasswd(&text).map_err(|(n, m)| (k("htpasswd"), format!("{}:{n}: {m}", path.display())))?;
    if users.is_empty() {
        return Err((k("htpasswd"), format!("{}: no users", path.display())));
    }
    let realm = b.realm.clone().unwrap_or_else(|| "gateway".to_owned());
    // Quoted in the challenge (RFC 9110 §11.2): no quote, backslash or control.
    if realm.is_empty() || realm.chars().any(|c| c == '"' || c == '\\' || c.is_control()) {
        return Err((k("realm"), format!("{realm:?}: use printable text without '\"' or '\\'")));
    }
    let remember = match &b.remember {
        Some(r) => parse_duration(&k("remember"), r)?,
        None => DEFAULT_REMEMBER,
    };
    Ok(BasicConfig { htpasswd: path, realm, remember, users })
}

fn jwt(j: &RawJwt, key: &str, base_dir: &Path) -> Result<JwtConfig, Problem> {
    let k = |s: &str| format!("{key}.{s}");
    let algorithms = algorithms(j.algorithms.as_deref(), &k("algorithms"))?;
    let source = match (&j.jwks_file, &j.jwks_url) {
        (Some(file), None) => {
            if j.refresh.is_some() {
                return Err((k("refresh"), "only applies with jwks_url".into()));
            }
            let path = base_dir.join(file);
            let keys = read_jwks(&path, &algorithms).map_err(|m| (k("jwks_file"), m))?;
            JwksSource::File { path, keys }
        }
        (None, Some(url)) => jwks_url(url, j.refresh.as_deref(), &k)?,
        _ => return Err((k("jwks_file"), "set exactly one of jwks_file, jwks_url".into())),
    };
    if j.issuer.as_deref().is_some_and(str::is_empty) {
        return Err((k("issuer"), "empty; leave it out to accept any".into()));
    }
    let leeway = match &j.leeway {
        Some(l) => parse_duration(&k("leeway"), l)?,
        None => DEFAULT_LEEWAY,
    };
    let from = match j.from.as_deref() {
        None | Some("authorization") => TokenSource::Authorization,
        Some(f) => match f.strip_prefix("cookie:") {
            Some(name) if !name.is_empty() && name.bytes().all(|b| b.is_ascii_graphic() && !b"=;,\"".contains(&b)) => {
                TokenSource::Cookie(name.to_owned())
            }
            _ => {
                let shown = crate::config::redact_condition("from", f);
                return Err((k("from"), format!("{shown}: use \"authorization\" or \"cookie:NAME\"")));
            }
        },
    };
    let forward_claims = forward_claims(&j.forward_claims, &k("forward_claims"))?;
    Ok(JwtConfig {
        source,
        issuer: j.issuer.clone(),
        audiences: j.audiences.clone(),
        algorithms,
        leeway,
        from,
        forward_claims,
        cache_tokens: j.cache_tokens.unwrap_or(DEFAULT_CACHE_TOKENS),
    })
}

/// RFC 8725 §3.1–3.2: only asymmetric algorithms, named by the operator.
fn algorithms(list: Option<&[String]>, key: &str) -> Result<Vec<Algorithm>, Problem> {
    let list = list.ok_or_else(|| (key.to_owned(), "missing: e.g. [\"RS256\", \"ES256\", \"EdDSA\"]".into()))?;
    if list.is_empty() {
        return Err((key.to_owned(), "empty: name the algorithms your issuer signs with".into()));
    }
    list.iter()
        .map(|name| match Algorithm::from_str(name) {
            Ok(Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) => Err((
                key.to_owned(),
                format!("{name}: HMAC needs a shared secret, not a public key set; refused (RFC 8725 §3.2)"),
            )),
            Ok(alg) => Ok(alg),
            Err(_) => Err((key.to_owned(), format!("{name:?}: use RS256..RS512, PS256..PS512, ES256, ES384 or EdDSA"))),
        })
        .collect()
}

/// The JWKS file, checked by [`parse_jwks`].
fn read_jwks(path: &Path, algorithms: &[Algorithm]) -> Result<JwkSet, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_jwks(&text, algorithms).map_err(|m| format!("{}: {m}", path.display()))
}

fn forward_claims(map: &BTreeMap<String, String>, key: &str) -> Result<Vec<(HeaderName, String)>, Problem> {
    map.iter()
        .map(|(header, claim)| {
            let k = format!("{key}.{}", refused_name(header));
            let name = HeaderName::from_bytes(header.as_bytes())
                .map_err(|_| (k.clone(), format!("invalid header name {:?}", refused_name(header))))?;
            let managed = crate::headers::is_hop_by_hop(&name)
                || crate::headers::SET_BY_GATEWAY.contains(&name)
                || name == http::header::AUTHORIZATION
                || name == http::header::CONTENT_LENGTH;
            if managed {
                return Err((k, format!("{header:?} is managed by the gateway and cannot carry a claim")));
            }
            if claim.is_empty() {
                return Err((k, "empty claim name".into()));
            }
            Ok((name, claim.clone()))
        })
        .collect()
}

fn forward(f: &RawForward, key: &str) -> Result<ForwardConfig, Problem> {
    let k = |s: &str| format!("{key}.{s}");
    let url = f.url.as_deref().ok_or_else(|| (k("url"), "missing: e.g. \"http://auth:9091/verify\"".into()))?;
    let shown = crate::config::redact_url(url);
    let uri: http::Uri = url.parse().map_err(|e| (k("url"), format!("invalid URL {shown:?}: {e}")))?;
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err((k("url"), "credentials in the URL are not supported (and would be logged)".into()));
    }
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err((k("url"), format!("{shown:?}: use an http:// URL (https is not supported yet)")));
    }
    let timeout = match &f.timeout {
        Some(t) => parse_duration(&k("timeout"), t)?,
        None => DEFAULT_FORWARD_TIMEOUT,
    };
    if timeout.is_zero() {
        return Err((k("timeout"), "must be greater than zero".into()));
    }
    let names = |list: &[String], key: &str| -> Result<Vec<HeaderName>, Problem> {
        list.iter()
            .enumerate()
            .map(|(i, n)| {
                let name = HeaderName::from_bytes(n.as_bytes())
                    .map_err(|_| (format!("{key}[{i}]"), format!("invalid header name {:?}", refused_name(n))))?;
                if crate::headers::is_hop_by_hop(&name) || name == http::header::CONTENT_LENGTH {
                    return Err((format!("{key}[{i}]"), format!("{n:?} is hop-by-hop or framing")));
                }
                Ok(name)
            })
            .collect()
    };
    let default_request = ["authorization".to_owned(), "cookie".to_owned()];
    let request_headers = names(f.request_headers.as_deref().unwrap_or(&default_request), &k("request_headers"))?;
    let response_headers = names(&f.response_headers, &k("response_headers"))?;
    if let Some(n) = response_headers.iter().find(|n| crate::headers::SET_BY_GATEWAY.contains(n)) {
        return Err((k("response_headers"), format!("{n} is set by the gateway itself")));
    }
    let max_concurrent = f.max_concurrent.unwrap_or(DEFAULT_FORWARD_CONCURRENT);
    if !(1..=MAX_FORWARD_CONCURRENT).contains(&max_concurrent) {
        return Err((k("max_concurrent"), format!("between 1 and {MAX_FORWARD_CONCURRENT}")));
    }
    Ok(ForwardConfig { url: uri, timeout, request_headers, response_headers, max_concurrent })
}

/// `jwks_url` (`https://`, or `http://` for a service on the same host or
/// network) and its `refresh` interval.
fn jwks_url(url: &str, refresh: Option<&str>, k: &dyn Fn(&str) -> String) -> Result<JwksSource, Problem> {
    let shown = crate::config::redact_url(url);
    let uri: http::Uri = url.parse().map_err(|e| (k("jwks_url"), format!("invalid URL {shown:?}: {e}")))?;
    if uri.authority().is_none_or(|a| a.as_str().contains('@')) || !matches!(uri.scheme_str(), Some("https" | "http")) {
        return Err((k("jwks_url"), format!("{shown:?}: use an https:// (or http://) URL without credentials")));
    }
    let refresh = match refresh {
        Some(r) => parse_duration(&k("refresh"), r)?,
        None => DEFAULT_JWKS_REFRESH,
    };
    if refresh < Duration::from_secs(1) {
        return Err((k("refresh"), "must be at least 1s".into()));
    }
    Ok(JwksSource::Url { url: uri, refresh })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_mapped_blocks_are_ipv4() {
        let cases = [
            ("::ffff:127.0.0.1", Ok("127.0.0.1/32")),
            ("::ffff:127.0.0.0/104", Ok("127.0.0.0/8")),
            ("::FFFF:10.1.2.3/120", Ok("10.1.2.0/24")),
            ("::ffff:0.0.0.0/96", Ok("0.0.0.0/0")),
            ("::ffff:7f00:1", Ok("127.0.0.1/32")),
            // Wider than the mapped block: IPv6 as written.
            ("::ffff:0:0/95", Ok("::fffe:0:0/95")),
            ("::1", Ok("::1/128")),
            ("::127.0.0.1", Ok("::7f00:1/128")),
            ("10.0.0.1/8", Ok("10.0.0.0/8")),
            ("2001:db8::/32", Ok("2001:db8::/32")),
            ("::ffff:1.2.3.4/129", Err(())),
        ];
        for (input, want) in cases {
            let got = parse_cidr("k", input).map(|n| n.to_string()).map_err(|_| ());
            assert_eq!(got, want.map(str::to_owned), "{input}");
        }
    }
}
