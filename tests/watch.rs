//! `server.watch_config`: the file is reloaded when it changes on disk,
//! written in place or swapped in as a Kubernetes ConfigMap volume does
//! (`..data` symlink), and an invalid file changes nothing; counted as
//! reloads with `trigger="watch"`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use gateway::config::{self, Source};
use tokio::time::Instant;

/// The metrics are the process's: one test at a time, so each counts only
/// its own reloads.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn toml(routes: &[&str]) -> String {
    let mut t = "[server]\nlisten = \"127.0.0.1:0\"\nwatch_config = true\n".to_owned();
    for r in routes {
        t.push_str(&format!(
            "[[routes]]\nname = \"w_{r}\"\nprefix = \"/{r}\"\nrespond = {{ status = 200, body = \"{r}\" }}\n"
        ));
    }
    t
}

async fn start(path: &Path) -> TestGateway {
    let c = config::load(&Source::File(path.to_owned())).unwrap_or_else(|e| panic!("{e}"));
    TestGateway::start(c).await
}

/// A gateway on `gateway.toml` in a folder of its own, first written with
/// `routes`, once its watcher has had a moment to start.
async fn watching(routes: &[&str]) -> (tempfile::TempDir, std::path::PathBuf, TestGateway) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, toml(routes)).unwrap();
    let gw = start(&path).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    (dir, path, gw)
}

/// Waits (5 s at most) for `path` to answer `status`.
async fn wait_for(gw: &TestGateway, path: &str, status: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if get(&gw.url(path)).await.0.status == status {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn reloads(gw: &TestGateway, result: &str) -> f64 {
    let m = metrics_text(gw.addr).await;
    sample(&m, "gateway_config_reloads_total", &[("result", result), ("trigger", "watch")]).unwrap_or(0.0)
}

#[tokio::test]
async fn a_written_file_is_reloaded_once_and_an_unchanged_one_not_at_all() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, toml(&["one"])).unwrap();
    let gw = start(&path).await;
    // The watcher starts with the gateway: give it a moment.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ok = reloads(&gw, "ok").await;
    assert_eq!(get(&gw.url("/two")).await.0.status, 404);

    std::fs::write(&path, toml(&["one", "two"])).unwrap();
    assert!(wait_for(&gw, "/two", 200).await, "the new route was not loaded");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(reloads(&gw, "ok").await, ok + 1.0, "one write, one reload");

    // The same bytes again (a touch, another file in the folder): no reload.
    std::fs::write(&path, toml(&["one", "two"])).unwrap();
    std::fs::write(dir.path().join("other.txt"), "x").unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(reloads(&gw, "ok").await, ok + 1.0, "nothing changed in the file");
}

