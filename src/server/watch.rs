//! `--watch` / `server.watch_config`: the configuration file is loaded
//! again when it changes on disk, as on SIGHUP (same rules, same metrics,
//! counted with `trigger="watch"`; an invalid file changes nothing); and
//! so it is when a file it names changes (a certificate or key, a CA, an
//! htpasswd or JWKS file: [`crate::config::Config::files`]), since a
//! reload reads those again: a renewed certificate is served from the next
//! connection on, without a signal.
//!
//! The files' folders are watched, not the files: editors save by writing
//! a new file and renaming it over the old one, and a Kubernetes ConfigMap
//! or Secret volume swaps a symlink (`..data`) to a new folder, so a file's
//! own inode never changes. Only events that name a watched file (or its
//! symlink's target), or that leave its path leading to another file (the
//! `..data` swap), count: a log file written next to it every few
//! milliseconds does not. A counted event starts a quiet period
//! (`DEBOUNCE`), bounded by `MAX_DELAY` after its first event so that a
//! file touched without pause is still read; then the files are read
//! twice, `SETTLE` apart, and applied only when both reads agree (a file
//! still being written is not applied half-way, even if its first part
//! parses; a certificate and its key renewed one after the other are
//! applied together), are not empty (a file rewritten in place is empty
//! for a while, and an empty configuration is valid: it has no routes; an
//! empty file is waited out as a missing one) and differ from the last
//! bytes applied or tried, so
//! the several events of one save make at most one reload. The reload
//! parses exactly the configuration bytes checked. Without events the
//! files are still compared every `POLL`, so the last state of the files
//! is always the one evaluated: a fix that no event told of (written
//! through another path, a bind mount) is applied after a failed reload
//! too. Before each reload the set of files is taken again from the keys
//! of the configuration bytes checked, whether the reload succeeds or not.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use notify::event::ModifyKind;
use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::{App, Trigger};

/// How long the files must be quiet before they are read.
pub const DEBOUNCE: Duration = Duration::from_millis(250);
/// The longest a change waits after its first event, however often the
/// file is touched: events without pause must not postpone it for ever.
pub const MAX_DELAY: Duration = Duration::from_secs(2);
/// How long the bytes read after the quiet period must stay the same before
/// they are applied.
pub const SETTLE: Duration = Duration::from_millis(500);
/// How often a watcher with no event compares the files with the bytes last
/// applied or tried (and checks that the app still runs).
const POLL: Duration = Duration::from_secs(2);

/// What each watched file held at a look (`None`: missing, unreadable or
/// empty), in the order of the watched paths.
type Contents = Vec<Option<Vec<u8>>>;

/// Watches `path`, and the files its configuration names, for as long as
/// `app` runs.
pub async fn watch(app: Weak<App>, path: PathBuf) {
    // Absolute, as the paths of the folders' events are.
    let path = std::path::absolute(&path).unwrap_or(path);
    let Some(files) = app.upgrade().map(|a| watched(&a, &path)) else { return };
    // Dropped at the end: it stops watching.
    let Some(mut watching) = Watching::start(files) else { return };
    tracing::info!(
        file = %path.display(),
        files_named = watching.files.len() - 1,
        "watching the configuration file and the files it names for changes"
    );
    let mut seen = read_all(&watching.files).await;
    // A change is still to be read, without waiting for another event.
    let mut due = false;
    loop {
        if !due {
            match tokio::time::timeout(POLL, watching.rx.recv()).await {
                Ok(Some(())) => {}
                Ok(None) => return,
                Err(_) if app.strong_count() == 0 => return,
                // No event: the bytes are compared all the same, so that a
                // change no event told of (a fix written through another
                // path after a failed reload) is what ends up applied.
                Err(_) if read_all(&watching.files).await != seen => {}
                Err(_) => continue,
            }
        }
        due = false;
        if !settle(&mut watching.rx, Instant::now()).await {
            return;
        }
        let now = match read_settled(&watching.files).await {
            Read::Settled(now) => now,
            Read::Moving => {
                due = true;
                continue;
            }
            Read::Unreadable(file) => {
                tracing::debug!(file = %file.display(), "file unreadable or empty after a change; waiting for the next");
                continue;
            }
        };
        if now == seen {
            continue;
        }
        // A file the configuration names is missing while the
        // configuration is unchanged: being replaced (its arrival is an
        // event), and a reload would fail. With the configuration changed,
        // the reload goes ahead: the new one may no longer name it.
        if now[0] == seen[0]
            && let Some(i) = now.iter().position(Option::is_none)
        {
            tracing::debug!(file = %watching.files[i].display(), "file missing after a change; waiting for the next");
            continue;
        }
        let Some(app) = app.upgrade() else { return };
        let changed = watching.files.iter().zip(now.iter().zip(&seen)).filter(|(_, (n, s))| n != s);
        let changed: Vec<String> = changed.map(|(f, _)| f.display().to_string()).collect();
        tracing::info!(files = changed.join(", "), "configuration changed on disk: reloading");
        // Exactly the bytes checked; not UTF-8, the file is read again
        // for the reload to say why it fails.
        let text = now[0].clone().and_then(|b| String::from_utf8(b).ok());
        seen = now;
        // The files these bytes name, watched before the reload reads them
        // (a change after that read is an event, or differs from `seen`),
        // and whether the reload succeeds or not (one fails when a file it
        // names is not written yet: its arrival must count).
        let files = text.as_deref().and_then(|t| named(&path, t)).unwrap_or_else(|| watching.files.clone());
        if files != watching.files {
            seen = watching.follow_seen(files, seen).await;
        }
        // Logged and counted by the reload, either way.
        let _ = tokio::task::spawn_blocking(move || app.reload_from(Trigger::Watch, text.as_deref())).await;
    }
}

