//! The fields this hop adds to a request on its way upstream that the
//! request did not carry: `X-Forwarded-For`, `-Proto` and `-Host`, `Via`,
//! `X-Request-Id` and `traceparent`, when the client sent none of its own.
//!
//! They are kept beside the request rather than inserted into its header
//! map: an insert hashes the name byte by byte and probes the map, six
//! times a request (see benches/README.md, Decisions). The own HTTP/1.1
//! client writes them straight after the map's fields ([`Stamp::write`]).
//! Where the request goes another way (to an HTTP/2 upstream),
//! [`Stamp::insert_into`] puts them into its map first, and a request
//! handed back unsent has them taken out again ([`Stamp::remove_from`]), so
//! that a request outside a send never holds them twice.
//!
//! A field the request carried already stays a map operation (appending to
//! its list, or replacing it), as before: only an absent one is stamped, so
//! writing it after the others is what an insert would have done.

use bytes::{BufMut, BytesMut};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use super::{TRACEPARENT, X_FORWARDED_FOR, X_FORWARDED_HOST, X_FORWARDED_PROTO, X_REQUEST_ID};

/// A field a request may be stamped with (but `traceparent`, whose value is
/// kept as its bytes): each has its slot, and they are written in this
/// order, the order the gateway adds them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    ForwardedFor,
    ForwardedProto,
    ForwardedHost,
    Via,
    RequestId,
}

/// The fields' names, in [`Field`]'s order, then `traceparent`'s.
static NAMES: [HeaderName; 6] =
    [X_FORWARDED_FOR, X_FORWARDED_PROTO, X_FORWARDED_HOST, header::VIA, X_REQUEST_ID, TRACEPARENT];

/// A `traceparent` value (version 00): always 55 bytes.
pub type Traceparent = [u8; 55];

/// The fields a request is stamped with (see the module's comment).
#[derive(Default)]
pub struct Stamp {
    values: [Option<HeaderValue>; 5],
    traceparent: Option<Traceparent>,
    /// Which of the fields set after [`super::add_forwarding`] the request
    /// carried (noted by it).
    pub carried: Carried,
}

/// Whether a request carried an `X-Request-Id` and a `traceparent`.
#[derive(Debug, Default, Clone, Copy)]
pub struct Carried {
    pub request_id: bool,
    pub traceparent: bool,
}

impl std::fmt::Debug for Stamp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl Stamp {
    /// Stamps `field` with `value`: a field the request does not carry.
    pub fn add(&mut self, field: Field, value: HeaderValue) {
        self.values[field as usize] = Some(value);
    }

    /// Stamps this hop's `traceparent`, which the request does not carry
    /// (or carried and had removed).
    pub fn add_traceparent(&mut self, value: Traceparent) {
        self.traceparent = Some(value);
    }

    /// The fields stamped, in [`Field`]'s order, `traceparent` last.
    pub fn iter(&self) -> impl Iterator<Item = (&HeaderName, &[u8])> {
        let fields = self.values.iter().zip(&NAMES).filter_map(|(v, n)| Some((n, v.as_ref()?.as_bytes())));
        fields.chain(self.traceparent.as_ref().map(|v| (&NAMES[5], &v[..])))
    }

    /// The bytes [`Stamp::write`] writes.
    pub fn encoded_len(&self) -> usize {
        self.iter().map(|(n, v)| n.as_str().len() + v.len() + 4).sum()
    }

    /// Writes the fields as HTTP/1.1 header lines.
    pub fn write(&self, out: &mut BytesMut) {
        for (name, value) in self.iter() {
            out.put_slice(name.as_str().as_bytes());
            out.put_slice(b": ");
            out.put_slice(value);
            out.put_slice(b"\r\n");
        }
    }

    /// Puts the fields into `headers`, for a request that is sent another
    /// way than by the own HTTP/1.1 client.
    pub fn insert_into(&self, headers: &mut HeaderMap) {
        for (value, name) in self.values.iter().zip(&NAMES) {
            if let Some(value) = value {
                headers.insert(name.clone(), value.clone());
            }
        }
        if let Some(traceparent) = &self.traceparent {
            let value = HeaderValue::from_bytes(traceparent).expect("hex digits and dashes are a valid header value");
            headers.insert(TRACEPARENT, value);
        }
    }

    /// Takes the fields out of `headers` again (a request handed back
    /// unsent, or parsed back from the bytes it was encoded into). The
    /// request carried none of them before it was stamped, so what is left
    /// is the request as it was.
    pub fn remove_from(&self, headers: &mut HeaderMap) {
        for (name, _) in self.iter() {
            headers.remove(name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Stamp {
        let mut s = Stamp::default();
        // Added out of order: written in `Field`'s.
        s.add(Field::RequestId, HeaderValue::from_static("r-1"));
        s.add(Field::ForwardedFor, HeaderValue::from_static("10.0.0.1"));
        s.add(Field::Via, HeaderValue::from_static("1.1 gateway"));
        s.add_traceparent(*b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        s
    }

    #[test]
    fn written_as_header_lines_in_the_fields_order() {
        let s = full();
        let mut out = BytesMut::new();
        s.write(&mut out);
        let want = "x-forwarded-for: 10.0.0.1\r\nvia: 1.1 gateway\r\nx-request-id: r-1\r\n\
                    traceparent: 00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\r\n";
        assert_eq!(std::str::from_utf8(&out).unwrap(), want);
        assert_eq!(s.encoded_len(), want.len());
        let mut none = BytesMut::new();
        Stamp::default().write(&mut none);
        assert!(none.is_empty());
        assert_eq!(Stamp::default().encoded_len(), 0);
    }

    /// Inserted, then removed, the map is what it was; its own fields are
    /// untouched.
    #[test]
    fn inserted_then_removed_leaves_the_map_as_it_was() {
        let s = full();
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        let before = h.clone();
        s.insert_into(&mut h);
        assert_eq!(h.len(), 5);
        assert_eq!(h[X_FORWARDED_FOR], "10.0.0.1");
        assert_eq!(h[TRACEPARENT], "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
        // Twice is once: an insert replaces.
        s.insert_into(&mut h);
        assert_eq!(h.len(), 5);
        s.remove_from(&mut h);
        assert_eq!(h, before);
    }
}