/// A ConfigMap volume: `gateway.toml -> ..data/gateway.toml`, `..data ->
/// ..<timestamp>`; an update writes a new timestamped folder, points
/// `..data_tmp` at it and renames that over `..data`.
#[tokio::test]
async fn a_configmap_symlink_swap_is_reloaded() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::create_dir(d.join("..2026_12_01_a")).unwrap();
    std::fs::write(d.join("..2026_12_01_a/gateway.toml"), toml(&["one"])).unwrap();
    std::os::unix::fs::symlink("..2026_12_01_a", d.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/gateway.toml", d.join("gateway.toml")).unwrap();
    let gw = start(&d.join("gateway.toml")).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ok = reloads(&gw, "ok").await;
    assert_eq!(get(&gw.url("/two")).await.0.status, 404);

    std::fs::create_dir(d.join("..2026_12_01_b")).unwrap();
    std::fs::write(d.join("..2026_12_01_b/gateway.toml"), toml(&["one", "two"])).unwrap();
    std::os::unix::fs::symlink("..2026_12_01_b", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    std::fs::remove_dir_all(d.join("..2026_12_01_a")).unwrap();
    assert!(wait_for(&gw, "/two", 200).await, "the swapped-in file was not loaded");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(reloads(&gw, "ok").await, ok + 1.0);

    // And a second update, in the new folder.
    std::fs::create_dir(d.join("..2026_12_01_c")).unwrap();
    std::fs::write(d.join("..2026_12_01_c/gateway.toml"), toml(&["three"])).unwrap();
    std::os::unix::fs::symlink("..2026_12_01_c", d.join("..data_tmp")).unwrap();
    std::fs::rename(d.join("..data_tmp"), d.join("..data")).unwrap();
    std::fs::remove_dir_all(d.join("..2026_12_01_b")).unwrap();
    assert!(wait_for(&gw, "/three", 200).await, "the second swap was not loaded");
    assert_eq!(get(&gw.url("/two")).await.0.status, 404);
}

#[tokio::test]
async fn an_invalid_file_changes_nothing_and_is_counted() {
    let _serial = SERIAL.lock().await;
    let (_dir, path, gw) = watching(&["one"]).await;
    let errors = reloads(&gw, "error").await;

    std::fs::write(
        &path,
        format!("{}[[routes]]\nname = \"bad\"\nprefix = \"/bad\"\nupstream = \"ghost\"\n", toml(&["one", "two"])),
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while reloads(&gw, "error").await < errors + 1.0 {
        assert!(Instant::now() < deadline, "the invalid file was not tried");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(get(&gw.url("/one")).await.0.status, 200, "still the old routes");
    assert_eq!(get(&gw.url("/two")).await.0.status, 404, "nothing of the invalid file applied");

    // Fixed, it is loaded.
    std::fs::write(&path, toml(&["one", "two"])).unwrap();
    assert!(wait_for(&gw, "/two", 200).await, "the fixed file was not loaded");
}

/// `gateway --watch` turns watching on from the command line.
#[test]
fn the_watch_flag_reloads_the_binary_on_a_change() {
    let dir = tempfile::tempdir().unwrap();
    let addr = common::process::free_addr();
    let path = dir.path().join("gateway.toml");
    let file = |routes: &[&str]| toml(routes).replace("127.0.0.1:0", &addr).replace("watch_config = true\n", "");
    std::fs::write(&path, file(&["one"])).unwrap();
    let mut gw = std::process::Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["--watch", "--config", path.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let wait_for = |p: &str, want: u16| process_status_becomes(&addr, p, want);
    assert!(wait_for("/one", 200), "the gateway came up");
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&path, file(&["one", "two"])).unwrap();
    let reloaded = wait_for("/two", 200);
    std::process::Command::new("kill").args(["-TERM", &gw.id().to_string()]).status().unwrap();
    gw.wait().unwrap();
    assert!(reloaded, "--watch must load the new route");
}

/// Runs `step` every `every` on a thread until the guard drops.
struct Busy(std::sync::Arc<std::sync::atomic::AtomicBool>, Option<std::thread::JoinHandle<()>>);

fn busy(every: Duration, mut step: impl FnMut() + Send + 'static) -> Busy {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::spawn(move || {
        while !s.load(std::sync::atomic::Ordering::Relaxed) {
            step();
            std::thread::sleep(every);
        }
    });
    Busy(stop, Some(thread))
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.1.take().map(std::thread::JoinHandle::join);
    }
}

