//! The shutdown and stability soak: `scripts/soak.py` drives a
//! minute of mixed load with misbehaving upstreams through the gateway, then
//! checks that resident memory, open fds and live tasks return to within a
//! small margin of their level before the load. It takes well over a minute
//! and loads the machine, so it is ignored by default:
//!
//! ```sh
//! cargo test --test soak -- --ignored
//! ```
//!
//! The script prints its progress and the before/after table itself.

use std::process::Command;

#[test]
#[ignore = "a minute of load on loopback; run with --ignored"]
fn soak_returns_to_baseline() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/soak.py");
    let status = Command::new("python3")
        .args([script, "--duration", "60", "--gateway"])
        .arg(env!("CARGO_BIN_EXE_gateway"))
        .status()
        .expect("python3 runs scripts/soak.py");
    assert!(status.success(), "scripts/soak.py failed: {status}");
}
