//! A response body's bytes as frames (RFC 9112 §6 and §7.1): a known
//! length, chunks (with trailers, as an `http_body` trailers frame), or
//! everything until the upstream closes. Pure: it decodes what has been
//! read into a buffer and says when it needs more.

use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};
use http_body::Frame;

use super::Error;
use super::head::{Framing, MAX_HEADERS};

/// The longest chunk-size line (size, extensions, CRLF) accepted.
pub const MAX_CHUNK_LINE: usize = 4096;
/// Chunk extensions over the whole body, as hyper allows.
pub const MAX_EXTENSIONS: u64 = 16 * 1024;
/// The trailer section's bytes, as hyper allows.
pub const MAX_TRAILERS: usize = 16 * 1024;

/// Where a body's decoding stands.
#[derive(Debug)]
pub enum Decoder {
    /// This many bytes are still to come.
    Length(u64),
    Chunked(Chunk, u64),
    /// Until the upstream closes.
    Close,
    /// The body has ended.
    Done,
}

/// Within a chunked body (the `u64` beside it in [`Decoder::Chunked`]
/// counts the extension bytes seen).
#[derive(Debug, Clone, Copy)]
pub enum Chunk {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of chunk data are still to come.
    Data(u64),
    /// The CRLF after a chunk's data is next.
    DataEnd,
    /// The trailer section (perhaps empty) after the last chunk is next.
    Trailers,
}

/// What one step of decoding found.
#[derive(Debug)]
pub enum Step {
    Frame(Frame<Bytes>),
    /// More bytes must be read first.
    More,
    /// The body has ended (after its last frame).
    End,
}

impl Decoder {
    pub fn new(framing: Framing) -> Decoder {
        match framing {
            Framing::Empty => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::Chunked(Chunk::Size, 0),
            Framing::Close => Decoder::Close,
        }
    }

    pub fn is_done(&self) -> bool {
        matches!(self, Decoder::Done)
    }

    /// Checks, before any of the body is decoded, that `buf` (the bytes
    /// read past the head) can begin it: a chunked body's first chunk-size
    /// line, whole or as far as it has come, must be one. Returns whether
    /// the body's first byte, or all of its first size line, is still to
    /// come. Takes nothing off `buf`.
    pub fn check_start(&self, buf: &[u8]) -> Result<bool, Error> {
        match self {
            Decoder::Length(_) => Ok(buf.is_empty()),
            Decoder::Chunked(Chunk::Size, _) => match line(buf, MAX_CHUNK_LINE)? {
                Some(end) => size_line(&buf[..end - 2]).map(|_| false),
                None => partial_size_line(buf).map(|()| true),
            },
            _ => Ok(false),
        }
    }

    /// Decodes the next frame from `buf`, taking its bytes off.
    pub fn step(&mut self, buf: &mut BytesMut) -> Result<Step, Error> {
        match self {
            Decoder::Done => Ok(Step::End),
            Decoder::Length(left) => {
                if buf.is_empty() {
                    return Ok(Step::More);
                }
                let data = take(buf, left);
                if *left == 0 {
                    *self = Decoder::Done;
                }
                Ok(Step::Frame(Frame::data(data)))
            }
            Decoder::Close if buf.is_empty() => Ok(Step::More),
            Decoder::Close => Ok(Step::Frame(Frame::data(buf.split().freeze()))),
            Decoder::Chunked(chunk, extensions) => {
                let step = chunked(chunk, extensions, buf)?;
                if matches!(step, Step::End) || matches!(&step, Step::Frame(f) if f.is_trailers()) {
                    *self = Decoder::Done;
                }
                Ok(step)
            }
        }
    }

    /// The upstream closed the connection: the end of a close-delimited
    /// body, an error for any other that has not ended.
    pub fn eof(&mut self) -> Result<Step, Error> {
        match self {
            Decoder::Done => Ok(Step::End),
            Decoder::Close => {
                *self = Decoder::Done;
                Ok(Step::End)
            }
            _ => Err(Error::incomplete_body()),
        }
    }
}

/// Up to `left` bytes off the front of `buf` (which is not empty).
fn take(buf: &mut BytesMut, left: &mut u64) -> Bytes {
    let n = usize::try_from(*left).unwrap_or(usize::MAX).min(buf.len());
    *left -= n as u64;
    buf.split_to(n).freeze()
}

