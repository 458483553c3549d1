//! Accepting connections: the accept loop of `quarrel serve` with a cap on open connections,
//! hyper's header-read timer (which also ends idle keep-alive connections), `TCP_NODELAY`
//! (token streams are many small writes), the `quarrel_http_connections_active` gauge, each
//! connection's peer address for the handlers, and a graceful shutdown with a deadline.

use crate::state::AppState;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::Request;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus::IntGauge;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::ServiceExt;

/// One accepted connection: holds its slot under the connection cap and keeps the gauge up
/// until it closes (an upgraded WebSocket keeps both).
pub struct CountedIo {
    io: TcpStream,
    gauge: IntGauge,
    _slot: OwnedSemaphorePermit,
}

impl Drop for CountedIo {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl AsyncRead for CountedIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountedIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The peer address of a request's connection.
#[derive(Clone, Copy, Debug)]
pub struct ClientAddr(pub SocketAddr);

/// Accept and serve until `shutdown` resolves; then stop accepting, let open requests finish
/// for up to `shutdown_timeout`, end the rest (their streams get the engine's shut-down
/// error) and return.
pub async fn serve(listener: TcpListener, state: AppState, shutdown: impl Future<Output = ()> + Send + 'static) -> io::Result<()> {
    let cfg = state.config.clone();
    let app = crate::routes::router(state.clone());
    let gauge = state.metrics.http_connections.clone();
    let slots = Arc::new(Semaphore::new(cfg.max_connections.max(1)));
    // HTTP/1.1 only (what every client of these APIs speaks): hyper's auto-detecting builder
    // first waits for a protocol preface with no time limit, which a silent client holds open.
    // The header timer starts whenever hyper waits for a request head, on a new connection and
    // after each response, so it bounds both slow headers and idle keep-alive.
    let mut builder = http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(cfg.header_timeout);
    // `signal` tells every connection to finish its request and close; each holds a `closed`
    // receiver until it is gone, so the sender sees when the last one is
    let (signal_tx, signal_rx) = tokio::sync::watch::channel(());
    let (closed_tx, closed_rx) = tokio::sync::watch::channel(());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, addr) = tokio::select! {
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // out of file descriptors or similar: wait rather than spin
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // over the cap: close at once (the client sees a reset or EOF, not a hang)
            drop(tcp);
            tracing::debug!(peer = %addr, "connection refused: --max-connections reached");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        gauge.inc();
        let io = CountedIo { io: tcp, gauge: gauge.clone(), _slot: slot };
        let app = app.clone();
        let svc = tower::service_fn(move |mut req: Request<Incoming>| {
            req.extensions_mut().insert(ConnectInfo(ClientAddr(addr)));
            app.clone().oneshot(req.map(Body::new))
        });
        let conn = builder.serve_connection(TokioIo::new(io), TowerToHyperService::new(svc)).with_upgrades();
        let (mut signal, closed) = (signal_rx.clone(), closed_rx.clone());
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let r = tokio::select! {
                r = conn.as_mut() => r,
                _ = signal.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = r {
                tracing::debug!(peer = %addr, "connection: {e}");
            }
            drop(closed);
        });
    }
    drop(listener);
    tracing::info!(deadline_s = cfg.shutdown_timeout.as_secs_f64(), "no longer accepting; waiting for open requests");
    drop(closed_rx);
    let _ = signal_tx.send(());
    if tokio::time::timeout(cfg.shutdown_timeout, closed_tx.closed()).await.is_err() {
        tracing::warn!("shutdown deadline reached: ending the requests still running");
        state.registry.shutdown_all();
        // give the ended streams a moment to send their error and close
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