/// The configuration file first, then the files `text`, its bytes, names
/// (`None`: not a configuration's TOML).
fn named(path: &Path, text: &str) -> Option<Vec<PathBuf>> {
    let named = crate::config::named_files(path, text)?;
    Some(with_configuration(path, named))
}

/// The configuration file first, then the files the configuration running
/// now names.
fn watched(app: &App, path: &Path) -> Vec<PathBuf> {
    let current = app.reloading.lock().unwrap_or_else(|e| e.into_inner());
    with_configuration(path, current.files())
}

/// `path` first, then `named` made absolute (as the events' paths are),
/// each once.
fn with_configuration(path: &Path, named: Vec<PathBuf>) -> Vec<PathBuf> {
    let mut files = vec![path.to_owned()];
    for file in named.into_iter().map(|f| std::path::absolute(&f).unwrap_or(f)) {
        if !files.contains(&file) {
            files.push(file);
        }
    }
    files
}

/// The watcher on the files' folders, and the channel its relevant events
/// arrive on.
struct Watching {
    watcher: notify::RecommendedWatcher,
    rx: mpsc::UnboundedReceiver<()>,
    concern: Arc<Concern>,
    files: Vec<PathBuf>,
    folders: Vec<PathBuf>,
}

impl Watching {
    fn start(files: Vec<PathBuf>) -> Option<Watching> {
        let (tx, rx) = mpsc::unbounded_channel::<()>();
        let concern = Arc::new(Concern::new(&files));
        let told = concern.clone();
        let watcher = match notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            // An error may mean events were lost: read the files to be sure.
            if event.as_ref().map_or(true, |e| told.matters(e)) {
                let _ = tx.send(());
            }
        }) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch the configuration file; reload with SIGHUP");
                return None;
            }
        };
        let mut watching = Watching { watcher, rx, concern, files: Vec::new(), folders: Vec::new() };
        watching.follow(files);
        Some(watching)
    }

    /// Watches `files` from now on: their folders are watched, and those
    /// no file is in any more are not.
    fn follow(&mut self, files: Vec<PathBuf>) {
        self.concern.set(&files);
        let mut folders: Vec<PathBuf> = Vec::new();
        for dir in files.iter().flat_map(|f| folders_of(f)) {
            if !folders.contains(&dir) {
                folders.push(dir);
            }
        }
        for dir in self.folders.iter().filter(|d| !folders.contains(d)) {
            let _ = self.watcher.unwatch(dir);
        }
        for dir in folders.iter().filter(|d| !self.folders.contains(d)) {
            if let Err(e) = self.watcher.watch(dir, RecursiveMode::NonRecursive) {
                tracing::warn!(folder = %dir.display(), error = %e, "cannot watch a configuration file's folder");
            }
        }
        self.files = files;
        self.folders = folders;
    }

    /// [`Watching::follow`], and what `seen` held of the files watched so
    /// far, in the order of the new set: kept for the files still watched,
    /// read for the new ones.
    async fn follow_seen(&mut self, files: Vec<PathBuf>, mut seen: Contents) -> Contents {
        let before = std::mem::take(&mut self.files);
        self.follow(files);
        let mut next = Vec::with_capacity(self.files.len());
        for file in &self.files {
            match before.iter().position(|f| f == file) {
                Some(i) => next.push(seen[i].take()),
                None => next.push(read(file).await),
            }
        }
        next
    }
}

/// Each file's bytes (`None`: missing, unreadable or empty; see [`read`]).
async fn read_all(files: &[PathBuf]) -> Contents {
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        out.push(read(file).await);
    }
    out
}

