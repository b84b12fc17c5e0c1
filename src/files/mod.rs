//! File and directory routes: path sanitising (pure, table-tested), async
//! reads, a small content cache that follows the file on disk, validators
//! (`ETag`, `Last-Modified`), conditional requests and single byte ranges.
//!
//! Hand-written rather than tower-http's `ServeDir`/`ServeFile`: those send no
//! `ETag` and ignore `If-None-Match`, and re-open and re-read the file for
//! every request; here a small file's bytes are kept and revalidated against
//! the file's metadata on each request, so a change on disk (content, ETag,
//! Last-Modified) is seen by the very next request. Range parsing comes from
//! `http-range-header`, content types from `mime_guess`, dates from `httpdate`.

use std::ffi::OsString;
use std::io::SeekFrom;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use crate::body::FileBody;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode, Uri};
use tokio::io::{AsyncReadExt, AsyncSeekExt};

use crate::body::Body;
use crate::error::GatewayError;
use crate::headers::X_REQUEST_ID;
use crate::layers::compress::{self as compression, negotiate};

mod conditional;
mod open;
mod sanitize;
mod variants;
use conditional::{Plan, none_match, plan};
use open::{not_found_or_io, open, resolve};
use sanitize::hidden;
pub use sanitize::sanitize;
use variants::Variants;

/// A `dir` route's tree: its root (canonical) and whether names that start
/// with a dot are served.
#[derive(Debug, Clone, Copy)]
pub struct Dir<'a> {
    pub root: &'a Path,
    pub dotfiles: bool,
}

/// Files up to this size are kept in memory.
pub const CACHE_FILE_MAX: u64 = 256 * 1024;
/// Total bytes the cache holds before it is emptied and refilled.
pub const CACHE_TOTAL_MAX: u64 = 32 * 1024 * 1024;
/// Read size when streaming a larger file.
const STREAM_CHUNK: usize = 64 * 1024;

/// What the cache knows of one file, checked against its metadata.
struct Entry {
    len: u64,
    /// The file's modification time, as the cache compares it.
    modified: SystemTime,
    /// The time `Last-Modified` gives and conditions compare with: the
    /// file's, but none before 1970 (an HTTP date cannot say it) and none
    /// after the entry was made (RFC 9110 §8.8.2.1).
    shown: SystemTime,
    /// Which file it is and its last change (see [`identity`]).
    inode: Identity,
    etag: HeaderValue,
    last_modified: HeaderValue,
    content_type: HeaderValue,
    /// The content, for files up to [`CACHE_FILE_MAX`].
    bytes: Option<Bytes>,
    /// The headers of a full 200 response, built once per version of the
    /// file: cloning them is cheaper than inserting five headers each time.
    /// With request IDs on, they hold a placeholder `X-Request-Id` that
    /// [`crate::server::App::handle`] replaces: a clone has no spare room,
    /// and adding a sixth header to it reallocates the map, where replacing
    /// a value does not (see benches/README.md, Decisions).
    full_headers: HeaderMap,
    /// Compressed forms, for routes that compress.
    variants: Variants,
}

/// The time a file's `Last-Modified` shows: its modification time, but
/// never later than now by the clock the answers' `Date` comes from (RFC
/// 9110 §8.8.2.1; the coarse one, up to a tick behind the file system's),
/// nor before 1970.
fn shown_time(modified: SystemTime) -> SystemTime {
    modified.clamp(SystemTime::UNIX_EPOCH, crate::clock::coarse_now())
}

