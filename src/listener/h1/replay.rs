//! The connection's reading side without a socket, for the fuzz target
//! (`fuzz/`) and the split tests: request heads and bodies decoded from
//! bytes that arrive in the given pieces, one line per decision. Pure.

use bytes::BytesMut;

use super::head::{self, Framing};
use crate::upstream::h1::Framing as DecodeFraming;
use crate::upstream::h1::decode::{Decoder, Step};

/// What the connection would decide on bytes arriving as `pieces`, with
/// heads of at most `max` bytes: each request's method, target, version,
/// framing and body (with its trailers), until a refusal (its status), a
/// body error, or the bytes run out (what is left unparsed).
pub fn replay(pieces: &[&[u8]], max: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut rx = BytesMut::new();
    let mut pieces = pieces.iter();
    let mut more = |rx: &mut BytesMut| pieces.next().map(|p| rx.extend_from_slice(p)).is_some();
    loop {
        let head = match head::parse(&mut rx, max) {
            Ok(Some(head)) => head,
            Ok(None) if more(&mut rx) => continue,
            Ok(None) => {
                out.push(format!("end with {} bytes of a head", rx.len()));
                return out;
            }
            Err(refused) => {
                out.push(format!("refused {}", refused.status.as_u16()));
                return out;
            }
        };
        let p = &head.parts;
        out.push(format!(
            "{} {} {:?} {:?} keep-alive={}",
            p.method, p.uri, p.version, head.meta.framing, head.meta.keep_alive
        ));
        let mut decoder = match head.meta.framing {
            Framing::Empty => Decoder::Done,
            Framing::Length(n) => Decoder::new(DecodeFraming::Length(n)),
            Framing::Chunked => Decoder::new(DecodeFraming::Chunked),
        };
        let mut body = Vec::new();
        loop {
            match decoder.step(&mut rx) {
                Ok(Step::Frame(f)) => match f.into_data() {
                    Ok(data) => body.extend_from_slice(&data),
                    Err(f) => out.push(format!("trailers {:?}", f.into_trailers().ok())),
                },
                Ok(Step::End) => break,
                Ok(Step::More) if more(&mut rx) => {}
                Ok(Step::More) => {
                    out.push(format!("body cut after {} bytes", body.len()));
                    return out;
                }
                Err(e) => {
                    out.push(format!("body refused after {} bytes: {e}", body.len()));
                    return out;
                }
            }
        }
        out.push(format!("body {:?}", String::from_utf8_lossy(&body)));
        if !head.meta.keep_alive {
            return out;
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Streams the split property is tried on: valid, pipelined, smuggling
    /// attempts, malformed.
    const STREAMS: &[&[u8]] = &[
        b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /c HTTP/1.0\r\n\r\n",
        b"POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3;x\r\nabc\r\n0\r\nx-t: 1\r\n\r\nGET /n HTTP/1.1\r\n\r\n",
        b"POST /s HTTP/1.1\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n\r\n",
        b"POST /s HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFF\r\nabc",
        b"GET /f HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
        b"GET /lf HTTP/1.1\nHost: x\n\nGET /two HTTP/1.1\n\n",
    ];

    /// Whatever the pieces, the decisions are those on the whole stream.
    #[test]
    fn pieces_decide_as_the_whole() {
        for stream in STREAMS {
            let whole = replay(&[stream], 8192);
            let bytes: Vec<&[u8]> = stream.chunks(1).collect();
            assert_eq!(replay(&bytes, 8192), whole, "{:?} by the byte", String::from_utf8_lossy(stream));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn random_pieces_decide_as_the_whole(which in 0..STREAMS.len(), cuts in prop::collection::vec(0usize..200, 0..8)) {
            let stream = STREAMS[which];
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % stream.len()).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut pieces = Vec::new();
            let mut from = 0;
            for cut in cuts.into_iter().chain([stream.len()]) {
                pieces.push(&stream[from..cut]);
                from = cut;
            }
            prop_assert_eq!(replay(&pieces, 8192), replay(&[stream], 8192));
        }

        /// Any bytes at all: no panic, and bounded output.
        #[test]
        fn any_bytes_are_decided(bytes in prop::collection::vec(any::<u8>(), 0..600), cut in 0usize..600) {
            let cut = cut.min(bytes.len());
            let decided = replay(&[&bytes[..cut], &bytes[cut..]], 512);
            prop_assert!(decided.len() <= 2 * bytes.len() + 2);
        }
    }
}
