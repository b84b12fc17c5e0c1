//! Helpers of the access-control tests (`auth.rs`, `auth_flood.rs`,
//! `auth_jwt.rs`): a recording upstream, routes, credentials.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;

use crate::common::{TestUpstream, full, send};

/// An upstream that records the headers of every request it receives.
pub async fn recording() -> (TestUpstream, Arc<Mutex<Vec<HeaderMap>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let up = TestUpstream::start(move |req: Request<Incoming>| {
        let s = s.clone();
        async move {
            s.lock().unwrap().push(req.headers().clone());
            Response::new(full("from upstream"))
        }
    })
    .await;
    (up, seen)
}

pub async fn get_with(url: &str, headers: &[(&str, &str)]) -> (http::response::Parts, Bytes) {
    let mut b = Request::get(url);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    send(b.body(full(Bytes::new())).unwrap()).await
}

pub fn basic(user: &str, password: &str) -> String {
    format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}")))
}

/// A proxy route `name` on `/name` to `up`, with `extra` keys.
pub fn route(up: SocketAddr, name: &str, extra: &str) -> String {
    format!(
        "[upstreams.{name}]\nurl = \"http://{up}\"\n\
         [[routes]]\nname = \"{name}\"\nprefix = \"/{name}\"\nupstream = \"{name}\"\n{extra}\n"
    )
}

pub fn header<'a>(parts: &'a http::response::Parts, name: &str) -> Option<&'a str> {
    parts.headers.get(name).map(|v| v.to_str().unwrap())
}

/// Users `ann` (bcrypt $2y$), `bob` (bcrypt $2b$), `sue` (SHA-crypt $5$),
/// `sam` (SHA-crypt $6$) and `ada` (Argon2id); every password is
/// `"pw-" + user`.
pub fn htpasswd(dir: &Path, cost: u32) -> std::path::PathBuf {
    let bcrypt = |pw: &str, prefix: &str| bcrypt::hash(pw, cost).unwrap().replacen("$2b$", prefix, 1);
    use argon2::PasswordHasher;
    let params = argon2::Params::new(64, 1, 1, None).unwrap();
    let argon = argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
        .hash_password_with_salt(b"pw-ada", b"saltsaltsalt")
        .unwrap()
        .to_string();
    // `openssl passwd -5 -salt saltsalt pw-sue`, `openssl passwd -6 -salt saltsalt pw-sam`.
    let text = format!(
        "# test users\nann:{}\nbob:{}\nsue:$5$saltsalt$8bjjZ1/oNJbjiGc16HnqjXfT8RpsPqBD8PEOSVduwU6\n\
         sam:$6$saltsalt$/QtqGX.Gg1a/Ed93hhLT9xhrpTBSKuTyRmAfMCBy.eoFSRCO7qhDlS5ggAPqhWfBw4RlbuCWKAQZMovlc5eE01\n\
         ada:{argon}\n",
        bcrypt("pw-ann", "$2y$"),
        bcrypt("pw-bob", "$2b$"),
    );
    let path = dir.join("users.htpasswd");
    std::fs::write(&path, text).unwrap();
    path
}