/// A file's bytes; `None` when it is missing, unreadable or empty. A file
/// rewritten in place is empty from its truncation to its first write,
/// and an empty configuration is a valid one with no routes (an empty
/// htpasswd file, one with no users): so an empty file is waited out as a
/// missing one is, never applied.
async fn read(file: &Path) -> Option<Vec<u8>> {
    tokio::fs::read(file).await.ok().filter(|bytes| !bytes.is_empty())
}

/// What reading the files that have just been quiet gave.
enum Read {
    /// The same bytes twice, `SETTLE` apart.
    Settled(Contents),
    /// Different bytes: still being written.
    Moving,
    /// The configuration file missing, unreadable or empty (being
    /// replaced or rewritten: its arrival is an event). A file it names may be missing: a
    /// configuration changed meanwhile may not name it any more.
    Unreadable(PathBuf),
}

/// Reads the files twice, `SETTLE` apart: a writer that pauses between its
/// steps (a `cat > file`, an editor writing in place, a certificate written
/// before its key) for less than the debounce and `SETTLE` together is
/// never read half-way, even when what it wrote so far parses; and a change
/// whose events were missed (written through another path, a bind mount)
/// is caught by the second read.
async fn read_settled(files: &[PathBuf]) -> Read {
    let first = read_all(files).await;
    if first[0].is_none() {
        return Read::Unreadable(files[0].clone());
    }
    tokio::time::sleep(SETTLE).await;
    let second = read_all(files).await;
    match second[0] {
        None => Read::Unreadable(files[0].clone()),
        Some(_) if second == first => Read::Settled(second),
        Some(_) => Read::Moving,
    }
}

/// The rest of a save (or swap) that started at `first`: returns once no
/// event came for `DEBOUNCE`, or `MAX_DELAY` after `first`; false when the
/// watcher is gone.
async fn settle(rx: &mut mpsc::UnboundedReceiver<()>, first: Instant) -> bool {
    let bound = first + MAX_DELAY;
    loop {
        let now = Instant::now();
        if now >= bound {
            return true;
        }
        match tokio::time::timeout_at((now + DEBOUNCE).min(bound), rx.recv()).await {
            Ok(Some(())) => continue,
            Ok(None) => return false,
            Err(_) => return true,
        }
    }
}

/// Which of the watched folders' events concern the watched files.
struct Concern {
    /// Each file's absolute path, and where it led at the last look
    /// (through any symlinks).
    files: Mutex<Vec<(PathBuf, Option<PathBuf>)>>,
}

impl Concern {
    fn new(files: &[PathBuf]) -> Concern {
        let concern = Concern { files: Mutex::new(Vec::new()) };
        concern.set(files);
        concern
    }

    fn set(&self, files: &[PathBuf]) {
        let targets = files.iter().map(|f| (f.clone(), std::fs::canonicalize(f).ok())).collect();
        *self.files.lock().unwrap_or_else(|e| e.into_inner()) = targets;
    }

    /// Not reads (the reload's own read of the files would start the next
    /// round); an event that names a file or its target; or a rename,
    /// creation or removal after which a path leads elsewhere. Writes to
    /// other files cannot move a path, so they cost no lookup.
    fn matters(&self, event: &notify::Event) -> bool {
        if event.kind.is_access() {
            return false;
        }
        if event.need_rescan() {
            return true;
        }
        let mut files = self.files.lock().unwrap_or_else(|e| e.into_inner());
        let named = |(path, target): &(PathBuf, Option<PathBuf>)| {
            event.paths.iter().any(|p| p == path || Some(p) == target.as_ref())
        };
        if files.iter().any(named) {
            return true;
        }
        if matches!(event.kind, EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Metadata(_))) {
            return false;
        }
        let mut moved = false;
        for (path, target) in files.iter_mut() {
            let now = std::fs::canonicalize(&*path).ok();
            if now != *target {
                *target = now;
                moved = true;
            }
        }
        moved
    }
}

/// The file's folder, and its real file's folder when the path is a
/// symlink into another one (edited there, not through the link).
fn folders_of(path: &Path) -> Vec<PathBuf> {
    let parent = |p: &Path| {
        p.parent().filter(|d| !d.as_os_str().is_empty()).map_or_else(|| PathBuf::from("."), Path::to_path_buf)
    };
    let mut dirs = vec![parent(path)];
    if let Ok(real) = std::fs::canonicalize(path) {
        let real_dir = parent(&real);
        let own = std::fs::canonicalize(&dirs[0]).unwrap_or_else(|_| dirs[0].clone());
        // A ConfigMap's real folder is replaced at each update: its own
        // folder's `..data` swap is what tells.
        let swapped = real_dir.file_name().is_some_and(|n| n.to_string_lossy().starts_with(".."));
        if real_dir != own && !swapped {
            dirs.push(real_dir);
        }
    }
    dirs
}
