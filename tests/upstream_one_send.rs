//! Decision 197 (vendor/patches): Pingora's HTTP/1 client, on the upstream connection its
//! connector makes, sends a request's header and a Content-Length body in one send, and
//! still sends the header at once when nothing follows it or something waits on it.
//!
//! Loopback delivers a send into the peer's receive queue before `sendto` returns, so
//! "nothing is readable yet" right after `write_request_header` is exact, not a race.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{ErrorKind, Read};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use pingora::connectors::TransportConnector;
use pingora::http::RequestHeader;
use pingora::protocols::http::v1::client::HttpSession;
use pingora::upstreams::peer::HttpPeer;

/// A client session on a connection made by Pingora's connector (as the proxy makes
/// them), and the replica's end of it.
async fn connect() -> (HttpSession, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let peer = HttpPeer::new(listener.local_addr().unwrap(), false, String::new());
    let stream = TransportConnector::new(None).new_stream(&peer).await.unwrap();
    let (replica, _) = listener.accept().unwrap();
    replica.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    (HttpSession::new(stream), replica)
}

fn head(method: &str, headers: &[(&str, String)]) -> Box<RequestHeader> {
    let mut h = RequestHeader::build(method, b"/v1/chat/completions", None).unwrap();
    h.insert_header("Host", "replica").unwrap();
    for (name, value) in headers {
        h.insert_header(name.to_string(), value.as_str()).unwrap();
    }
    Box::new(h)
}

/// What the replica can read without waiting, or None when nothing has arrived.
fn readable_now(replica: &mut TcpStream) -> Option<Vec<u8>> {
    replica.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; 256 * 1024];
    let got = match replica.read(&mut buf) {
        Ok(n) => Some(buf[..n].to_vec()),
        Err(e) if e.kind() == ErrorKind::WouldBlock => None,
        Err(e) => panic!("replica read: {e}"),
    };
    replica.set_nonblocking(false).unwrap();
    got
}

/// Reads until `len` bytes have arrived, counting the reads.
fn read_exactly(replica: &mut TcpStream, len: usize) -> (Vec<u8>, usize) {
    let mut all = Vec::new();
    let mut reads = 0;
    let mut buf = vec![0u8; 256 * 1024];
    while all.len() < len {
        let n = replica.read(&mut buf).unwrap();
        assert!(n > 0, "the connection closed after {} of {len} bytes", all.len());
        all.extend_from_slice(&buf[..n]);
        reads += 1;
    }
    (all, reads)
}

fn body_of(len: usize) -> Vec<u8> {
    let mut body = br#"{"model":"m","messages":[{"role":"user","content":""#.to_vec();
    body.resize(len - 3, b'x');
    body.extend_from_slice(b"\"}]");
    body
}

/// A session that has written the header of a POST whose Content-Length body is `len` bytes:
/// the session, the replica's end, the body still to write and the header's length.
async fn post_header_written(len: usize) -> (HttpSession, TcpStream, Vec<u8>, usize) {
    let (mut session, replica) = connect().await;
    let body = body_of(len);
    let header_len =
        session.write_request_header(head("POST", &[("Content-Length", body.len().to_string())])).await.unwrap();
    (session, replica, body, header_len)
}

#[tokio::test]
async fn a_content_length_body_leaves_with_its_header_in_one_send() {
    let (mut session, mut replica, body, header_len) = post_header_written(1_200).await;
    assert_eq!(readable_now(&mut replica), None, "the header waits for its body");
    session.write_body(&body).await.unwrap();
    let sent = readable_now(&mut replica).expect("header and body sent once the body is written");
    assert_eq!(sent.len(), header_len + body.len(), "one send carried header and body");
    assert!(sent.starts_with(b"POST /v1/chat/completions HTTP/1.1\r\n"));
    assert!(sent.ends_with(&body));
}

#[tokio::test]
async fn a_body_written_in_pieces_is_sent_when_its_last_piece_is() {
    let (mut session, mut replica, body, header_len) = post_header_written(3_000).await;
    session.write_body(&body[..1_000]).await.unwrap();
    assert_eq!(readable_now(&mut replica), None, "nothing leaves before the body is complete");
    session.write_body(&body[1_000..]).await.unwrap();
    let (sent, reads) = read_exactly(&mut replica, header_len + body.len());
    assert_eq!(reads, 1, "one send");
    assert!(sent.ends_with(&body));
}

/// Writes a request header that nothing may hold back and checks it reached the replica.
async fn header_alone_is_sent_at_once(method: &str, headers: &[(&str, String)], why: &str) {
    let (mut session, mut replica) = connect().await;
    let header_len = session.write_request_header(head(method, headers)).await.unwrap();
    let sent = readable_now(&mut replica).unwrap_or_else(|| panic!("{why}"));
    assert_eq!(sent.len(), header_len);
}

#[tokio::test]
async fn a_request_without_a_body_is_sent_at_once() {
    header_alone_is_sent_at_once("GET", &[], "a request with no body is sent with its header").await;
}

#[tokio::test]
async fn a_header_that_waits_for_100_continue_is_sent_at_once() {
    let headers = [("Content-Length", "1200".to_string()), ("Expect", "100-continue".to_string())];
    header_alone_is_sent_at_once("POST", &headers, "the replica must see the header to answer 100").await;
}

#[tokio::test]
async fn a_chunked_header_is_sent_at_once() {
    let headers = [("Transfer-Encoding", "chunked".to_string())];
    header_alone_is_sent_at_once("POST", &headers, "a chunked request's header is not held").await;
}

#[tokio::test]
async fn a_body_larger_than_the_buffer_arrives_whole() {
    let (mut session, mut replica, body, header_len) = post_header_written(200_000).await;
    let total = header_len + body.len();
    let reader = std::thread::spawn(move || read_exactly(&mut replica, total));
    session.write_body(&body).await.unwrap();
    let (sent, _) = reader.join().unwrap();
    assert_eq!(&sent[header_len..], &body[..]);
}