impl Entry {
    fn new(path: &Path, modified: SystemTime, inode: Identity, len: u64, bytes: Option<Bytes>, id_slot: bool) -> Entry {
        let etag = entity_tag(modified, &inode, len, bytes.as_deref());
        let shown = shown_time(modified);
        let last_modified =
            HeaderValue::from_str(&httpdate::fmt_http_date(shown)).expect("an http date is a valid header");
        let mime = mime_guess::from_path(path).first_or_octet_stream();
        let content_type = if mime.type_() == mime_guess::mime::TEXT && mime.get_param("charset").is_none() {
            format!("{mime}; charset=utf-8")
        } else {
            mime.to_string()
        };
        let content_type =
            HeaderValue::from_str(&content_type).unwrap_or(HeaderValue::from_static("application/octet-stream"));
        // Room for seven: an insert reserves a slot before it looks for the
        // name, so a map at its capacity (six, for `with_capacity(6)`)
        // grows even when the insert only replaces a value.
        let mut full_headers = HeaderMap::with_capacity(7);
        full_headers.insert(header::ETAG, etag.clone());
        full_headers.insert(header::LAST_MODIFIED, last_modified.clone());
        full_headers.insert(header::CONTENT_TYPE, content_type.clone());
        full_headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
        full_headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        if id_slot {
            full_headers.insert(X_REQUEST_ID, HeaderValue::from_static("-"));
        }
        Entry {
            len,
            modified,
            shown,
            inode,
            etag,
            last_modified,
            content_type,
            bytes,
            full_headers,
            variants: Variants::default(),
        }
    }

    fn matches(&self, meta: &std::fs::Metadata) -> bool {
        self.len == meta.len() && Some(self.modified) == meta.modified().ok() && self.inode == identity(meta)
    }
}

/// A file's device and inode, and when its inode last changed (`ctime`,
/// which no one can set back): a file rewritten in place, or deleted and
/// made again on a freed inode number, with its length and `mtime` kept
/// (as `cp -p` and reproducible builds keep them), is another file.
type Identity = (u64, u64, i64, i64);

fn identity(meta: &std::fs::Metadata) -> Identity {
    (meta.dev(), meta.ino(), meta.ctime(), meta.ctime_nsec())
}

/// A file's strong `ETag`. A kept file's is made from its content (the
/// first 64 bits of its SHA-256) and length: the same on every instance
/// that serves the same bytes, another whenever they change, even with the
/// length and `mtime` kept (RFC 9110 §8.8.3). A streamed file is not read
/// whole: its tag is its modification and change times and its length.
fn entity_tag(modified: SystemTime, inode: &Identity, len: u64, bytes: Option<&[u8]>) -> HeaderValue {
    use sha2::{Digest, Sha256};
    let tag = match bytes {
        Some(bytes) => {
            let digest = Sha256::digest(bytes);
            let hash = u64::from_be_bytes(digest[..8].try_into().expect("a SHA-256 has 32 bytes"));
            format!("\"{hash:016x}-{len:x}\"")
        }
        None => {
            let since_epoch = modified.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
            let changed = i128::from(inode.2) * 1_000_000_000 + i128::from(inode.3);
            format!("\"{:x}-{changed:x}-{len:x}\"", since_epoch.as_nanos())
        }
    };
    HeaderValue::from_str(&tag).expect("a hex etag is a valid header")
}

/// Serves files, keeping small ones in memory.
#[derive(Default)]
pub struct FileServer {
    cache: RwLock<Cache>,
    /// Every response gets an `X-Request-Id` (see `Entry::full_headers`).
    request_ids: bool,
}

#[derive(Default)]
struct Cache {
    /// Keyed by the path's bytes: hashing a `Path` walks its components.
    /// Hashed with foldhash, not SipHash, for cheaper lookups (see
    /// benches/README.md, Decisions): only files that exist under a
    /// configured root become keys, so a client cannot fill it with
    /// colliding ones; foldhash is seeded per process.
    entries: foldhash::HashMap<OsString, Arc<Entry>>,
    bytes: u64,
}

impl FileServer {
    /// `request_ids`: every response will get an `X-Request-Id`.
    pub fn new(request_ids: bool) -> FileServer {
        FileServer { request_ids, ..FileServer::default() }
    }

