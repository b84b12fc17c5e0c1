//! HTTP Basic authentication (RFC 7617) against an htpasswd file.
//!
//! bcrypt and its kin are slow on purpose, so a stream of wrong passwords
//! must not take the CPU from the proxy: each verification runs on the
//! blocking pool, at most [`max_verifications`] at once in the whole
//! process, with a few more waiting up to [`MAX_WAIT`] for a turn (past
//! that: 503 with `Retry-After`), and a success is remembered
//! for `remember`, each user's last one, as a salted SHA-256 of the
//! credentials (never the credentials themselves), so a valid client does
//! not pay the hash on every request.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use base64::Engine;
use http::{HeaderMap, HeaderValue, header};
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::config::access::{BasicConfig, HashKind, HtpasswdEntry};
use crate::error::GatewayError;

const KIND: &str = "basic";

/// Verifications running at once, process-wide: half the CPUs, at least
/// one, so the other half keeps proxying whatever the login traffic.
pub fn max_verifications() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// A salted SHA-256 of `user`, 0, `password`: what is remembered instead
/// of the credentials.
type CredentialKey = [u8; 32];

/// The longest password verified, in bytes: a longer one is refused
/// without hashing. SHA-crypt's work grows with the square of the
/// password's length, so one request with a long enough password would
/// otherwise hold a verification slot for seconds.
pub const MAX_PASSWORD: usize = 256;

/// Verifications that may wait for a turn, per one that may run.
const WAITING_PER_RUNNING: usize = 4;
/// How long a verification waits for its turn before the request is
/// answered 503.
pub const MAX_WAIT: Duration = Duration::from_secs(1);

static VERIFICATIONS: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new(max_verifications())));
static WAITING: AtomicUsize = AtomicUsize::new(0);

