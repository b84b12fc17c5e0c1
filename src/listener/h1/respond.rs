//! Writing a response: its head, then its body's frames in the framing
//! the head chose, gathered into few writes.

use std::task::Poll;

use bytes::{Bytes, BytesMut};
use http::Response;
use http_body::Body as _;

use super::encode::{self, Asked, BodyLength, Encoder};
use super::{Own, Stop};
use crate::listener::conn::ConnBody;

/// Response bytes gathered before a write: the head with a small body
/// goes in one.
const COALESCE: usize = 16 * 1024;

impl Own<'_> {
    /// Writes the response; returns whether it must be the connection's
    /// last.
    pub(super) async fn respond(
        &mut self,
        response: Response<ConnBody>,
        asked: Asked<'_>,
        trailers_ok: bool,
    ) -> Result<bool, Stop> {
        let (mut parts, mut body) = response.into_parts();
        let length = match body.size_hint().exact() {
            _ if body.is_end_stream() => BodyLength::None,
            Some(n) => BodyLength::Known(n),
            None => BodyLength::Unknown,
        };
        // The head and a body small enough to be copied beside it (see
        // `put`) in one allocation.
        let body_room = match length {
            BodyLength::Known(n) if n < (COALESCE / 2) as u64 => n as usize,
            _ => 0,
        };
        let mut out = BytesMut::with_capacity(encode::capacity(&parts.headers) + body_room);
        let (mut encoder, last) = encode::head(&mut parts, length, asked, &mut out);
        // Its fields are encoded: the map goes to the next head parsed.
        crate::headers::spare::give_back(std::mem::take(&mut parts.headers));
        drop(parts);
        if let (Encoder::Chunked(allowed), false) = (&mut encoder, trailers_ok) {
            allowed.clear();
        }
        let ended = match encoder {
            Encoder::Length(0) => true,
            encoder => self.stream(&mut body, encoder, &mut out).await?,
        };
        self.write(out.freeze()).await?;
        self.flush().await?;
        drop(body);
        if !ended {
            return Err(Stop::Cut);
        }
        Ok(last)
    }

    /// Writes the body's frames in `encoder`'s framing, `out` (the head)
    /// first; leaves the last bytes in `out`. Returns whether the body
    /// ended as its framing says (else the connection is cut after them).
    async fn stream(&mut self, body: &mut ConnBody, encoder: Encoder, out: &mut BytesMut) -> Result<bool, Stop> {
        let mut left = match encoder {
            Encoder::Length(n) => n,
            _ => u64::MAX,
        };
        let mut trailers = None;
        loop {
            let frame =
                match std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut *body).poll_frame(cx))).await {
                    Poll::Ready(frame) => frame,
                    Poll::Pending => {
                        self.write(std::mem::take(out).freeze()).await?;
                        self.flush().await?;
                        self.watched(std::future::poll_fn(|cx| std::pin::Pin::new(&mut *body).poll_frame(cx))).await?
                    }
                };
            let data = match frame {
                None => break,
                Some(Err(e)) => {
                    tracing::debug!(client = %self.addr, error = %e, "response body failed");
                    return Ok(false);
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => data,
                    Err(frame) => {
                        trailers = frame.into_trailers().ok();
                        continue;
                    }
                },
            };
            match &encoder {
                Encoder::Chunked(_) => encode::chunk(out, &data),
                _ => {
                    let n = usize::try_from(left).unwrap_or(usize::MAX).min(data.len());
                    left = left.saturating_sub(n as u64);
                    self.put(out, data.slice(..n)).await?;
                }
            }
            if out.len() >= COALESCE {
                self.write(std::mem::take(out).freeze()).await?;
            }
            if left == 0 {
                return Ok(true);
            }
        }
        match &encoder {
            Encoder::Chunked(allowed) => encode::last_chunk(out, trailers.as_ref(), allowed),
            Encoder::Length(_) if left > 0 => return Ok(false),
            _ => {}
        }
        Ok(true)
    }

    /// `data` after `out`: copied beside it when small, else written after it.
    async fn put(&mut self, out: &mut BytesMut, data: Bytes) -> Result<(), Stop> {
        if data.len() < COALESCE / 2 {
            out.extend_from_slice(&data);
            return Ok(());
        }
        self.write(std::mem::take(out).freeze()).await?;
        self.write(data).await
    }
}
