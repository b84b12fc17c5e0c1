//! The raw (serde) shape of a route's access keys (`allow`, `deny`, `auth`,
//! `forward_credentials`), apart from `raw.rs` so that access control's
//! keys live beside each other.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `auth = { basic | jwt | forward = {...} }`: exactly one.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (auth = { basic = { htpasswd = \"FILE\" } })")]
pub(super) struct RawAuth {
    pub basic: Option<RawBasic>,
    pub jwt: Option<RawJwt>,
    pub forward: Option<RawForward>,
}

/// `auth.forward`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (forward = { url = \"http://host:port/verify\" })")]
pub(super) struct RawForward {
    pub url: Option<String>,
    pub timeout: Option<String>,
    pub request_headers: Option<Vec<String>>,
    #[serde(default)]
    pub response_headers: Vec<String>,
    pub max_concurrent: Option<usize>,
}

/// `auth.basic`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (basic = { htpasswd = \"FILE\" })")]
pub(super) struct RawBasic {
    pub htpasswd: Option<String>,
    pub realm: Option<String>,
    /// How long a successful verification is remembered.
    pub remember: Option<String>,
}

/// `auth.jwt`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[serde(expecting = "a table (jwt = { jwks_file = \"FILE\" })")]
pub(super) struct RawJwt {
    pub jwks_file: Option<String>,
    pub jwks_url: Option<String>,
    /// How often `jwks_url` is fetched again.
    pub refresh: Option<String>,
    pub issuer: Option<String>,
    #[serde(default)]
    pub audiences: Vec<String>,
    pub algorithms: Option<Vec<String>>,
    pub leeway: Option<String>,
    pub from: Option<String>,
    #[serde(default)]
    pub forward_claims: BTreeMap<String, String>,
    /// How many verified tokens are remembered (0: none).
    pub cache_tokens: Option<u64>,
}