/// A turn to verify, waited for a little when all are taken.
async fn turn() -> Result<OwnedSemaphorePermit, GatewayError> {
    let busy = || GatewayError::AuthBusy { kind: KIND, limit: max_verifications() };
    if let Ok(permit) = VERIFICATIONS.clone().try_acquire_owned() {
        return Ok(permit);
    }
    struct Waiting;
    impl Drop for Waiting {
        fn drop(&mut self) {
            WAITING.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let waiting = Waiting;
    if WAITING.fetch_add(1, Ordering::Relaxed) >= max_verifications() * WAITING_PER_RUNNING {
        return Err(busy());
    }
    let permit = tokio::time::timeout(MAX_WAIT, VERIFICATIONS.clone().acquire_owned()).await;
    drop(waiting);
    permit.ok().and_then(Result::ok).ok_or_else(busy)
}

/// A route's Basic check, built at load (a reload builds it anew from the
/// file as it is then, with nothing remembered).
pub struct Basic {
    challenge: HeaderValue,
    users: HashMap<String, (Arc<str>, HashKind)>,
    /// Verified for users not in the file, so that their refusal takes as
    /// long as a known user's.
    decoy: (Arc<str>, HashKind),
    remember: Duration,
    /// Each user's last verified credentials, one entry a user of the file:
    /// so no client, whatever it sends (bcrypt reads only a password's
    /// first 72 bytes, so one password has many spellings), can push
    /// another user's entry out.
    remembered: Mutex<HashMap<Arc<str>, (CredentialKey, Instant)>>,
    /// Salts the keys of `remembered`.
    salt: [u8; 16],
}

impl Basic {
    pub fn new(c: &BasicConfig) -> Basic {
        let challenge = HeaderValue::from_str(&format!("Basic realm=\"{}\", charset=\"UTF-8\"", c.realm))
            .expect("the realm is checked at load");
        let users: HashMap<_, _> =
            c.users.iter().map(|u| (u.user.clone(), (Arc::from(u.hash.as_str()), u.kind))).collect();
        let decoy = decoy(&c.users);
        if let Some(odd) = c.users.iter().filter(|u| parameters(u) != parameters(decoy)).map(|u| &u.user).next() {
            tracing::warn!(
                htpasswd = %c.htpasswd.display(),
                user = %odd,
                "not every hash in the file has the same kind and cost: a refusal of such a user takes another time \
                 than one of an unknown user, which tells a client the user exists; hash them all alike"
            );
        }
        let mut salt = [0u8; 16];
        salt.iter_mut().for_each(|b| *b = fastrand::u8(..));
        Basic {
            challenge,
            users,
            decoy: (Arc::from(decoy.hash.as_str()), decoy.kind),
            remember: c.remember,
            remembered: Mutex::new(HashMap::new()),
            salt,
        }
    }

    /// The user the request's credentials name, when they are right.
    pub async fn verify(&self, headers: &HeaderMap) -> Result<Arc<str>, GatewayError> {
        let (user, password) = credentials(headers).map_err(|reason| self.refuse(reason))?;
        if password.len() > MAX_PASSWORD {
            return Err(self.refuse("password too long"));
        }
        let key = self.key(&user, &password);
        if let Some(user) = self.recall(&user, &key) {
            return Ok(user);
        }
        let known = self.users.get_key_value(user.as_str());
        let (hash, kind) = known.map_or(&self.decoy, |(_, h)| h).clone();
        let permit = turn().await?;
        // The task keeps its permit to the end, even if the client leaves.
        let matched = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            verify_hash(kind, &hash, password.as_bytes())
        })
        .await
        .map_err(|e| GatewayError::AuthError { kind: KIND, detail: e.to_string() })?;
        match known {
            Some((user, _)) if matched => {
                let user: Arc<str> = Arc::from(user.as_str());
                self.store(key, user.clone());
                Ok(user)
            }
            _ => Err(self.refuse("wrong user or password")),
        }
    }

    fn refuse(&self, reason: &'static str) -> GatewayError {
        GatewayError::Unauthorized { kind: KIND, reason, challenge: self.challenge.clone() }
    }

    fn key(&self, user: &str, password: &str) -> CredentialKey {
        let mut h = Sha256::new();
        h.update(self.salt);
        h.update(user.as_bytes());
        h.update([0]);
        h.update(password.as_bytes());
        h.finalize().into()
    }

    fn recall(&self, user: &str, key: &CredentialKey) -> Option<Arc<str>> {
        let remembered = self.remembered.lock().unwrap_or_else(|e| e.into_inner());
        let (user, (known, until)) = remembered.get_key_value(user)?;
        (known == key && *until > Instant::now()).then(|| user.clone())
    }

    fn store(&self, key: CredentialKey, user: Arc<str>) {
        if self.remember.is_zero() {
            return;
        }
        let until = Instant::now() + self.remember;
        self.remembered.lock().unwrap_or_else(|e| e.into_inner()).insert(user, (key, until));
    }
}

/// `Authorization: Basic base64(user:password)` (RFC 7617 §2), UTF-8.
fn credentials(headers: &HeaderMap) -> Result<(String, String), &'static str> {
    let mut values = headers.get_all(header::AUTHORIZATION).iter();
    let value = values.next().ok_or("no credentials")?;
    // Exactly one: with forward_credentials the upstream could read another
    // copy than the one checked here.
    if values.next().is_some() {
        return Err("more than one Authorization header");
    }
    let value = value.to_str().map_err(|_| "malformed Authorization header")?;
    let (scheme, encoded) = value.trim().split_once(' ').ok_or("malformed Authorization header")?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return Err("not Basic credentials");
    }
    let decoded =
        base64::engine::general_purpose::STANDARD.decode(encoded.trim()).map_err(|_| "malformed Basic credentials")?;
    let text = String::from_utf8(decoded).map_err(|_| "malformed Basic credentials")?;
    let (user, password) = text.split_once(':').ok_or("malformed Basic credentials")?;
    Ok((user.to_owned(), password.to_owned()))
}

