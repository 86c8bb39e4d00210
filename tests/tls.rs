//! TLS through the real binary (issue 16): HTTPS on the public listener and `https://`
//! replicas verified against a CA, all made in the test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::sync::Arc;

use common::{Gateway, Mock, Opts, chat_body};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};

/// A CA and a server certificate it signed for `localhost` and 127.0.0.1, as PEM.
struct Pki {
    ca: String,
    cert: String,
    key: String,
}

fn pki() -> Pki {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(rcgen::DnType::CommonName, "tollgate test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.subject_alt_names.push(SanType::IpAddress([127, 0, 0, 1].into()));
    let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
    Pki { ca: ca.pem(), cert: cert.pem(), key: key.serialize_pem() }
}

fn server_config(pki: &Pki) -> Arc<rustls::ServerConfig> {
    let certs = rustls::pki_types::CertificateDer::pem_slice_iter(pki.cert.as_bytes()).map(|c| c.unwrap()).collect();
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(pki.key.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    Arc::new(config)
}

use rustls::pki_types::pem::PemObject;

/// An `https://` replica: TLS in front of the plain mock. Returns its address.
async fn https_replica(pki: &Pki, backend: String) -> String {
    let acceptor = tokio_rustls::TlsAcceptor::from(server_config(pki));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { return };
            let (acceptor, backend) = (acceptor.clone(), backend.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    format!("127.0.0.1:{}", addr.port())
}

fn https_client(ca_pem: Option<&str>) -> reqwest::Client {
    let mut b = reqwest::Client::builder().use_rustls_tls();
    if let Some(pem) = ca_pem {
        b = b.add_root_certificate(reqwest::Certificate::from_pem(pem.as_bytes()).unwrap());
    }
    b.build().unwrap()
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn https_clients_reach_an_https_replica_verified_against_its_ca() {
    let mock = Mock::start();
    let (gateway_pki, replica_pki, stranger) = (pki(), pki(), pki());
    let replica = https_replica(&replica_pki, mock.addr()).await;
    let dir = std::env::temp_dir().join(format!("tollgate-test-tls-{}-{}", std::process::id(), common::free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    write(&dir, "gateway.crt", &gateway_pki.cert);
    write(&dir, "gateway.key", &gateway_pki.key);
    write(&dir, "replica-ca.pem", &replica_pki.ca);
    write(&dir, "stranger-ca.pem", &stranger.ca);
    let opts = Opts {
        chat_replicas: vec![replica.clone()],
        chat_pool_extra: "    tls: true\n    ca_file: replica-ca.pem\n".into(),
        extra_yaml: "tls:\n  cert_file: gateway.crt\n  key_file: gateway.key\n".into(),
        ..Opts::default()
    };
    let gw = Gateway::start_in(&mock, opts, dir.clone());
    let url = format!("https://127.0.0.1:{}/v1/chat/completions", gw.port);
    let client = https_client(Some(&gateway_pki.ca));

    for stream in [false, true] {
        let before = mock.stats().await["requests"].as_u64().unwrap();
        let r = client.post(&url).bearer_auth(&gw.key).json(&chat_body("chat-model", stream)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.version(), reqwest::Version::HTTP_2, "ALPN offers HTTP/2 first");
        let text = r.text().await.unwrap();
        if stream {
            assert!(text.contains("data: [DONE]"), "{text}");
        } else {
            assert_eq!(serde_json::from_str::<serde_json::Value>(&text).unwrap()["model"], "chat-model");
        }
        assert_eq!(mock.stats().await["requests"].as_u64().unwrap(), before + 1, "through the https replica");
    }
    let sent = mock.last_request().await;
    assert_eq!(sent["headers"]["host"], replica.as_str(), "{sent}");

    // A client that does not trust the gateway's CA, and plain HTTP on the TLS port, fail.
    let untrusting = https_client(None).post(&url).json(&chat_body("chat-model", false)).send().await;
    assert!(untrusting.is_err(), "the certificate is verified by clients");
    let plain = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{}/v1/chat/completions", gw.port))
        .json(&chat_body("chat-model", false))
        .send()
        .await;
    assert!(plain.map(|r| r.status() != 200).unwrap_or(true), "no plain HTTP on the TLS listener");

    // The replica's certificate is checked: with another CA in force, no request reaches it.
    let upstreams = std::fs::read_to_string(dir.join("upstreams.yaml")).unwrap();
    write(&dir, "upstreams.yaml", &upstreams.replace("ca_file: replica-ca.pem", "ca_file: stranger-ca.pem"));
    let (s, v) = gw.admin("POST", "/admin/v1/reload", None);
    assert_eq!(s, 200, "{v}");
    let before = mock.stats().await["requests"].as_u64().unwrap();
    let r = client.post(&url).bearer_auth(&gw.key).json(&chat_body("chat-model", false)).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let body: serde_json::Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "upstream_error", "{body}");
    assert_eq!(mock.stats().await["requests"].as_u64().unwrap(), before, "an unverified replica gets nothing");
    assert!(gw.log().contains("ejected for 10 s (refused"), "the failed handshake ejects the replica: {}", gw.log());
}

/// HTTP/2 by ALPN on every route, streamed and not, and HTTP/1.1 for a client that offers only
/// that (decision 219).
#[tokio::test]
async fn http2_by_alpn_serves_every_route_and_http1_still_answers() {
    let mock = Mock::start();
    let gateway_pki = pki();
    let dir = std::env::temp_dir().join(format!("tollgate-test-tlsh2-{}-{}", std::process::id(), common::free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    write(&dir, "gateway.crt", &gateway_pki.cert);
    write(&dir, "gateway.key", &gateway_pki.key);
    let opts =
        Opts { extra_yaml: "tls:\n  cert_file: gateway.crt\n  key_file: gateway.key\n".into(), ..Opts::default() };
    let gw = Gateway::start_in(&mock, opts, dir);
    let base = format!("https://127.0.0.1:{}", gw.port);
    common::routes::every_route_answers(&https_client(Some(&gateway_pki.ca)), &base, &gw).await;
    let http1 = reqwest::Client::builder()
        .use_rustls_tls()
        .http1_only()
        .add_root_certificate(reqwest::Certificate::from_pem(gateway_pki.ca.as_bytes()).unwrap())
        .build()
        .unwrap();
    let r = http1
        .post(format!("{base}/v1/chat/completions"))
        .bearer_auth(&gw.key)
        .json(&chat_body("chat-model", true))
        .send()
        .await
        .unwrap();
    assert_eq!(r.version(), reqwest::Version::HTTP_11);
    assert!(r.text().await.unwrap().ends_with("data: [DONE]\n\n"));
    // curl --http2 negotiates HTTP/2 by ALPN.
    let ca = gw.dir.join("ca.pem");
    write(&gw.dir, "ca.pem", &gateway_pki.ca);
    let out = std::process::Command::new("curl")
        .args(["-sS", "--http2", "--cacert"])
        .arg(&ca)
        .args(["-w", "\n%{http_version} %{http_code}", "-H"])
        .arg(format!("authorization: Bearer {}", gw.key))
        .args(["-H", "content-type: application/json", "-d"])
        .arg(chat_body("chat-model", true).to_string())
        .arg(format!("{base}/v1/chat/completions"))
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.ends_with("\n2 200") && text.contains("data: [DONE]"),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The messages dialect's heartbeat reaches a TLS client, over HTTP/1.1 and HTTP/2: the response
/// loop writes it through the connection's own session, between whole events (decision 218).
#[tokio::test]
async fn a_silent_messages_stream_gets_pings_over_tls() {
    let mock = Mock::start();
    let gateway_pki = pki();
    let dir =
        std::env::temp_dir().join(format!("tollgate-test-tlsping-{}-{}", std::process::id(), common::free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    write(&dir, "gateway.crt", &gateway_pki.cert);
    write(&dir, "gateway.key", &gateway_pki.key);
    let opts = Opts {
        heartbeat_seconds: 0.5,
        extra_yaml: "tls:\n  cert_file: gateway.crt\n  key_file: gateway.key\n".into(),
        ..Opts::default()
    };
    let gw = Gateway::start_in(&mock, opts, dir);
    let body = serde_json::json!({"model": "chat-model", "max_tokens": 8, "stream": true,
                                  "messages": [{"role": "user", "content": "hi"}]});
    for http1 in [true, false] {
        let mut client = reqwest::Client::builder()
            .use_rustls_tls()
            .add_root_certificate(reqwest::Certificate::from_pem(gateway_pki.ca.as_bytes()).unwrap());
        if http1 {
            client = client.http1_only();
        }
        let r = client
            .build()
            .unwrap()
            .post(format!("https://127.0.0.1:{}/v1/messages", gw.port))
            .header("x-api-key", &gw.key)
            .header("x-mock-tokens", "2")
            .header("x-mock-token-delay-ms", "1600")
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let version = if http1 { reqwest::Version::HTTP_11 } else { reqwest::Version::HTTP_2 };
        assert_eq!(r.version(), version);
        let text = r.text().await.unwrap();
        let names: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
        assert!(names.iter().filter(|n| **n == "ping").count() >= 2, "pings while the replica is silent: {names:?}");
        assert_eq!(names.first(), Some(&"message_start"), "never a ping before the opening event");
        assert_eq!(names.last(), Some(&"message_stop"), "{names:?}");
        for frame in text.split("\n\n").filter(|f| f.starts_with("event: ping")) {
            assert_eq!(frame, "event: ping\ndata: {\"type\": \"ping\"}", "a whole ping event");
        }
    }
}

/// `tollgate check-config` on `dir/tollgate.yaml`: whether it passed, and its stderr.
fn check_config(dir: &Path) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn check_config_names_a_missing_certificate_and_a_bad_ca_file() {
    let dir = std::env::temp_dir().join(format!("tollgate-test-tlscfg-{}-{}", std::process::id(), common::free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    write(
        &dir,
        "models.yaml",
        "models:\n  - id: m\n    supported_endpoints: [chat_completions]\n    max_output_tokens: 100\n",
    );
    write(&dir, "not-a-cert.pem", "hello\n");
    write(
        &dir,
        "upstreams.yaml",
        "pools:\n  m:\n    tls: true\n    ca_file: not-a-cert.pem\n    replicas:\n      - { address: \"127.0.0.1:1\", max_concurrency: 1 }\n",
    );
    write(
        &dir,
        "tollgate.yaml",
        "listen: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\ntls:\n  cert_file: missing.crt\n  key_file: missing.key\nplugins:\n  - name: chat_completions\n",
    );
    let (ok, err) = check_config(&dir);
    assert!(!ok);
    assert!(err.contains("tollgate.yaml: tls.cert_file:"), "{err}");
    assert!(err.contains("tollgate.yaml: tls.key_file:"), "{err}");
    // Two good files that are not a pair: refused here, not a panic at start (decision 174).
    let (one, other) = (pki(), pki());
    write(&dir, "gateway.crt", &one.cert);
    write(&dir, "gateway.key", &other.key);
    write(
        &dir,
        "tollgate.yaml",
        "listen: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\ntls:\n  cert_file: gateway.crt\n  key_file: gateway.key\nplugins:\n  - name: chat_completions\n",
    );
    let (ok, err) = check_config(&dir);
    assert!(!ok);
    assert!(err.contains("tls.key_file:") && err.contains("does not go with the certificate"), "{err}");
    assert!(!err.contains("tls.cert_file:"), "{err}");
    write(&dir, "gateway.key", &one.key);
    let (_, err) = check_config(&dir);
    assert!(!err.contains("tls."), "the pair goes together: {err}");
    // With the listener fixed, the pool's CA file is the problem left.
    write(
        &dir,
        "tollgate.yaml",
        "listen: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\nplugins:\n  - name: chat_completions\n",
    );
    let (ok, err) = check_config(&dir);
    assert!(!ok);
    assert!(err.contains("upstreams.yaml: pools.m.ca_file:"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
