//! The TCP listener `quarrel serve` accepts on: counts open connections for the
//! `quarrel_http_connections_active` gauge, sets `TCP_NODELAY` (token streams are many small
//! writes) and hands each connection's peer address to the handlers.

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use prometheus::IntGauge;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A TCP listener that counts its open connections.
pub struct CountingListener {
    inner: TcpListener,
    gauge: IntGauge,
}

impl CountingListener {
    pub fn new(inner: TcpListener, gauge: IntGauge) -> CountingListener {
        CountingListener { inner, gauge }
    }
}

/// One accepted connection; the gauge goes down when it closes.
pub struct CountedIo {
    io: TcpStream,
    gauge: IntGauge,
}

impl Drop for CountedIo {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl Listener for CountingListener {
    type Io = CountedIo;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (CountedIo, SocketAddr) {
        let (io, addr) = Listener::accept(&mut self.inner).await;
        let _ = io.set_nodelay(true);
        self.gauge.inc();
        (CountedIo { io, gauge: self.gauge.clone() }, addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
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

impl Connected<IncomingStream<'_, CountingListener>> for ClientAddr {
    fn connect_info(stream: IncomingStream<'_, CountingListener>) -> Self {
        ClientAddr(*stream.remote_addr())
    }
}