/// Whether `password` matches `hash` (on the blocking pool: slow on purpose).
fn verify_hash(kind: HashKind, hash: &str, password: &[u8]) -> bool {
    use argon2::PasswordVerifier;
    match kind {
        HashKind::Bcrypt => bcrypt::verify(password, hash).unwrap_or(false),
        HashKind::ShaCrypt => sha_crypt::ShaCrypt::default().verify_password(password, hash).is_ok(),
        HashKind::Argon2 => argon2::Argon2::default().verify_password(password, hash).is_ok(),
    }
}

/// The entry verified for unknown users: one with the parameters (kind and
/// cost) most of the file's hashes have, so that an unknown user takes as
/// long as most known ones.
fn decoy(users: &[HtpasswdEntry]) -> &HtpasswdEntry {
    let mut counts: HashMap<&str, (usize, &HtpasswdEntry)> = HashMap::new();
    for u in users {
        counts.entry(parameters(u)).or_insert((0, u)).0 += 1;
    }
    // Ties go to the earliest in the file, so the choice does not vary.
    let first_of = |u: &HtpasswdEntry| users.iter().position(|x| std::ptr::eq(x, u));
    counts
        .into_values()
        .max_by_key(|(n, u)| (*n, std::cmp::Reverse(first_of(u))))
        .map(|(_, u)| u)
        .expect("a file has users")
}

