//! `server.watch_config` also watches the files the configuration names: a
//! listener certificate renewed in place or swapped in as a Kubernetes
//! Secret volume does (`..data` symlink, in a folder of its own), and an
//! htpasswd file edited, are applied without a signal; a reload that names
//! another file moves the watch to it.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use common::pki::Pki;
use common::*;
use gateway::config::{self, Source};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

/// The metrics are the process's: one test at a time, so each counts only
/// its own reloads.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn start(path: &Path) -> TestGateway {
    let c = config::load(&Source::File(path.to_owned())).unwrap_or_else(|e| panic!("{e}"));
    let gw = TestGateway::start(c).await;
    // The watcher starts with the gateway: give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    gw
}

async fn reloads(gw_addr: std::net::SocketAddr, result: &str) -> f64 {
    let m = metrics_text(gw_addr).await;
    sample(&m, "gateway_config_reloads_total", &[("result", result), ("trigger", "watch")]).unwrap_or(0.0)
}

/// Polls `check` every 50 ms for 5 s at most.
async fn eventually<F: std::future::Future<Output = bool>>(mut check: impl FnMut() -> F) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The certificate a new TLS connection to `addr` is served.
async fn served(pki: &Pki, addr: std::net::SocketAddr) -> CertificateDer<'static> {
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(pki.roots())
        .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("localhost").unwrap();
    let tls = TlsConnector::from(Arc::new(config)).connect(name, tcp).await.unwrap();
    tls.get_ref().1.peer_certificates().unwrap()[0].clone().into_owned()
}

fn tls_toml(cert: &str, key: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nwatch_config = true\n[server.tls]\ncert = \"{cert}\"\nkey = \"{key}\"\n\
         [metrics]\nlisten = \"127.0.0.1:0\"\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\nrespond = {{ status = 200, body = \"in\" }}\n"
    )
}

/// A certificate renewed in place, the certificate written and then its
/// key (as certbot's or a script's copy does): served from the next
/// connection on, in one reload (never the new certificate with the old
/// key, which would fail).
#[tokio::test]
async fn a_certificate_renewed_in_place_is_served_without_a_signal() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    let path = pki.path("gateway.toml");
    std::fs::write(&path, tls_toml("server.pem", "server.key")).unwrap();
    let gw = start(&path).await;
    let admin = gw.admin.expect("an admin listener");
    let (ok, errors) = (reloads(admin, "ok").await, reloads(admin, "error").await);
    let old = served(&pki, gw.addr).await;
    assert_eq!(old, pki.certs("server")[0]);

    pki.issue("server", &["localhost"], false);
    let new = pki.certs("server")[0].clone();
    assert!(
        eventually(|| async { served(&pki, gw.addr).await == new }).await,
        "the renewed certificate was not served"
    );
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(reloads(admin, "ok").await, ok + 1.0, "certificate and key: one reload");
    assert_eq!(reloads(admin, "error").await, errors, "never the new certificate with the old key");
}

/// A Kubernetes Secret volume mounted in a folder of its own: `tls.crt ->
/// ..data/tls.crt`, `..data -> ..<timestamp>`; an update writes a new
/// timestamped folder and renames a symlink over `..data`.
#[tokio::test]
async fn a_secret_volume_swap_in_another_folder_is_served() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    let secret = pki.path("secret");
    std::fs::create_dir(&secret).unwrap();
    let swap_in = |stamp: &str| {
        pki.issue("server", &["localhost"], false);
        let folder = secret.join(format!("..{stamp}"));
        std::fs::create_dir(&folder).unwrap();
        std::fs::copy(pki.path("server.pem"), folder.join("tls.crt")).unwrap();
        std::fs::copy(pki.path("server.key"), folder.join("tls.key")).unwrap();
        std::os::unix::fs::symlink(format!("..{stamp}"), secret.join("..data_tmp")).unwrap();
        std::fs::rename(secret.join("..data_tmp"), secret.join("..data")).unwrap();
        pki.certs("server")[0].clone()
    };
    let first = swap_in("2026_12_02_a");
    std::os::unix::fs::symlink("..data/tls.crt", secret.join("tls.crt")).unwrap();
    std::os::unix::fs::symlink("..data/tls.key", secret.join("tls.key")).unwrap();
    let path = pki.path("gateway.toml");
    std::fs::write(&path, tls_toml("secret/tls.crt", "secret/tls.key")).unwrap();
    let gw = start(&path).await;
    assert_eq!(served(&pki, gw.addr).await, first);

    let second = swap_in("2026_12_02_b");
    std::fs::remove_dir_all(secret.join("..2026_12_02_a")).unwrap();
    assert!(
        eventually(|| async { served(&pki, gw.addr).await == second }).await,
        "the swapped-in certificate was not served"
    );
    // And a second update, in the new folder.
    let third = swap_in("2026_12_02_c");
    std::fs::remove_dir_all(secret.join("..2026_12_02_b")).unwrap();
    assert!(eventually(|| async { served(&pki, gw.addr).await == third }).await, "the second swap was not served");
}

