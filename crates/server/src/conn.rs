//! Connections: the accept loop under a connection limit, HTTP/1.1 on each connection with a
//! header read timeout (hyper's), graceful shutdown, and OpenAI error bodies for the errors
//! hyper answers itself before any routing (a garbage request line, too many or too large
//! headers, `Content-Length: abc`: hyper writes a 400/414/431 with an empty body).
//!
//! hyper has no hook for those responses, so each connection's socket is wrapped in
//! [`ErrorBodies`], which recognizes them as they are written (a 4xx/5xx head with
//! `content-length: 0`, which no route of this server ever sends: every error it makes has a
//! JSON body) and writes the same status with the JSON body instead.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::StatusCode;
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use crate::api_error::ApiError;

/// How connections are held to account.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    /// Most connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// Time a client has to send a request's headers, from its first byte (a connection that
    /// sends half a head is closed).
    pub header_read_timeout: Duration,
}

/// Largest request head hyper buffers, bytes (its default is ~400 KB).
const MAX_HEAD_BYTES: usize = 64 << 10;
/// Most headers in a request (hyper's default).
const MAX_HEADERS: usize = 100;

/// Serves `app` on `listener` until `shutdown` completes, then stops accepting, lets each
/// connection finish its request in flight (graceful) and returns once all are closed.
pub(crate) async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    // Dropped when shutdown begins: every connection task sees it closed.
    let (stop_tx, stop_rx) = watch::channel(());
    // Each connection task holds a receiver; all are gone once every connection closed.
    let (done_tx, done_rx) = watch::channel(());
    tokio::pin!(shutdown);
    loop {
        let (tcp, _peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) if is_per_connection(&e) => continue,
                Err(_) => {
                    // Out of descriptors or memory: wait a little, as hyper's examples do.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Streamed tokens go out as they are made, not when a segment fills.
        let _ = tcp.set_nodelay(true);
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tokio::spawn(refuse(tcp, limits.max_connections));
            continue;
        };
        let app = app.clone();
        let mut stop = stop_rx.clone();
        let done = done_rx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let _done = done;
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(MAX_HEAD_BYTES)
                .max_headers(MAX_HEADERS);
            let io = TokioIo::new(ErrorBodies::new(tcp));
            let conn = http.serve_connection(io, TowerToHyperService::new(app));
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = stop.changed() => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        });
    }
    drop(listener);
    drop(stop_tx);
    drop(done_rx);
    done_tx.closed().await;
    Ok(())
}

/// Accept errors that concern one connection only (the next accept may succeed at once).
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// Answers a connection over the limit with a 503 and closes it.
async fn refuse(mut tcp: TcpStream, limit: usize) {
    let error = ApiError::busy(format!(
        "this server already has {limit} connections open, its limit (--max-connections); \
         retry later"
    ))
    .with_status(StatusCode::SERVICE_UNAVAILABLE);
    let bytes = raw_response(&error);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        tcp.write_all(&bytes).await?;
        tcp.shutdown().await?;
        // Read what the client sent until it closes, so that closing does not reset the
        // connection (and lose the response) while its request is still unread.
        let mut sink = [0u8; 4096];
        while tokio::io::AsyncReadExt::read(&mut tcp, &mut sink).await? > 0 {}
        io::Result::Ok(())
    })
    .await;
}

/// A whole HTTP/1.1 response carrying `error`'s JSON body, closing the connection.
fn raw_response(error: &ApiError) -> Vec<u8> {
    let body = serde_json::to_vec(&error.body()).unwrap_or_else(|_| b"{}".to_vec());
    let mut out = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n",
        error.status.as_u16(),
        error.status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(&body);
    out
}

/// The error a bodiless automatic response of hyper's with `status` stands for.
fn parse_error(status: StatusCode) -> ApiError {
    let message = match status {
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => format!(
            "the request's head is too large: this server reads at most {MAX_HEADERS} headers \
             and {} KiB of request line and headers",
            MAX_HEAD_BYTES >> 10
        ),
        StatusCode::URI_TOO_LONG => "the request's URI is too long".to_string(),
        StatusCode::BAD_REQUEST => "the request is not valid HTTP/1.1: a malformed request line, \
                                    header name or value, or Content-Length"
            .to_string(),
        other => format!("the request could not be read as HTTP/1.1 ({other})"),
    };
    ApiError::invalid(None, message)
        .with_status(status)
        .with_code("malformed_http")
}

/// If `head` (a whole response head, up to the blank line) is one of hyper's automatic error
/// responses, its status.
fn automatic_error_status(head: &[u8]) -> Option<StatusCode> {
    let text = std::str::from_utf8(head).ok()?;
    let status_line = text.lines().next()?;
    let code: u16 = status_line
        .strip_prefix("HTTP/1.1 ")?
        .get(..3)?
        .parse()
        .ok()?;
    let status = StatusCode::from_u16(code).ok()?;
    if !(status.is_client_error() || status.is_server_error()) {
        return None;
    }
    let mut empty = false;
    for line in text.lines().skip(1) {
        let lower = line.to_ascii_lowercase();
        if lower.starts_with("content-type:") {
            return None;
        }
        if lower.replace(' ', "") == "content-length:0" {
            empty = true;
        }
    }
    empty.then_some(status)
}

/// A socket whose bodiless 4xx/5xx responses (hyper's answers to requests it cannot parse) are
/// rewritten to carry OpenAI's error JSON; everything else passes through unchanged.
pub(crate) struct ErrorBodies<T> {
    inner: T,
    /// A replacement response still to be written, and how much of it is out.
    pending: Option<(Vec<u8>, usize)>,
}

impl<T> ErrorBodies<T> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: T) -> Self {
        Self {
            inner,
            pending: None,
        }
    }
}

impl<T: AsyncWrite + Unpin> ErrorBodies<T> {
    /// Writes out the pending replacement; ready once none is left.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while let Some((bytes, done)) = &mut self.pending {
            if *done == bytes.len() {
                self.pending = None;
                break;
            }
            match Pin::new(&mut self.inner).poll_write(cx, &bytes[*done..]) {
                Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Poll::Ready(Ok(n)) => *done += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ErrorBodies<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ErrorBodies<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.poll_pending(cx)?.is_pending() {
            return Poll::Pending;
        }
        if buf.starts_with(b"HTTP/1.1 4") || buf.starts_with(b"HTTP/1.1 5") {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                if let Some(status) = automatic_error_status(&buf[..end]) {
                    this.pending = Some((raw_response(&parse_error(status)), 0));
                    // The replacement stands for all of these bytes (a bodiless response).
                    let _ = this.poll_pending(cx)?;
                    return Poll::Ready(Ok(end + 4));
                }
            }
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.poll_pending(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.poll_pending(cx)?.is_pending() {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bodiless_error_heads_are_recognized() {
        let hyper_400 = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\ndate: x";
        assert_eq!(
            automatic_error_status(hyper_400),
            Some(StatusCode::BAD_REQUEST)
        );
        let ours = b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n\
                     content-length: 0";
        assert_eq!(automatic_error_status(ours), None);
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0";
        assert_eq!(automatic_error_status(ok), None);
        let with_body = b"HTTP/1.1 404 Not Found\r\ncontent-length: 12";
        assert_eq!(automatic_error_status(with_body), None);
    }
}
