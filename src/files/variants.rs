//! Compressed forms of cached files, for routes with `compress = true`.
//!
//! A cached file (up to `CACHE_FILE_MAX`) of a compressible type is
//! compressed once per coding the clients ask for, on the blocking pool,
//! and kept with its entry; a change on disk makes a new entry, and so new
//! forms. Each form has a strong `ETag` of its own (the identity tag with
//! `-gzip`, `-br` or `-zstd` appended), which conditional requests match.
//! Range requests are answered from the identity form. (Large files that
//! are not cached go through the route's compression layer instead.)
//!
//! A form is made in the background, not by the request that asked for
//! it, from the second request that asks for it on: the file goes out as
//! it is until its form is ready (a client holding the form gets its 304
//! meanwhile), a client that
//! leaves cannot make the work start over, and at most
//! [`MAKING_AT_ONCE`] forms are being made at a time across the process
//! (a request that finds them all busy is answered as it is, and a later
//! one starts the work), so a burst of requests for many files cannot take
//! the CPU from the proxy.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};

use bytes::Bytes;
use http::HeaderMap;
use http::header::{self, HeaderValue};
use tokio::sync::Semaphore;

use crate::layers::compress::Coding;
use crate::metrics::FILE_COMPRESSIONS;

/// Forms being made at once, process-wide.
pub const MAKING_AT_ONCE: usize = 1;

static MAKING: LazyLock<Arc<Semaphore>> = LazyLock::new(|| Arc::new(Semaphore::new(MAKING_AT_ONCE)));

/// One compressed form of a file.
pub struct Variant {
    pub bytes: Bytes,
    pub etag: HeaderValue,
    /// The headers of a full 200 response with this form.
    pub headers: HeaderMap,
}

/// The forms made so far, one place per coding.
#[derive(Default)]
pub struct Variants([Slot; 3]);

#[derive(Default)]
struct Slot {
    /// `None` inside: the coding did not make the file smaller.
    made: Arc<OnceLock<Option<Arc<Variant>>>>,
    /// Asked for once already. The form is started on the second request
    /// for it: a file asked for once while it is cached (a crawl, or a set
    /// of files larger than the cache, which then churns) costs no
    /// compression that would never be served.
    asked: AtomicBool,
    started: AtomicBool,
}

impl Variants {
    /// The file in `coding` if that form is ready; else `None`, and the
    /// form is started in the background if it is not being made yet.
    pub fn get(&self, coding: Coding, identity: &Bytes, base: &HeaderMap) -> Option<Arc<Variant>> {
        let slot = &self.0[Coding::ALL.iter().position(|c| *c == coding).expect("a known coding")];
        if let Some(made) = slot.made.get() {
            return made.clone();
        }
        if !slot.asked.swap(true, Ordering::AcqRel) || slot.started.swap(true, Ordering::AcqRel) {
            return None;
        }
        let Ok(permit) = MAKING.clone().try_acquire_owned() else {
            slot.started.store(false, Ordering::Release);
            return None;
        };
        let (made, identity, base) = (slot.made.clone(), identity.clone(), base.clone());
        tokio::task::spawn_blocking(move || {
            metrics::counter!(FILE_COMPRESSIONS, "coding" => coding.token()).increment(1);
            let form = compress(coding, &identity).map(|bytes| Arc::new(variant(coding, bytes, &base)));
            let _ = made.set(form);
            drop(permit);
        });
        None
    }
}

/// The `ETag` of the file's form in `coding`: its identity tag with the
/// coding appended (known before the form is made, so a client holding
/// that form can be answered 304 meanwhile).
pub fn etag(identity: &HeaderValue, coding: Coding) -> HeaderValue {
    let identity = identity.as_bytes();
    let mut etag = identity[..identity.len() - 1].to_vec();
    etag.extend_from_slice(format!("-{}\"", coding.token()).as_bytes());
    HeaderValue::from_bytes(&etag).expect("an ETag with a coding appended is valid")
}

fn variant(coding: Coding, bytes: Bytes, base: &HeaderMap) -> Variant {
    let etag = etag(base.get(header::ETAG).expect("cached entries have an ETag"), coding);
    let mut headers = base.clone();
    headers.remove(header::ACCEPT_RANGES);
    headers.insert(header::ETAG, etag.clone());
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(coding.token()));
    headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    Variant { bytes, etag, headers }
}

/// `data` in `coding`, or `None` when that is not smaller. The levels are
/// high but not the highest (done once per file version, but every file
/// shares the one permit): brotli 11 and zstd 19 take several times as
/// long for a few per cent.
fn compress(coding: Coding, data: &[u8]) -> Option<Bytes> {
    let out = match coding {
        Coding::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            e.write_all(data).ok()?;
            e.finish().ok()?
        }
        Coding::Br => {
            let mut out = Vec::new();
            let params = brotli::enc::BrotliEncoderParams { quality: 9, ..Default::default() };
            brotli::BrotliCompress(&mut &data[..], &mut out, &params).ok()?;
            out
        }
        Coding::Zstd => zstd::bulk::compress(data, 15).ok()?,
    };
    (out.len() < data.len()).then(|| Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_round_trip_and_say_what_they_are() {
        let text = "hello hello hello hello hello hello hello hello ".repeat(40);
        let mut base = HeaderMap::new();
        base.insert(header::ETAG, HeaderValue::from_static("\"abc-10\""));
        base.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
        for coding in Coding::ALL {
            let bytes = compress(coding, text.as_bytes()).expect("repetitive text compresses");
            let v = variant(coding, bytes, &base);
            assert_eq!(v.etag, format!("\"abc-10-{}\"", coding.token()).as_str());
            assert_eq!(v.headers[header::CONTENT_ENCODING], coding.token());
            assert!(v.headers.get(header::ACCEPT_RANGES).is_none());
        }
        assert!(compress(Coding::Gzip, b"x").is_none(), "not smaller: not kept");
    }
}