// `openssl passwd -5 -salt saltsalt pw-sue`, `openssl passwd -6 -salt saltsalt pw-sam`.
const SUE: &str = "sue:$5$saltsalt$8bjjZ1/oNJbjiGc16HnqjXfT8RpsPqBD8PEOSVduwU6\n";
const SAM: &str =
    "sam:$6$saltsalt$/QtqGX.Gg1a/Ed93hhLT9xhrpTBSKuTyRmAfMCBy.eoFSRCO7qhDlS5ggAPqhWfBw4RlbuCWKAQZMovlc5eE01\n";

fn basic_toml(file: &str) -> String {
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nwatch_config = true\n[[routes]]\nname = \"r\"\nprefix = \"/r\"\n\
         respond = {{ status = 200, body = \"in\" }}\nauth = {{ basic = {{ htpasswd = \"{file}\" }} }}\n"
    )
}

async fn status_as(gw: &TestGateway, user: &str, password: &str) -> u16 {
    let credentials = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let auth = format!("Basic {credentials}");
    let req = http::Request::get(gw.url("/r")).header("authorization", auth).body(full(bytes::Bytes::new())).unwrap();
    send(req).await.0.status.as_u16()
}

/// A user added to the htpasswd file gets in; and once a reload names
/// another file, that file's edits are what count.
#[tokio::test]
async fn an_edited_htpasswd_file_is_applied_and_a_renamed_one_followed() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(dir.path().join("users.htpasswd"), SUE).unwrap();
    std::fs::write(&path, basic_toml("users.htpasswd")).unwrap();
    let gw = start(&path).await;
    assert_eq!(status_as(&gw, "sue", "pw-sue").await, 200);
    assert_eq!(status_as(&gw, "sam", "pw-sam").await, 401);

    std::fs::write(dir.path().join("users.htpasswd"), format!("{SUE}{SAM}")).unwrap();
    assert!(eventually(|| async { status_as(&gw, "sam", "pw-sam").await == 200 }).await, "the added user was refused");

    // The configuration now names another file (in a folder of its own).
    std::fs::create_dir(dir.path().join("auth")).unwrap();
    std::fs::write(dir.path().join("auth/team.htpasswd"), SAM).unwrap();
    std::fs::write(&path, basic_toml("auth/team.htpasswd")).unwrap();
    assert!(eventually(|| async { status_as(&gw, "sue", "pw-sue").await == 401 }).await, "the new file was not loaded");
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(dir.path().join("auth/team.htpasswd"), format!("{SAM}{SUE}")).unwrap();
    assert!(eventually(|| async { status_as(&gw, "sue", "pw-sue").await == 200 }).await, "the new file is not watched");
    // The old file no longer counts.
    let ok = reloads(gw.addr, "ok").await;
    std::fs::write(dir.path().join("users.htpasswd"), SUE).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(reloads(gw.addr, "ok").await, ok, "the file no longer named made a reload");
}

/// What the watcher watches besides the configuration: every certificate,
/// key, CA, htpasswd and JWKS file it read, each once.
#[test]
fn every_file_a_configuration_reads_is_named() {
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    pki.issue("client", &["client"], false);
    let jwks = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jwt/jwks.json");
    std::fs::copy(jwks, pki.path("jwks.json")).unwrap();
    std::fs::write(pki.path("users.htpasswd"), SUE).unwrap();
    std::fs::copy(pki.path("ca.pem"), pki.path("store-ca.pem")).unwrap();
    let toml = "[server.tls]\ncert = 'server.pem'\nkey = 'server.key'\nclient_ca = 'ca.pem'\n\
                [upstreams.s]\nurl = 'https://127.0.0.1:9'\ntls_ca_file = 'ca.pem'\n\
                tls_client_cert = 'client.pem'\ntls_client_key = 'client.key'\n\
                [rate_limit_store]\nurl = 'rediss://127.0.0.1:9'\nca_file = 'store-ca.pem'\n\
                [[routes]]\nname = 'b'\nprefix = '/b'\nupstream = 's'\nauth = { basic = { htpasswd = 'users.htpasswd' } }\n\
                [[routes]]\nname = 'j'\nprefix = '/j'\nupstream = 's'\n\
                auth = { jwt = { jwks_file = 'jwks.json', algorithms = ['ES256'] } }\n\
                [[routes]]\nname = 'b2'\nprefix = '/b2'\nupstream = 's'\nauth = { basic = { htpasswd = 'users.htpasswd' } }\n";
    let c = config::load(&Source::Inline { text: toml.into(), base_dir: pki.dir.path().into() })
        .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<String> =
        c.files().iter().map(|f| f.strip_prefix(pki.dir.path()).unwrap().display().to_string()).collect();
    let want = [
        "server.pem",
        "server.key",
        "ca.pem",
        "client.pem",
        "client.key",
        "users.htpasswd",
        "jwks.json",
        "store-ca.pem",
    ];
    assert_eq!(names, want);
    // And the same from the keys alone, as the watcher takes them.
    assert_eq!(config::named_files(&pki.path("gateway.toml"), toml), Some(c.files()));
}

