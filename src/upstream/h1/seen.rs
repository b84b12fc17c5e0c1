//! What a response head's fields say of its framing, noted once as the
//! head is parsed: `Content-Length` (every value and item agreed on, RFC
//! 9110 §8.6), `Transfer-Encoding` and `Connection`. Looking each up in
//! the parsed map again cost every response a hash.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::Error;

/// The `Content-Length`, if there is one: every value (and every item of a
/// list) the same decimal number (RFC 9110 §8.6), else an error.
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, Error> {
    Length::of(headers).checked()
}

/// The number every `Content-Length` value and item gives, whatever its
/// size (a bodiless response's may be any: it frames nothing).
pub(super) fn agreed_length(headers: &HeaderMap) -> Result<Option<u64>, Error> {
    Length::of(headers).agreed()
}

/// What a response head's fields say of its framing, noted as they are
/// parsed.
#[derive(Default)]
pub(super) struct Seen {
    pub transfer_encoding: bool,
    pub connection: bool,
    /// `Content-Length` lines, and whether one lists items.
    pub lengths: u32,
    pub listed: bool,
    pub length: Length,
}

impl Seen {
    pub fn note(&mut self, name: &HeaderName, value: &HeaderValue) {
        if *name == header::CONTENT_LENGTH {
            self.lengths += 1;
            self.listed |= value.as_bytes().contains(&b',');
            self.length.add(value.as_bytes());
        } else if *name == header::TRANSFER_ENCODING {
            self.transfer_encoding = true;
        } else if *name == header::CONNECTION {
            self.connection = true;
        }
    }
}

/// The `Content-Length` values seen so far, and the verdict on them:
/// kept, not returned at once, since a `Transfer-Encoding` overrides even
/// an invalid one.
pub(super) struct Length(Result<Option<u64>, &'static str>);

impl Default for Length {
    fn default() -> Self {
        Length(Ok(None))
    }
}

impl Length {
    fn of(headers: &HeaderMap) -> Length {
        let mut length = Length::default();
        for value in headers.get_all(header::CONTENT_LENGTH) {
            length.add(value.as_bytes());
        }
        length
    }

    fn add(&mut self, value: &[u8]) {
        for item in value.split(|&b| b == b',') {
            let Ok(length) = self.0 else { return };
            self.0 = match crate::headers::digits(item.trim_ascii()) {
                None => Err("invalid Content-Length"),
                Some(n) if length.is_some_and(|l| l != n) => Err("conflicting Content-Length values"),
                Some(n) => Ok(Some(n)),
            };
        }
    }

    /// The number every value and item gives, whatever its size.
    pub fn agreed(&self) -> Result<Option<u64>, Error> {
        self.0.map_err(Error::parse)
    }

    /// The number, if it is one hyper's decoder can count to: it keeps the
    /// two largest values for its own states.
    pub fn checked(&self) -> Result<Option<u64>, Error> {
        match self.agreed()? {
            Some(n) if n > u64::MAX - 2 => Err(Error::parse("Content-Length too large")),
            length => Ok(length),
        }
    }
}
