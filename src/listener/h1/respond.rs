//! Writing a response: its head encoded at once ([`response_head`]), then
//! its body's frames in the framing the head declared, gathered into few
//! writes, watching the socket while the body is silent.

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;

use bytes::{Bytes, BytesMut};
use http::Response;
use http_body::Body as _;
use tokio::io::AsyncWrite;

use super::encode::{self, Asked, BodyLength, Encoder};
use super::{COALESCE, Own, Stop};
use crate::listener::conn::ConnBody;

/// Encodes `response`'s head into a buffer with room for a small body
/// beside it; returns the body, its encoder, the buffer, and whether the
/// response must be the connection's last.
pub(super) fn response_head(
    response: Response<ConnBody>,
    asked: Asked<'_>,
    trailers_ok: bool,
) -> (ConnBody, Encoder, BytesMut, bool) {
    let (mut parts, mut body) = response.into_parts();
    let id = body.id.take();
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
    let id_room = id.as_ref().map_or(0, |id| id.len() + 16);
    let mut out = crate::net::write_buffer(encode::capacity(&parts.headers) + id_room + body_room);
    let (mut encoder, last) = encode::head(&mut parts, length, asked, id.as_ref(), &mut out);
    // Its fields are encoded: the map goes to the next head parsed.
    crate::headers::spare::give_back(std::mem::take(&mut parts.headers));
    if let (Encoder::Chunked(allowed), false) = (&mut encoder, trailers_ok) {
        allowed.clear();
    }
    (body, encoder, out, last)
}

impl Own<'_> {
    /// Writes a 1xx head from the upstream to the client.
    pub(super) async fn forward_interim(&mut self, raw: &[u8]) -> Result<(), Stop> {
        let mut out = BytesMut::new();
        encode::interim(raw, &mut out, self.app.config().server.request_id);
        // A 503 written after half a 1xx head would be garbage.
        self.flags.unanswered.store(false, Relaxed);
        self.write(out.freeze()).await?;
        self.flush().await?;
        self.flags.unanswered.store(true, Relaxed);
        Ok(())
    }

    /// Waits for `f` (the answer's next bytes) watching the socket, as
    /// [`Own::wait_for_answer`] does: a client that leaves while a streamed
    /// answer is silent is noticed (as hyper's connection notices it).
    async fn watched<F: Future>(&mut self, f: F) -> Result<F::Output, Stop> {
        let mut f = pin!(f);
        let mut watching = true;
        loop {
            let wire = self.wire;
            let watch = std::future::poll_fn(|cx| match watching {
                true => wire.lock().poll_watch(cx),
                false => Poll::Pending,
            });
            let raced = async {
                tokio::select! {
                    biased;
                    out = &mut f => Ok(out),
                    gone = watch => Err(gone),
                }
            };
            match raced.await {
                Ok(out) => return Ok(out),
                Err(Ok(false)) => watching = false,
                Err(_) => {
                    tracing::debug!(client = %self.addr, "client closed the connection while its answer was streaming");
                    return Err(Stop::Cut);
                }
            }
        }
    }

    /// Writes the response made by [`response_head`]: its body's frames
    /// after `out` (the head). (A plain fn returning its future: an async
    /// fn would keep a copy of each argument beside the one it moves.)
    #[allow(clippy::manual_async_fn)] // See above: not an `async fn` on purpose.
    pub(super) fn respond(
        &mut self,
        mut body: ConnBody,
        encoder: Encoder,
        mut out: BytesMut,
    ) -> impl Future<Output = Result<(), Stop>> {
        async move {
            let ended = match encoder {
                Encoder::Length(0) => true,
                encoder => self.stream(&mut body, encoder, &mut out).await?,
            };
            self.write(&out[..]).await?;
            self.flush().await?;
            crate::net::give_back(out);
            drop(body);
            if !ended {
                return Err(Stop::Cut);
            }
            Ok(())
        }
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

    /// Writes all of `bytes`, within the send timeout.
    pub(super) fn write<B: AsRef<[u8]>>(&self, bytes: B) -> impl Future<Output = Result<(), Stop>> {
        let wire = self.wire;
        let mut at = 0;
        std::future::poll_fn(move |cx| match bytes.as_ref() {
            [] => Poll::Ready(Ok(())),
            bytes => wire.lock().poll_write_all(bytes, &mut at, cx).map_err(|_| Stop::Cut),
        })
    }

    pub(super) async fn flush(&mut self) -> Result<(), Stop> {
        let wire = self.wire;
        let flushed = std::future::poll_fn(|cx| std::pin::Pin::new(&mut wire.lock().io).poll_flush(cx));
        flushed.await.map_err(|_| Stop::Cut)
    }
}