    /// Serves a `dir` route: `rest` is the path after the prefix, `uri` the
    /// whole (normalised) request target. A directory is served as its
    /// `index.html` at the slash form of its URL; without the slash it is
    /// redirected there (301, query kept), as nginx does, so that the page's
    /// relative links resolve inside the directory.
    pub async fn serve_dir(
        &self,
        Dir { root, dotfiles }: Dir<'_>,
        rest: &str,
        uri: &Uri,
        method: &Method,
        headers: &HeaderMap,
        compress: bool,
    ) -> Result<Response<Body>, GatewayError> {
        let relative = sanitize(rest)?;
        // The name asked for (a `.env` that links to `conf/prod.env`), and
        // before any redirect, which would tell a hidden directory exists.
        if !dotfiles && hidden(&relative) {
            return Err(GatewayError::NotFound);
        }
        let mut path = resolve(root, &root.join(relative)).await?;
        // A blocking stat, as in `serve_file` and for the same reason.
        if path.is_dir() {
            if !uri.path().ends_with('/') {
                return Ok(redirect_to_slash(uri));
            }
            path = resolve(root, &path.join("index.html")).await?;
        } else if rest.ends_with('/') {
            // A file is not a directory: `/a.txt/` is not `/a.txt`.
            return Err(GatewayError::NotFound);
        }
        // And the path resolved: a link to `.git` is hidden too.
        if !dotfiles && path.strip_prefix(root).is_ok_and(hidden) {
            return Err(GatewayError::NotFound);
        }
        self.serve(&path, Some(root), method, headers, compress).await
    }

    /// Serves one file (a `file` route's, which has no root to stay in).
    pub async fn serve_file(
        &self,
        path: &Path,
        method: &Method,
        headers: &HeaderMap,
        compress: bool,
    ) -> Result<Response<Body>, GatewayError> {
        self.serve(path, None, method, headers, compress).await
    }

    /// Serves the file at `path`, which must lie under `root` if given.
    async fn serve(
        &self,
        path: &Path,
        root: Option<&Path>,
        method: &Method,
        headers: &HeaderMap,
        compress: bool,
    ) -> Result<Response<Body>, GatewayError> {
        // One stat per request keeps the cache honest about changes on disk.
        // It is a blocking call on purpose: a metadata lookup of a recently
        // used path is answered from the kernel's inode cache in about a
        // microsecond, far less than handing it to the blocking thread pool
        // would cost; the reads of file contents below are async.
        let meta = std::fs::metadata(path).map_err(not_found_or_io)?;
        if !meta.is_file() {
            return Err(GatewayError::NotFound);
        }
        // A kept file's bytes were read from a descriptor checked as below,
        // and the path's inode is theirs: a path that now leads elsewhere
        // has another inode and is not answered from them.
        let (entry, file) = match self.lookup(path, &meta).filter(|e| e.bytes.is_some()) {
            Some(entry) => (entry, None),
            None => {
                // Everything else comes from one descriptor: its validators
                // and its bytes are one file's, whatever the path leads to
                // by the time each is read.
                let (file, meta) = open(path, root)?;
                match self.lookup(path, &meta) {
                    Some(entry) => (entry, Some(file)),
                    None => self.load(path, file, &meta).await?,
                }
            }
        };
        if compress {
            respond_compressed(&entry, file, method, headers).await
        } else {
            respond(&entry, file, method, headers).await
        }
    }

    fn lookup(&self, path: &Path, meta: &std::fs::Metadata) -> Option<Arc<Entry>> {
        let cache = self.cache.read().expect("file cache lock");
        cache.entries.get(path.as_os_str()).filter(|e| e.matches(meta)).cloned()
    }

    /// The entry for the opened `file` (`meta` its own), with its bytes if
    /// it is small (then the file is done with), else the file to stream.
    async fn load(
        &self,
        path: &Path,
        file: std::fs::File,
        meta: &std::fs::Metadata,
    ) -> Result<(Arc<Entry>, Option<std::fs::File>), GatewayError> {
        let modified = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let mut bytes = None;
        let mut kept = None;
        if meta.len() <= CACHE_FILE_MAX {
            let mut content = Vec::with_capacity(meta.len() as usize);
            let mut file = tokio::fs::File::from_std(file);
            file.read_to_end(&mut content).await?;
            let after = file.metadata().await?;
            if content.len() as u64 != meta.len() || after.modified().ok() != Some(modified) {
                // Changed while we read it: serve what we read, cache nothing.
                let len = content.len() as u64;
                let entry = Entry::new(path, modified, (0, 0, 0, 0), len, Some(content.into()), self.request_ids);
                return Ok((Arc::new(entry), None));
            }
            bytes = Some(Bytes::from(content));
        } else {
            kept = Some(file);
        }
        let entry = Arc::new(Entry::new(path, modified, identity(meta), meta.len(), bytes, self.request_ids));
        let mut cache = self.cache.write().expect("file cache lock");
        // Requests that missed together all use the first entry cached, so
        // its compressed forms are made once, not once per entry.
        if let Some(first) = cache.entries.get(path.as_os_str()).filter(|e| e.matches(meta)) {
            return Ok((first.clone(), kept));
        }
        let size = entry.bytes.as_ref().map_or(0, |b| b.len() as u64);
        if cache.bytes + size > CACHE_TOTAL_MAX {
            cache.entries.clear();
            cache.bytes = 0;
        }
        if let Some(old) = cache.entries.insert(path.as_os_str().to_owned(), entry.clone()) {
            cache.bytes -= old.bytes.as_ref().map_or(0, |b| b.len() as u64);
        }
        cache.bytes += size;
        Ok((entry, kept))
    }
}