/// A log file written every few milliseconds next to the configuration
/// neither holds a reload back (its events are not the file's) nor makes
/// one.
#[tokio::test]
async fn a_busy_folder_does_not_hold_back_a_reload() {
    let _serial = SERIAL.lock().await;
    let (dir, path, gw) = watching(&["one"]).await;
    let ok = reloads(&gw, "ok").await;
    let log = dir.path().join("access.log");
    let _writer = busy(Duration::from_millis(5), move || {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        f.write_all(b"GET / 200\n").unwrap();
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&path, toml(&["one", "two"])).unwrap();
    assert!(wait_for(&gw, "/two", 200).await, "the reload never came while the folder was busy");
    assert_eq!(reloads(&gw, "ok").await, ok + 1.0);
}

/// A file touched without pause (its own events, never quiet for the
/// debounce) is still read, within `MAX_DELAY` of its change.
#[tokio::test]
async fn a_file_touched_without_pause_is_still_reloaded() {
    let _serial = SERIAL.lock().await;
    let (_dir, path, gw) = watching(&["one"]).await;
    let touched = path.clone();
    let _toucher = busy(Duration::from_millis(20), move || {
        let f = std::fs::OpenOptions::new().write(true).open(&touched).unwrap();
        f.set_modified(std::time::SystemTime::now()).unwrap();
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&path, toml(&["one", "two"])).unwrap();
    assert!(wait_for(&gw, "/two", 200).await, "events without pause postponed the reload");
}

/// A file written in two steps with a pause between them (a `cat > file`
/// fed slowly, an editor writing in place), whose first step alone parses:
/// only the whole file is applied, in one reload.
#[tokio::test]
async fn a_file_written_in_steps_is_applied_whole_and_once() {
    let _serial = SERIAL.lock().await;
    let (_dir, path, gw) = watching(&["start"]).await;
    let ok = reloads(&gw, "ok").await;
    let (part, whole) = (toml(&["one"]), toml(&["one", "two"]));
    let writer = std::thread::spawn({
        let path = path.clone();
        move || {
            use std::io::Write;
            let mut f = std::fs::File::create(&path).unwrap();
            f.write_all(part.as_bytes()).unwrap();
            // Longer than the debounce, shorter than it and SETTLE together.
            std::thread::sleep(Duration::from_millis(400));
            f.write_all(&whole.as_bytes()[part.len()..]).unwrap();
        }
    });
    assert!(wait_for(&gw, "/two", 200).await, "the whole file was not loaded");
    writer.join().unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(reloads(&gw, "ok").await, ok + 1.0, "the first step was applied on its own before the whole file");
    assert_eq!(get(&gw.url("/start")).await.0.status, 404);
}

fn invalid() -> String {
    format!("{}[[routes]]\nname = \"bad\"\nprefix = \"/bad\"\nupstream = \"ghost\"\n", toml(&["one", "two"]))
}

/// An invalid save and, right after it, the fix: the fix is what ends up
/// applied.
#[tokio::test]
async fn an_invalid_save_then_at_once_a_valid_one_applies_the_valid_one() {
    let _serial = SERIAL.lock().await;
    let (_dir, path, gw) = watching(&["one"]).await;
    std::fs::write(&path, invalid()).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    std::fs::write(&path, toml(&["one", "two"])).unwrap();
    assert!(wait_for(&gw, "/two", 200).await, "the valid file written after the invalid one was not applied");
}

/// The fix of an invalid file arrives without an event the watcher sees
/// (written through another path to the same file, as a bind mount's host
/// or a second hard link does): it is applied all the same.
#[tokio::test]
async fn a_fix_without_an_event_after_a_failed_reload_is_applied() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let path = dir.path().join("gateway.toml");
    std::fs::write(&path, toml(&["one"])).unwrap();
    let other = elsewhere.path().join("same-file.toml");
    std::fs::hard_link(&path, &other).unwrap();
    let gw = start(&path).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let errors = reloads(&gw, "error").await;
    std::fs::write(&path, invalid()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while reloads(&gw, "error").await < errors + 1.0 {
        assert!(Instant::now() < deadline, "the invalid file was not tried");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // In place through the other name: the watched folder hears nothing.
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).truncate(true).open(&other).unwrap();
    f.write_all(toml(&["one", "two"]).as_bytes()).unwrap();
    drop(f);
    assert!(wait_for(&gw, "/two", 200).await, "the fixed file was not applied");
}

/// A file truncated and then rewritten in place, with a pause between
/// the two longer than the watcher waits for a file to settle: the empty
/// file (a valid configuration with no routes) is never applied; the
/// rewrite is.
#[tokio::test]
async fn a_file_truncated_in_place_is_not_applied_while_empty() {
    let _serial = SERIAL.lock().await;
    let (_dir, path, gw) = watching(&["one"]).await;
    let (ok, errors) = (reloads(&gw, "ok").await, reloads(&gw, "error").await);
    std::fs::File::create(&path).unwrap();
    // Past the quiet period, the two reads and a poll.
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(get(&gw.url("/one")).await.0.status, 200, "the empty file was applied");
    assert_eq!((reloads(&gw, "ok").await, reloads(&gw, "error").await), (ok, errors), "no reload of an empty file");

    std::fs::write(&path, toml(&["one", "two"])).unwrap();
    assert!(wait_for(&gw, "/two", 200).await, "the rewritten file was not loaded");
    assert_eq!(get(&gw.url("/one")).await.0.status, 200);
}
