//! A file's bytes streamed as a response body, of the length its answer
//! declared.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::Stream;
use http_body::{Frame, SizeHint};
use tokio::io::Take;
use tokio_util::io::ReaderStream;

use super::BoxError;

/// `length` bytes of a file, read in chunks of `chunk`. The file may
/// shrink while it is sent: a body that ends short of its length fails,
/// so the client's connection (HTTP/1.1) or stream (HTTP/2) is cut rather
/// than the short answer passed off as whole. The length is its size
/// hint, so an HTTP/1.0 client keeps its connection after it.
pub struct FileBody {
    stream: ReaderStream<Take<tokio::fs::File>>,
    left: u64,
}

impl FileBody {
    pub fn new(file: tokio::fs::File, length: u64, chunk: usize) -> Self {
        use tokio::io::AsyncReadExt;
        FileBody { stream: ReaderStream::with_capacity(file.take(length), chunk), left: length }
    }

    pub fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        match ready!(Pin::new(&mut self.stream).poll_next(cx)) {
            Some(Ok(bytes)) => {
                self.left = self.left.saturating_sub(bytes.len() as u64);
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            Some(Err(e)) => Poll::Ready(Some(Err(e.into()))),
            None if self.left > 0 => {
                let short = std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("file ended {} bytes short of its length", self.left),
                );
                self.left = 0;
                Poll::Ready(Some(Err(short.into())))
            }
            None => Poll::Ready(None),
        }
    }

    pub fn is_end_stream(&self) -> bool {
        self.left == 0
    }

    pub fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.left)
    }
}