/// 301 to `uri`'s path with a `/` appended, query kept. A path that starts
/// with `//` (possible with `merge_slashes` off) is given one leading slash:
/// `//host/` as a Location is a protocol-relative URL, another host.
fn redirect_to_slash(uri: &Uri) -> Response<Body> {
    let path = format!("/{}", uri.path().trim_start_matches('/'));
    let location = match uri.query() {
        Some(q) => format!("{path}/?{q}"),
        None => format!("{path}/"),
    };
    let body = if location.len() < 2048 { format!("moved to {location}\n") } else { "moved\n".to_owned() };
    Response::builder()
        .status(StatusCode::MOVED_PERMANENTLY)
        .header(header::LOCATION, location)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::full(body))
        .expect("a request path is a valid Location")
}

/// [`respond`] for a route that compresses: a cached file of a
/// compressible type goes out in the client's preferred coding (see
/// `variants`) once that form is ready, or as it is, with
/// `Vary: Accept-Encoding` either way (304s too) and marked settled, so the
/// route's compression layer leaves it alone.
async fn respond_compressed(
    entry: &Entry,
    file: Option<std::fs::File>,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Response<Body>, GatewayError> {
    let Some(identity) = entry
        .bytes
        .as_ref()
        .filter(|_| entry.len >= compression::MIN_SIZE && compression::is_compressible(&entry.content_type))
    else {
        // Never compressed (too small, or not a compressible type): as it
        // is, and left alone by the compression layer.
        let mut response = respond(entry, file, method, headers).await?;
        if entry.bytes.is_some()
            || entry.len < compression::MIN_SIZE
            || !compression::is_compressible(&entry.content_type)
        {
            response.extensions_mut().insert(compression::Settled);
        }
        return Ok(response);
    };
    // A HEAD gets the headers of the GET, coding included (RFC 9110 §9.3.2);
    // a range, or an `If-Match` naming the identity tag, the identity form.
    let as_is = headers.contains_key(header::RANGE) || conditional::if_match_names(headers, &entry.etag);
    let coding = ((method == Method::GET || method == Method::HEAD) && !as_is)
        .then(|| negotiate(headers.get(header::ACCEPT_ENCODING)))
        .flatten();
    let variant = match coding {
        Some(coding) => entry.variants.get(coding, identity, &entry.full_headers),
        None => None,
    };
    let mut response = match variant {
        Some(v) => match plan(&v.etag, entry.shown, v.bytes.len() as u64, method, headers) {
            Plan::PreconditionFailed => precondition_failed(),
            Plan::NotModified => Response::builder()
                .status(StatusCode::NOT_MODIFIED)
                .header(header::ETAG, v.etag.clone())
                .header(header::LAST_MODIFIED, entry.last_modified.clone())
                .header(header::VARY, "accept-encoding")
                .body(Body::empty())
                .expect("valid response"),
            _ => {
                let body = if method == Method::HEAD { Body::empty() } else { Body::full(v.bytes.clone()) };
                let mut response = Response::new(body);
                *response.headers_mut() = v.headers.clone();
                response
            }
        },
        None => {
            // Not ready (or not smaller): as it is, unless the client holds
            // the form already.
            // (Preconditions first, on the held form's tag: 412 if one fails.)
            let held = coding
                .map(|c| variants::etag(&entry.etag, c))
                .filter(|etag| none_match(headers, etag))
                .filter(|etag| !conditional::precondition_failed(etag, entry.shown, headers));
            let mut response = match held {
                Some(etag) => Response::builder()
                    .status(StatusCode::NOT_MODIFIED)
                    .header(header::ETAG, etag)
                    .header(header::LAST_MODIFIED, entry.last_modified.clone())
                    .body(Body::empty())
                    .expect("valid response"),
                None => respond(entry, file, method, headers).await?,
            };
            response.headers_mut().append(header::VARY, HeaderValue::from_static("accept-encoding"));
            response
        }
    };
    response.extensions_mut().insert(compression::Settled);
    Ok(response)
}

/// 412: a precondition (`If-Match`, `If-Unmodified-Since`) failed.
fn precondition_failed() -> Response<Body> {
    Response::builder()
        .status(StatusCode::PRECONDITION_FAILED)
        .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
        .body(Body::full("precondition failed\n"))
        .expect("valid response")
}

async fn respond(
    entry: &Entry,
    file: Option<std::fs::File>,
    method: &Method,
    headers: &HeaderMap,
) -> Result<Response<Body>, GatewayError> {
    let plan = plan(&entry.etag, entry.shown, entry.len, method, headers);
    // The common case: the whole of a cached file.
    if let (Plan::Full, Some(bytes)) = (&plan, &entry.bytes) {
        let body = if method == Method::HEAD { Body::empty() } else { Body::full(bytes.clone()) };
        let mut response = Response::new(body);
        *response.headers_mut() = entry.full_headers.clone();
        return Ok(response);
    }
    let mut builder = Response::builder()
        .header(header::ETAG, entry.etag.clone())
        .header(header::LAST_MODIFIED, entry.last_modified.clone());
    let (status, start, end) = match plan {
        Plan::PreconditionFailed => return Ok(precondition_failed()),
        Plan::NotModified => {
            return Ok(builder.status(StatusCode::NOT_MODIFIED).body(Body::empty()).expect("valid response"));
        }
        Plan::Unsatisfiable => {
            return Ok(builder
                .status(StatusCode::RANGE_NOT_SATISFIABLE)
                .header(header::CONTENT_RANGE, format!("bytes */{}", entry.len))
                .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
                .body(Body::full("range not satisfiable\n"))
                .expect("valid response"));
        }
        Plan::Full => (StatusCode::OK, 0, entry.len.saturating_sub(1)),
        Plan::Partial(s, e) => {
            builder = builder.header(header::CONTENT_RANGE, format!("bytes {s}-{e}/{}", entry.len));
            (StatusCode::PARTIAL_CONTENT, s, e)
        }
    };
    let length = if entry.len == 0 { 0 } else { end - start + 1 };
    builder = builder
        .status(status)
        .header(header::CONTENT_TYPE, entry.content_type.clone())
        .header(header::CONTENT_LENGTH, length)
        .header(header::ACCEPT_RANGES, "bytes");
    let body = if method == Method::HEAD || length == 0 {
        Body::empty()
    } else if let Some(bytes) = &entry.bytes {
        Body::full(bytes.slice(start as usize..=end as usize))
    } else {
        // Only a file too large to keep is streamed, and it comes opened.
        let file = file.ok_or_else(|| GatewayError::Io(std::io::Error::other("streamed file not opened")))?;
        let mut file = tokio::fs::File::from_std(file);
        file.seek(SeekFrom::Start(start)).await?;
        Body::File(Box::new(FileBody::new(file, length, STREAM_CHUNK)))
    };
    Ok(builder.body(body).expect("valid response"))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Just past a second's turn the coarse clock, which the `Date` comes
    /// from, still shows the last second for up to a tick: a file modified
    /// then shows no later `Last-Modified` than the `Date` written then.
    #[test]
    fn last_modified_is_never_after_the_date() {
        let secs = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        let give_up = Instant::now() + Duration::from_secs(3);
        let mut caught = 0;
        while caught < 20 && Instant::now() < give_up {
            let modified = SystemTime::now();
            if secs(modified) == crate::clock::coarse_seconds() {
                continue;
            }
            caught += 1;
            let shown = shown_time(modified);
            assert!(secs(shown) <= crate::clock::coarse_seconds(), "{modified:?} shown as {shown:?}");
        }
        assert!(caught > 0, "no second's turn caught in 3 s");
    }
}
