//! gRPC through the gateway end to end: a real gRPC
//! server and client (Python grpcio, installed by the test into
//! `target/grpc-venv` on first use) talk over h2c through a proxy route
//! with `protocol = "h2c"`: a unary call, a server-streaming call, a
//! non-OK `grpc-status` in trailers, and a deadline shorter than the route
//! timeout.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The grpcio the test installs.
const GRPCIO: &str = "grpcio==1.85.3";

/// A Python with grpcio: `target/grpc-venv`, made on first use.
fn python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = root.join("target/grpc-venv");
    let python = venv.join("bin/python");
    let marker = venv.join("installed.txt");
    if std::fs::read_to_string(&marker).ok().as_deref() != Some(GRPCIO) {
        let made = Command::new("python3").args(["-m", "venv", "--clear"]).arg(&venv).status().expect("python3 runs");
        assert!(made.success(), "python3 -m venv failed (Debian: apt-get install python3-venv)");
        let pip = Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check", GRPCIO])
            .status()
            .expect("pip runs");
        assert!(pip.success(), "pip install {GRPCIO} failed (needs PyPI)");
        std::fs::write(&marker, GRPCIO).unwrap();
    }
    python
}

#[tokio::test]
async fn grpc_unary_streaming_errors_and_deadlines_pass_through() {
    let python = tokio::task::spawn_blocking(python).await.unwrap();
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/grpc");
    let mut server = tokio::process::Command::new(&python)
        .arg(scripts.join("server.py"))
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the gRPC server");
    let mut ready = BufReader::new(server.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), ready.next_line()).await.expect("server starts in time");
    let line = line.unwrap().unwrap_or_default();
    let port: u16 = line.strip_prefix("ready ").and_then(|p| p.parse().ok()).expect("the server says its port");

    let toml = format!(
        "[server]\n[upstreams.grpc]\nurl = \"http://127.0.0.1:{port}\"\nprotocol = \"h2c\"\n\
         [[routes]]\nname = \"grpc\"\nprefix = \"/demo.Echo\"\nupstream = \"grpc\"\ntimeout = \"5s\"\n"
    );
    let gw = TestGateway::from_toml(&toml).await;
    let client = tokio::process::Command::new(&python)
        .arg(scripts.join("client.py"))
        .arg(gw.addr.to_string())
        .stderr(Stdio::inherit())
        .output();
    let out = tokio::time::timeout(Duration::from_secs(60), client).await.expect("client finishes").unwrap();
    assert!(out.status.success(), "client failed: {}", String::from_utf8_lossy(&out.stdout));
    let got: serde_json::Value = serde_json::from_slice(&out.stdout).expect("client prints JSON");
    assert_eq!(got["say"], "echo: hello");
    assert_eq!(got["count"], serde_json::json!(["item 0", "item 1", "item 2", "item 3", "item 4"]));
    assert_eq!(got["fail"], serde_json::json!(["NOT_FOUND", "no such thing"]), "grpc-status in trailers");
    assert_eq!(got["slow"], "DEADLINE_EXCEEDED");
    assert!(got["slow_s"].as_f64().unwrap() < 1.5, "the client's deadline, not the route's 5 s: {got}");
    let text = metrics_text(gw.addr).await;
    assert!(sample(&text, "http_server_requests_total", &[("route", "grpc"), ("status", "200")]).unwrap() >= 3.0);
}