/// One step within a chunked body.
fn chunked(chunk: &mut Chunk, extensions: &mut u64, buf: &mut BytesMut) -> Result<Step, Error> {
    loop {
        match *chunk {
            Chunk::Size => {
                let Some(line) = line(buf, MAX_CHUNK_LINE)? else {
                    partial_size_line(buf)?;
                    return Ok(Step::More);
                };
                let (size, ext) = size_line(&buf[..line - 2])?;
                *extensions += ext;
                if *extensions >= MAX_EXTENSIONS {
                    return Err(Error::body_parse("chunk extensions over limit"));
                }
                let _ = buf.split_to(line);
                *chunk = if size == 0 { Chunk::Trailers } else { Chunk::Data(size) };
            }
            Chunk::Data(mut left) => {
                if buf.is_empty() {
                    return Ok(Step::More);
                }
                let data = take(buf, &mut left);
                *chunk = if left == 0 { Chunk::DataEnd } else { Chunk::Data(left) };
                return Ok(Step::Frame(Frame::data(data)));
            }
            Chunk::DataEnd => {
                if buf.len() < 2 {
                    // A wrong first byte is wrong already.
                    if buf.first().is_some_and(|&b| b != b'\r') {
                        return Err(Error::body_parse("invalid chunk data end"));
                    }
                    return Ok(Step::More);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(Error::body_parse("invalid chunk data end"));
                }
                let _ = buf.split_to(2);
                *chunk = Chunk::Size;
            }
            Chunk::Trailers => return trailers(buf),
        }
    }
}

/// The length of the CRLF-ended line at the start of `buf` (CRLF
/// included), if it is all there; a CR anywhere but before the LF, or a
/// line longer than `max`, is an error.
fn line(buf: &[u8], max: usize) -> Result<Option<usize>, Error> {
    let window = &buf[..buf.len().min(max)];
    match window.iter().position(|&b| b == b'\r' || b == b'\n') {
        Some(i) if window[i] == b'\n' => Err(Error::body_parse("chunk line without CR")),
        Some(i) if i + 1 == buf.len() => Ok(None),
        Some(i) if buf[i + 1] == b'\n' => Ok(Some(i + 2)),
        Some(_) => Err(Error::body_parse("chunk line: CR without LF")),
        None if buf.len() >= max => Err(Error::body_parse("chunk-size line too long")),
        None => Ok(None),
    }
}

/// What is in already of a chunk-size line that has not ended must be a
/// size line's start: a wrong byte is refused now, not once the line ends.
fn partial_size_line(buf: &[u8]) -> Result<(), Error> {
    let partial = &buf[..buf.len().min(MAX_CHUNK_LINE)];
    let partial = partial.strip_suffix(b"\r").unwrap_or(partial);
    if !partial.is_empty() {
        size_line(partial)?;
    }
    Ok(())
}

/// A chunk-size line without its CRLF: hex digits, then optional spaces
/// or tabs, then optional extensions after `;` (ignored, counted). Returns
/// the size and the extension bytes.
fn size_line(line: &[u8]) -> Result<(u64, u64), Error> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(Error::body_parse("invalid chunk size: missing size digit"));
    }
    let mut size = 0u64;
    for &b in &line[..digits] {
        let d = u64::from((b as char).to_digit(16).expect("a hex digit"));
        size = size.checked_mul(16).and_then(|s| s.checked_add(d)).ok_or(Error::body_parse("chunk size overflow"))?;
    }
    let rest = &line[digits..];
    let ws = rest.iter().take_while(|&&b| b == b' ' || b == b'\t').count();
    match rest.get(ws) {
        None => Ok((size, 0)),
        // hyper counts each extension byte after the `;`.
        Some(b';') => Ok((size, (rest.len() - ws - 1) as u64)),
        Some(_) => Err(Error::body_parse("invalid chunk size")),
    }
}