/// What decides a hash's verification time: the hash without its salt and
/// digest (`$2y$12`, `$6$rounds=5000`, `$argon2id$v=19$m=19456,t=2,p=1`).
fn parameters(u: &HtpasswdEntry) -> &str {
    if u.kind == HashKind::Bcrypt {
        // `$2y$12$…`: its cost, whichever of 2a/2b/2y (they take as long).
        return u.hash.get(3..6).unwrap_or("");
    }
    // The others' salt and digest are the last two fields.
    u.hash.rsplitn(3, '$').last().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_from_the_header() {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        type Case = (Option<String>, Result<(&'static str, &'static str), &'static str>);
        let cases: Vec<Case> = vec![
            (Some(format!("Basic {}", b64("ann:pw"))), Ok(("ann", "pw"))),
            (Some(format!("basic {}", b64("ann:p:w"))), Ok(("ann", "p:w"))),
            (Some(format!("Basic {}", b64("ann:"))), Ok(("ann", ""))),
            (None, Err("no credentials")),
            (Some("Bearer abc".into()), Err("not Basic credentials")),
            (Some("Basic".into()), Err("malformed Authorization header")),
            (Some("Basic !!!".into()), Err("malformed Basic credentials")),
            (Some(format!("Basic {}", b64("nocolon"))), Err("malformed Basic credentials")),
        ];
        for (value, want) in cases {
            let mut headers = HeaderMap::new();
            if let Some(v) = &value {
                headers.insert(header::AUTHORIZATION, v.parse().unwrap());
            }
            let got = credentials(&headers);
            let got = got.as_ref().map(|(u, p)| (u.as_str(), p.as_str())).map_err(|e| *e);
            assert_eq!(got, want, "{value:?}");
        }
    }

    /// Before, successes were kept by credentials, up to 10,000, then all
    /// forgotten: one user sending 10,001 spellings of a password (bcrypt
    /// reads only its first 72 bytes) made every other user pay the hash
    /// again.
    #[tokio::test]
    async fn no_user_pushes_another_users_remembered_login_out() {
        let entry = |user: &str| HtpasswdEntry { user: user.into(), hash: "$2y$04$x".into(), kind: HashKind::Bcrypt };
        let config = BasicConfig {
            htpasswd: "users".into(),
            realm: "r".into(),
            remember: Duration::from_secs(60),
            users: vec![entry("bob"), entry("carl")],
        };
        let basic = Basic::new(&config);
        let carl = basic.key("carl", "pw");
        basic.store(carl, Arc::from("carl"));
        for i in 0..20_000 {
            basic.store(basic.key("bob", &format!("pw{i}")), Arc::from("bob"));
        }
        assert_eq!(basic.recall("carl", &carl).as_deref(), Some("carl"));
        assert_eq!(basic.recall("bob", &basic.key("bob", "pw19999")).as_deref(), Some("bob"));
        assert_eq!(basic.recall("bob", &basic.key("bob", "pw1")), None, "one entry a user: the last");
        assert_eq!(basic.recall("carl", &basic.key("carl", "other")), None);
        assert_eq!(basic.remembered.lock().unwrap().len(), 2);
    }

    #[test]
    fn the_decoy_has_the_parameters_most_hashes_have() {
        let entry = |user: &str, hash: &str, kind| HtpasswdEntry { user: user.into(), hash: hash.into(), kind };
        let b = |user: &str, hash: &str| entry(user, hash, HashKind::Bcrypt);
        let s = |user: &str, hash: &str| entry(user, hash, HashKind::ShaCrypt);
        let a = |user: &str, hash: &str| entry(user, hash, HashKind::Argon2);
        let cases: Vec<(Vec<HtpasswdEntry>, &str)> = vec![
            (vec![b("one", "$2y$12$abc")], "one"),
            (vec![b("cheap", "$2y$04$abc"), b("x", "$2y$12$abc"), b("y", "$2b$12$def")], "x"),
            (vec![b("x", "$2y$12$abc"), b("cheap", "$2y$04$abc"), b("cheap2", "$2a$04$abc")], "cheap"),
            (vec![s("r", "$6$rounds=9000$salt$h"), s("d1", "$6$salt$h"), s("d2", "$6$other$h")], "d1"),
            (
                vec![
                    a("a1", "$argon2id$v=19$m=19456,t=2,p=1$salt$h"),
                    a("a2", "$argon2id$v=19$m=65536,t=3,p=4$salt$h"),
                    a("a3", "$argon2id$v=19$m=65536,t=3,p=4$other$h"),
                ],
                "a2",
            ),
            // A tie goes to the first in the file.
            (vec![b("first", "$2y$10$abc"), b("second", "$2y$11$abc")], "first"),
        ];
        for (users, want) in cases {
            assert_eq!(decoy(&users).user, want, "{:?}", users.iter().map(|u| &u.hash).collect::<Vec<_>>());
        }
        assert_eq!(parameters(&b("x", "$2y$12$abc")), parameters(&b("y", "$2b$12$zzz")));
        assert_eq!(parameters(&s("x", "$6$rounds=5000$salt$h")), "$6$rounds=5000");
        assert_eq!(parameters(&a("x", "$argon2id$v=19$m=1,t=2,p=3$s$h")), "$argon2id$v=19$m=1,t=2,p=3");
    }

    #[test]
    fn each_hash_kind_verifies() {
        let bcrypt = bcrypt::hash("pw", 4).unwrap();
        // `openssl passwd -5 -salt saltsalt pw` and `-6`.
        let sha256 = "$5$saltsalt$0rl.MZtoLLPP3X0Rdl8riRnphIcAXJY27/aOAyK2hB5";
        let sha512 =
            "$6$saltsalt$pauPrmdmG4BTE9h2HPmywiw152IFch6BJCEsaY6D.PLTfpV8sqvXwWdyfsgVgozkYH9B80bAip/08R2BPH2xk/";
        for (kind, hash) in
            [(HashKind::Bcrypt, bcrypt.as_str()), (HashKind::ShaCrypt, sha256), (HashKind::ShaCrypt, sha512)]
        {
            assert!(verify_hash(kind, hash, b"pw"), "{hash}");
            assert!(!verify_hash(kind, hash, b"wrong"), "{hash}");
        }
    }
}