/// The htpasswd file moved first (`mv`), the configuration edited after
/// to name it where it now is: the edit is applied. The file the running
/// configuration names is missing meanwhile, which must not hold back the
/// configuration's own change.
#[tokio::test]
async fn a_file_moved_before_the_configuration_names_it_there_is_followed() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(dir.path().join("users.htpasswd"), SUE).unwrap();
    std::fs::write(&path, basic_toml("users.htpasswd")).unwrap();
    let gw = start(&path).await;
    assert_eq!(status_as(&gw, "sue", "pw-sue").await, 200);

    std::fs::create_dir(dir.path().join("auth")).unwrap();
    std::fs::rename(dir.path().join("users.htpasswd"), dir.path().join("auth/team.htpasswd")).unwrap();
    // The watcher sees the move on its own (debounce and settle are over).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    std::fs::write(dir.path().join("auth/team.htpasswd"), format!("{SUE}{SAM}")).unwrap();
    std::fs::write(&path, basic_toml("auth/team.htpasswd")).unwrap();
    assert!(
        eventually(|| async { status_as(&gw, "sam", "pw-sam").await == 200 }).await,
        "the configuration naming the moved file was never applied"
    );
}

/// The configuration edited first to name a file not written yet (a failed
/// reload, logged), the file written after: applied, without another edit
/// of the configuration.
#[tokio::test]
async fn a_file_named_before_it_is_written_is_applied_once_written() {
    named_before_it_is_written("later.htpasswd").await;
}

/// The same, the file in a folder that does not exist yet.
#[tokio::test]
async fn a_file_named_in_a_folder_not_made_yet_is_applied_once_written() {
    named_before_it_is_written("auth/team.htpasswd").await;
}

/// The configuration edited to name `file` (relative to its folder, which
/// holds nothing of it yet), then `file` written, its folders made first.
async fn named_before_it_is_written(file: &str) {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(dir.path().join("users.htpasswd"), SUE).unwrap();
    std::fs::write(&path, basic_toml("users.htpasswd")).unwrap();
    let gw = start(&path).await;
    let errors = reloads(gw.addr, "error").await;

    std::fs::write(&path, basic_toml(file)).unwrap();
    assert!(eventually(|| async { reloads(gw.addr, "error").await > errors }).await, "no failed reload");
    let written = dir.path().join(file);
    std::fs::create_dir_all(written.parent().unwrap()).unwrap();
    std::fs::write(&written, SAM).unwrap();
    assert!(
        eventually(|| async { status_as(&gw, "sam", "pw-sam").await == 200 }).await,
        "the file written after the configuration named it was never applied"
    );
}

/// A certificate replaced by one its key does not match (a failed reload),
/// then the right pair: served.
#[tokio::test]
async fn a_failed_certificate_reload_then_a_fix_is_served() {
    let _serial = SERIAL.lock().await;
    let pki = Pki::new();
    pki.issue("server", &["localhost"], false);
    pki.issue("other", &["localhost"], false);
    let path = pki.path("gateway.toml");
    std::fs::write(&path, tls_toml("server.pem", "server.key")).unwrap();
    let gw = start(&path).await;
    let admin = gw.admin.expect("an admin listener");
    let errors = reloads(admin, "error").await;
    let old = served(&pki, gw.addr).await;

    std::fs::write(pki.path("server.pem"), "not a certificate\n").unwrap();
    assert!(eventually(|| async { reloads(admin, "error").await > errors }).await, "no failed reload");
    assert_eq!(served(&pki, gw.addr).await, old, "a failed reload changed the certificate");
    std::fs::copy(pki.path("other.pem"), pki.path("server.pem")).unwrap();
    std::fs::copy(pki.path("other.key"), pki.path("server.key")).unwrap();
    let new = pki.certs("other")[0].clone();
    assert!(eventually(|| async { served(&pki, gw.addr).await == new }).await, "the fix was not served");
}
