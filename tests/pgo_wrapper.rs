//! pgo/rustc-wrapper, which cargo runs each rustc through
//! (.cargo/config.toml): an optimised build gets the profile, every other
//! build runs rustc untouched. Driven here with a stand-in rustc that prints
//! the arguments it was given and, asked `-vV`, an LLVM version.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The rustc that made the profile, as `rustc -V` says.
fn profile_rustc() -> String {
    std::fs::read_to_string(repo().join("pgo/rustc-version")).unwrap().trim().to_owned()
}

/// A stand-in rustc of LLVM `major` in `dir`, saying `version` of itself.
fn fake_rustc(dir: &Path, major: u32, version: &str) -> PathBuf {
    let path = dir.join(format!("rustc-llvm{major}-{}", version.len()));
    let script = format!(
        "#!/bin/sh\nif [ \"$1\" = -vV ]; then echo '{version}'; echo 'LLVM version: {major}.1.0'; exit 0; fi\necho \"$@\"\n"
    );
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// What the stand-in was run with, through the wrapper.
fn run(rustc: &Path, args: &[&str], pgo: Option<&str>) -> String {
    run_said(rustc, args, pgo).0
}

/// [`run`], and what the wrapper wrote to its standard error.
fn run_said(rustc: &Path, args: &[&str], pgo: Option<&str>) -> (String, String) {
    let mut cmd = Command::new(repo().join("pgo/rustc-wrapper"));
    cmd.arg(rustc).args(args).env_remove("GATEWAY_PGO");
    if let Some(v) = pgo {
        cmd.env("GATEWAY_PGO", v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap().trim().to_owned(), String::from_utf8(out.stderr).unwrap())
}

#[test]
fn only_an_optimised_build_by_a_new_enough_llvm_gets_the_profile() {
    let dir = tempfile::tempdir().unwrap();
    let want: u32 = std::fs::read_to_string(repo().join("pgo/llvm-major")).unwrap().trim().parse().unwrap();
    assert!(repo().join("pgo/gateway.profdata").is_file(), "the profile is checked in");
    let made = profile_rustc();
    let (same, newer, older) = (
        fake_rustc(dir.path(), want, &made),
        fake_rustc(dir.path(), want + 1, &made),
        fake_rustc(dir.path(), want - 1, &made),
    );
    let profile = format!("-Cprofile-use={}", repo().join("pgo/gateway.profdata").canonicalize().unwrap().display());
    let release = ["--crate-name", "gateway", "-C", "opt-level=3", "-C", "lto"];
    // (rustc, its arguments, GATEWAY_PGO, whether the profile is added)
    let cases: &[(&Path, &[&str], Option<&str>, bool)] = &[
        (&same, &release, None, true),
        (&newer, &release, None, true),
        (&same, &release, Some("on"), true),
        // Warnings of a stale profile shown.
        (&same, &release, Some("warn"), true),
        (&same, &["--crate-name", "gateway", "-C", "opt-level=3"], None, true),
        // An older LLVM could not read the profile.
        (&older, &release, None, false),
        (&same, &release, Some("off"), false),
        // Debug builds and tests, build scripts.
        (&same, &["--crate-name", "gateway", "-C", "debuginfo=2"], None, false),
        (&same, &["--crate-name", "build_script_build", "-C", "opt-level=0"], None, false),
        // Builds that instrument: a profile's own training, fuzzing.
        (&same, &["-C", "opt-level=3", "-Cprofile-generate=/tmp/x"], None, false),
        (&same, &["-C", "opt-level=3", "-Cpasses=sancov-module"], None, false),
        (&same, &["-C", "opt-level=3", "-Cinstrument-coverage"], None, false),
    ];
    for (rustc, args, pgo, added) in cases {
        let got = run(rustc, args, *pgo);
        let mut expected = args.join(" ");
        if *added {
            expected = format!("{expected} {profile}");
            if *pgo != Some("warn") {
                expected.push_str(" -Cllvm-args=-no-pgo-warn-mismatch");
            }
        }
        assert_eq!(got, expected, "{} {args:?} GATEWAY_PGO={pgo:?}", rustc.display());
    }
    // Another rustc of the same LLVM: no profile, and a warning for the
    // gateway's own crates (its library and binary), not every dependency.
    let other = fake_rustc(dir.path(), want, "rustc 0.0.1 (000000000 2000-01-01)");
    let (got, said) = run_said(&other, &release, None);
    assert_eq!(got, release.join(" "));
    assert!(said.contains("made by") && said.contains("rustc 0.0.1"), "{said:?}");
    let dependency = ["--crate-name", "tokio", "-C", "opt-level=3"];
    assert_eq!(run_said(&other, &dependency, None), (dependency.join(" "), String::new()));
    // Probes pass through: cargo asks rustc for its version through it.
    assert!(run(&same, &["-vV"], None).ends_with(&format!("LLVM version: {want}.1.0")));
}

/// The profile names each function by its symbol, and every symbol of the
/// crate carries a hash of its dependencies (cargo's `-C metadata`): with
/// another Cargo.lock (a dependency added, bumped or removed, the version
/// changed) the profile matches no function and guides nothing, silently.
/// benches/pgo-train records the lock it trained with.
#[test]
fn the_profile_was_trained_with_this_cargo_lock() {
    let out = Command::new("sha256sum").arg(repo().join("Cargo.lock")).output().unwrap();
    let lock = String::from_utf8(out.stdout).unwrap();
    let trained = std::fs::read_to_string(repo().join("pgo/cargo-lock.sha256")).unwrap();
    assert_eq!(
        lock.split_whitespace().next(),
        Some(trained.trim()),
        "Cargo.lock changed since pgo/gateway.profdata was made: every symbol is renamed and the \
         profile guides no function. Run benches/pgo-train (about 8 minutes) and commit pgo/"
    );
}