/// The trailer section after the last chunk: its end (an empty line), and
/// its fields as a trailers frame when there are any.
fn trailers(buf: &mut BytesMut) -> Result<Step, Error> {
    if buf.starts_with(b"\r\n") {
        let _ = buf.split_to(2);
        return Ok(Step::End);
    }
    if buf.first().is_some_and(|&b| b == b'\r') && buf.len() >= 2 {
        return Err(Error::body_parse("invalid chunked body end"));
    }
    let window = &buf[..buf.len().min(MAX_TRAILERS + 4)];
    // Every CR must start a CRLF; the section ends at the first empty line.
    let mut lines = 0usize;
    let mut i = 0;
    let end = loop {
        let Some(cr) = window[i..].iter().position(|&b| b == b'\r') else {
            if window.len() > MAX_TRAILERS {
                return Err(Error::body_parse("chunk trailers over limit"));
            }
            return Ok(Step::More);
        };
        let at = i + cr;
        match window.get(at + 1) {
            None => return Ok(Step::More),
            Some(b'\n') => {}
            Some(_) => return Err(Error::body_parse("invalid trailer end")),
        }
        lines += 1;
        if lines > MAX_HEADERS {
            return Err(Error::body_parse("chunk trailers count overflow"));
        }
        match window.get(at + 2) {
            None => return Ok(Step::More),
            Some(b'\r') if window.get(at + 3) == Some(&b'\n') => break at + 4,
            Some(b'\r') if window.len() > at + 3 => return Err(Error::body_parse("invalid chunked body end")),
            Some(b'\r') => return Ok(Step::More),
            Some(_) => i = at + 2,
        }
    };
    if end > MAX_TRAILERS {
        return Err(Error::body_parse("chunk trailers over limit"));
    }
    let section = buf.split_to(end);
    let mut storage = vec![httparse::EMPTY_HEADER; lines];
    let fields = match httparse::parse_headers(&section, &mut storage) {
        Ok(httparse::Status::Complete((_, fields))) => fields,
        Ok(httparse::Status::Partial) => return Err(Error::body_parse("partial trailers")),
        Err(e) => return Err(Error::body_parse(super::head::why(e))),
    };
    let mut map = HeaderMap::with_capacity(fields.len());
    for f in fields.iter() {
        let name = HeaderName::from_bytes(f.name.as_bytes()).map_err(|_| Error::body_parse("invalid trailer name"))?;
        let value = HeaderValue::from_bytes(f.value).map_err(|_| Error::body_parse("invalid trailer value"))?;
        map.append(name, value);
    }
    Ok(Step::Frame(Frame::trailers(map)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The data, the trailers and what is left over.
    type Decoded = (Vec<u8>, Option<HeaderMap>, Vec<u8>);

    /// Decodes `wire` fed in pieces of `piece` bytes, or the error's text.
    fn decode(framing: Framing, wire: &[u8], piece: usize) -> Result<Decoded, String> {
        let mut d = Decoder::new(framing);
        let (mut buf, mut data, mut trailers) = (BytesMut::new(), Vec::new(), None);
        let mut chunks = wire.chunks(piece.max(1));
        loop {
            match d.step(&mut buf).map_err(|e| e.to_string())? {
                Step::Frame(f) => match f.into_data() {
                    Ok(d) => data.extend_from_slice(&d),
                    Err(f) => trailers = f.into_trailers().ok(),
                },
                Step::End => return Ok((data, trailers, buf.to_vec())),
                Step::More => match chunks.next() {
                    Some(c) => buf.extend_from_slice(c),
                    None => match d.eof().map_err(|e| e.to_string())? {
                        Step::End => return Ok((data, trailers, buf.to_vec())),
                        _ => unreachable!(),
                    },
                },
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_in_any_pieces() {
        let ok: &[(&[u8], &[u8], &[u8])] = &[
            (b"5\r\nhello\r\n0\r\n\r\n", b"hello", b""),
            (b"5;a=b\r\nhello\r\n6 \t;x\r\n world\r\n0\r\n\r\nNEXT", b"hello world", b"NEXT"),
            (b"000A\r\n0123456789\r\n0\r\n\r\n", b"0123456789", b""),
        ];
        for (wire, want, rest) in ok {
            for piece in [1, 2, 3, 7, 1000] {
                let (data, trailers, left) = decode(Framing::Chunked, wire, piece).unwrap();
                assert_eq!((&data[..], trailers), (*want, None), "{wire:?} by {piece}");
                if piece == 1000 {
                    assert_eq!(&left[..], *rest);
                }
            }
        }
        let wire = b"3\r\nabc\r\n0\r\nx-sum: 1\r\nx-two: 2\r\n\r\n";
        for piece in [1, 5, 100] {
            let (data, trailers, _) = decode(Framing::Chunked, wire, piece).unwrap();
            let trailers = trailers.expect("trailers");
            assert_eq!(
                (&data[..], trailers["x-sum"].as_bytes(), trailers["x-two"].as_bytes()),
                (&b"abc"[..], &b"1"[..], &b"2"[..])
            );
        }
    }

    #[test]
    fn bad_chunks_are_refused() {
        let long_ext = format!("1;{}\r\na\r\n0\r\n\r\n", "e".repeat(MAX_CHUNK_LINE));
        let many_ext: String = (0..5).map(|_| format!("1;{}\r\na\r\n", "e".repeat(4000))).collect();
        let big_trailers = format!("0\r\nx: {}\r\n\r\n", "a".repeat(MAX_TRAILERS));
        let cases: Vec<&[u8]> = vec![
            b"x\r\nhello\r\n0\r\n\r\n",
            b"0x5\r\nhello\r\n0\r\n\r\n",
            b"5\nhello\r\n0\r\n\r\n",
            b"5\r\nhelloXX0\r\n\r\n",
            b"5 5\r\nhello\r\n0\r\n\r\n",
            b"-5\r\nhello\r\n0\r\n\r\n",
            b"10000000000000000\r\n",
            b"5\rx\nhello\r\n0\r\n\r\n",
            b"5\r\nhello\r\n0\r\nx: a\r\n b\r\n\r\n",
            b"5\r\nhello\r\n0\r\nx: a\0\r\n\r\n",
            b"5\r\nhello\r\n0\r\n\rx",
            b"5\r\nhel",
            b"5\r\nhello\r\n",
            long_ext.as_bytes(),
            many_ext.as_bytes(),
            big_trailers.as_bytes(),
        ];
        for wire in cases {
            assert!(decode(Framing::Chunked, wire, 3).is_err(), "{:?}", String::from_utf8_lossy(wire));
        }
    }

    /// A body's start is checked as its decoding would find it, without
    /// taking anything off: (framing, bytes past the head, still to come
    /// or `None` for refused).
    #[test]
    fn a_body_start_is_checked_without_decoding_it() {
        let cases: &[(Framing, &[u8], Option<bool>)] = &[
            (Framing::Length(5), b"", Some(true)),
            (Framing::Length(5), b"he", Some(false)),
            (Framing::Chunked, b"", Some(true)),
            (Framing::Chunked, b"5", Some(true)),
            (Framing::Chunked, b"5;a=b\r", Some(true)),
            (Framing::Chunked, b"5\r\nhel", Some(false)),
            (Framing::Chunked, b"0\r\n\r\n", Some(false)),
            (Framing::Chunked, b"zz\r\nhello", None),
            (Framing::Chunked, b"z", None),
            (Framing::Chunked, b"-5\r\n", None),
            (Framing::Chunked, b"5\nhello", None),
            (Framing::Chunked, b"5 5\r\nhello", None),
            (Framing::Chunked, b"5\rx", None),
            (Framing::Chunked, &[b'e'; MAX_CHUNK_LINE], None),
            (Framing::Close, b"", Some(false)),
            (Framing::Empty, b"", Some(false)),
        ];
        for (framing, buf, want) in cases {
            let d = Decoder::new(*framing);
            assert_eq!(d.check_start(buf).ok(), *want, "{framing:?} {:?}", String::from_utf8_lossy(buf));
            // The decoding that follows finds the same.
            if want.is_none() {
                assert!(decode(*framing, buf, 1000).is_err(), "{:?}", String::from_utf8_lossy(buf));
            }
        }
    }

    #[test]
    fn lengths_and_closes() {
        assert_eq!(decode(Framing::Length(3), b"abcdef", 2).unwrap().0, b"abc");
        assert_eq!(decode(Framing::Length(3), b"abcdef", 100).unwrap().2, b"def");
        assert!(decode(Framing::Length(7), b"abcdef", 2).is_err());
        assert_eq!(decode(Framing::Close, b"abcdef", 2).unwrap().0, b"abcdef");
        assert_eq!(decode(Framing::Empty, b"abc", 2).unwrap(), (vec![], None, vec![]));
    }
}
