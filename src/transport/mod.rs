//! The client side of the connection: who the client is behind load balancers, how many
//! connections are open, and where the gateway helps Pingora's proxy loop (each such piece is
//! headed by the Pingora limitation it exists for and when to drop it).

#[allow(unsafe_code)] // the replaying socket reads the kernel send queue (ioctl) and socket options
pub mod body_replay;
pub mod client_address;
pub mod connection_cap;
pub mod held_output;

/// A socket wrapper's identity and digests are those of the stream it wraps (`self.inner`):
/// Pingora reads the TLS state, timings and socket address of a connection through them.
macro_rules! inner_stream_digests {
    ($wrapper:ty) => {
        impl pingora::protocols::UniqueID for $wrapper {
            fn id(&self) -> pingora::protocols::UniqueIDType {
                pingora::protocols::UniqueID::id(&*self.inner)
            }
        }

        impl pingora::protocols::Ssl for $wrapper {
            fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
                pingora::protocols::Ssl::get_ssl(&*self.inner)
            }
            fn get_ssl_digest(&self) -> Option<std::sync::Arc<pingora::protocols::tls::SslDigest>> {
                pingora::protocols::Ssl::get_ssl_digest(&*self.inner)
            }
            fn selected_alpn_proto(&self) -> Option<pingora::protocols::ALPN> {
                pingora::protocols::Ssl::selected_alpn_proto(&*self.inner)
            }
        }

        impl pingora::protocols::GetTimingDigest for $wrapper {
            fn get_timing_digest(&self) -> Vec<Option<pingora::protocols::TimingDigest>> {
                pingora::protocols::GetTimingDigest::get_timing_digest(&*self.inner)
            }
            fn get_read_pending_time(&self) -> std::time::Duration {
                pingora::protocols::GetTimingDigest::get_read_pending_time(&*self.inner)
            }
            fn get_write_pending_time(&self) -> std::time::Duration {
                pingora::protocols::GetTimingDigest::get_write_pending_time(&*self.inner)
            }
        }

        impl pingora::protocols::GetProxyDigest for $wrapper {
            fn get_proxy_digest(&self) -> Option<std::sync::Arc<pingora::protocols::raw_connect::ProxyDigest>> {
                pingora::protocols::GetProxyDigest::get_proxy_digest(&*self.inner)
            }
        }

        impl pingora::protocols::GetSocketDigest for $wrapper {
            fn get_socket_digest(&self) -> Option<std::sync::Arc<pingora::protocols::SocketDigest>> {
                pingora::protocols::GetSocketDigest::get_socket_digest(&*self.inner)
            }
        }
    };
}
pub(crate) use inner_stream_digests;
