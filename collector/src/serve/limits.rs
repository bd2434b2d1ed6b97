//! Resource limits of `gpucollect serve`: how long a client may take, and how many
//! connections and uploads it may hold, per client and in total. Every limit is a flag of
//! `gpucollect serve` (see `commands/serve.rs`); the defaults are in `Limits::default`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Time and concurrency limits.
#[derive(Clone, Debug)]
pub struct Limits {
    /// From the connection's start (or the end of its previous answer) to the end of the
    /// request headers. Closes idle, slowloris and idle keep-alive connections.
    pub header_timeout: Duration,
    /// Longest pause between two pieces of an upload body, and longest time a client may
    /// take no bytes of an answer it is being sent.
    pub body_idle_timeout: Duration,
    /// Longest time one upload may take, from its headers to its last byte.
    pub request_timeout: Duration,
    pub max_connections: usize,
    pub max_connections_per_client: usize,
    pub max_uploads: usize,
    pub max_uploads_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(30),
            request_timeout: Duration::from_secs(30 * 60),
            max_connections: 512,
            max_connections_per_client: 64,
            max_uploads: 4,
            max_uploads_per_client: 2,
        }
    }
}

/// A client, as far as limits go: its IPv4 address, or the /64 network of its IPv6 address
/// (one host commonly holds a whole /64).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ClientKey(IpAddr);

impl ClientKey {
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Self(ip),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => Self(IpAddr::V4(v4)),
                None => {
                    let s = v6.segments();
                    Self(IpAddr::V6(std::net::Ipv6Addr::new(
                        s[0], s[1], s[2], s[3], 0, 0, 0, 0,
                    )))
                }
            },
        }
    }
}

/// Why a slot was not given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The server holds its maximum in total.
    Full,
    /// This client holds its maximum.
    ClientFull,
}

/// A counted resource (connections, uploads) with a total and a per-client maximum. Taking a
/// slot never waits: a caller that gets none refuses the request at once, so nothing queues
/// up without bound.
#[derive(Debug)]
pub struct Slots {
    total_max: usize,
    client_max: usize,
    held: Mutex<(usize, HashMap<ClientKey, usize>)>,
}

impl Slots {
    pub fn new(total_max: usize, client_max: usize) -> Arc<Self> {
        Arc::new(Self {
            total_max,
            client_max,
            held: Mutex::new((0, HashMap::new())),
        })
    }

    pub fn try_take(self: &Arc<Self>, client: ClientKey) -> Result<Slot, Refused> {
        let mut g = self.held.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per) = &mut *g;
        if *total >= self.total_max {
            return Err(Refused::Full);
        }
        let n = per.entry(client).or_insert(0);
        if *n >= self.client_max {
            return Err(Refused::ClientFull);
        }
        *n += 1;
        *total += 1;
        Ok(Slot {
            slots: self.clone(),
            client,
        })
    }

    /// Slots held now, in total.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).0
    }
}

/// A held slot; dropping it gives it back.
#[derive(Debug)]
pub struct Slot {
    slots: Arc<Slots>,
    client: ClientKey,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut g = self.slots.held.lock().unwrap_or_else(|p| p.into_inner());
        let (total, per) = &mut *g;
        *total = total.saturating_sub(1);
        if let Some(n) = per.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                per.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cap_each_client_and_the_total_and_come_back_on_drop() {
        let s = Slots::new(3, 2);
        let a = ClientKey::of("10.0.0.1".parse().expect("ip"));
        let b = ClientKey::of("10.0.0.2".parse().expect("ip"));
        let a1 = s.try_take(a).expect("first");
        let _a2 = s.try_take(a).expect("second");
        assert_eq!(s.try_take(a).err(), Some(Refused::ClientFull));
        let _b1 = s.try_take(b).expect("other client");
        assert_eq!(s.try_take(b).err(), Some(Refused::Full));
        drop(a1);
        assert_eq!(s.held(), 2);
        assert!(s.try_take(b).is_ok());
    }

    #[test]
    fn ipv6_clients_are_grouped_by_their_64_network() {
        let a = ClientKey::of("2001:db8:1:2::1".parse().expect("ip"));
        let b = ClientKey::of("2001:db8:1:2:ffff::9".parse().expect("ip"));
        let c = ClientKey::of("2001:db8:1:3::1".parse().expect("ip"));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(
            ClientKey::of("::ffff:10.0.0.1".parse().expect("ip")),
            ClientKey::of("10.0.0.1".parse().expect("ip"))
        );
    }
}

/// A connection whose writes fail once the peer has not taken any bytes for `limit`: a client
/// that stops reading an answer (a download, a slow-read attack) lets go of its connection
/// slot instead of holding it for as long as it likes.
#[derive(Debug)]
pub struct WriteStall<T> {
    inner: T,
    limit: Duration,
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl<T> WriteStall<T> {
    pub fn new(inner: T, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
        }
    }

    /// Called when a write is pending: starts the clock, or fails once it has run out.
    fn pending<R>(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<R>> {
        use std::future::Future;
        let limit = self.limit;
        let sleep = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match sleep.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client took no bytes of the answer for the body timeout",
            ))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for WriteStall<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for WriteStall<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_write(cx, buf) {
            std::task::Poll::Pending => this.pending(cx),
            done => {
                this.stalled = None;
                done
            }
        }
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_write_vectored(cx, bufs) {
            std::task::Poll::Pending => this.pending(cx),
            done => {
                this.stalled = None;
                done
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = &mut *self;
        match std::pin::Pin::new(&mut this.inner).poll_flush(cx) {
            std::task::Poll::Pending => this.pending(cx),
            done => {
                this.stalled = None;
                done
            }
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
