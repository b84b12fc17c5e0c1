//! Compressed forms of cached files, for routes with `compress = true`.
//!
//! A cached file (up to `CACHE_FILE_MAX`) of a compressible type is
//! compressed once per coding the clients ask for, on the blocking pool,
//! and kept with its entry; a change on disk makes a new entry, and so new
//! forms. Each form has a strong `ETag` of its own (the identity tag with
//! `-gzip`, `-br` or `-zstd` appended), which conditional requests match.
//! Range requests are answered from the identity form. (Large files that
//! are not cached go through the route's compression layer instead.)

use std::io::Write;
use std::sync::Arc;

use bytes::Bytes;
use http::HeaderMap;
use http::header::{self, HeaderValue};

use crate::layers::compress::Coding;

/// One compressed form of a file.
pub struct Variant {
    pub bytes: Bytes,
    pub etag: HeaderValue,
    /// The headers of a full 200 response with this form.
    pub headers: HeaderMap,
}

/// The forms made so far, one place per coding; `None` inside means the
/// coding did not make the file smaller.
#[derive(Default)]
pub struct Variants([tokio::sync::OnceCell<Option<Arc<Variant>>>; 3]);

impl Variants {
    /// The file in `coding`, made on first use.
    pub async fn get(&self, coding: Coding, identity: &Bytes, base: &HeaderMap) -> Option<Arc<Variant>> {
        let slot = &self.0[Coding::ALL.iter().position(|c| *c == coding).expect("a known coding")];
        let make = || async {
            let identity = identity.clone();
            let compressed = tokio::task::spawn_blocking(move || compress(coding, &identity)).await.ok()??;
            Some(Arc::new(variant(coding, compressed, base)))
        };
        slot.get_or_init(make).await.clone()
    }
}

fn variant(coding: Coding, bytes: Bytes, base: &HeaderMap) -> Variant {
    let identity_etag = base.get(header::ETAG).expect("cached entries have an ETag").as_bytes();
    let mut etag = identity_etag[..identity_etag.len() - 1].to_vec();
    etag.extend_from_slice(format!("-{}\"", coding.token()).as_bytes());
    let etag = HeaderValue::from_bytes(&etag).expect("an ETag with a coding appended is valid");
    let mut headers = base.clone();
    headers.remove(header::ACCEPT_RANGES);
    headers.insert(header::ETAG, etag.clone());
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(coding.token()));
    headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    Variant { bytes, etag, headers }
}

/// `data` in `coding` at a high level (it is done once per file version),
/// or `None` when that is not smaller.
fn compress(coding: Coding, data: &[u8]) -> Option<Bytes> {
    let out = match coding {
        Coding::Gzip => {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
            e.write_all(data).ok()?;
            e.finish().ok()?
        }
        Coding::Br => {
            let mut out = Vec::new();
            let params = brotli::enc::BrotliEncoderParams { quality: 11, ..Default::default() };
            brotli::BrotliCompress(&mut &data[..], &mut out, &params).ok()?;
            out
        }
        Coding::Zstd => zstd::bulk::compress(data, 19).ok()?,
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
