//! TLS to the stores (issue 52): Redis (`rediss://`) and PostgreSQL verified against a CA
//! made here, with a client certificate where the server asks for one; a wrong CA stops the
//! gateway at start with the field to fix. Each server is one of the test's own.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Gateway, Mock, Opts, chat_body};
use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};

/// A CA, a server certificate and a client certificate it signed, as PEM files in `dir`,
/// and a second CA that signed nothing here.
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn make(dir: &Path) -> Pki {
        std::fs::create_dir_all(dir).unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.distinguished_name.push(rcgen::DnType::CommonName, "tollgate store CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let server_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.subject_alt_names.push(SanType::IpAddress([127, 0, 0, 1].into()));
        let server = params.signed_by(&server_key, &ca, &ca_key).unwrap();
        let client_key = KeyPair::generate().unwrap();
        let mut client_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        client_params.distinguished_name.push(rcgen::DnType::CommonName, "postgres");
        let client = client_params.signed_by(&client_key, &ca, &ca_key).unwrap();
        let other_key = KeyPair::generate().unwrap();
        let mut other_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        other_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let other = other_params.self_signed(&other_key).unwrap();
        for (name, pem) in [
            ("ca.pem", ca.pem()),
            ("server.pem", server.pem()),
            ("server.key", server_key.serialize_pem()),
            ("client.pem", client.pem()),
            ("client.key", client_key.serialize_pem()),
            ("other-ca.pem", other.pem()),
        ] {
            std::fs::write(dir.join(name), pem).unwrap();
        }
        Pki { dir: dir.to_path_buf() }
    }

    fn path(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

/// A redis-server of the test's own speaking TLS only, asking for a client certificate.
struct TlsRedis {
    child: std::process::Child,
    port: u16,
}

impl TlsRedis {
    fn start(pki: &Pki) -> TlsRedis {
        let port = common::free_port();
        let child = Command::new("redis-server")
            .args(["--port", "0", "--tls-port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--tls-auth-clients", "yes"])
            .args(["--tls-cert-file", &pki.path("server.pem"), "--tls-key-file", &pki.path("server.key")])
            .args(["--tls-ca-cert-file", &pki.path("ca.pem")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        wait_port(port);
        TlsRedis { child, port }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "port {port} did not open");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `tollgate serve` with `yaml` as its `tollgate.yaml`: its exit status and stderr, expecting
/// it to stop by itself.
fn serve_expecting_exit(dir: &Path, yaml: &str) -> (Option<i32>, String) {
    std::fs::write(dir.join("pepper"), "p".repeat(48)).unwrap();
    std::fs::write(dir.join("enc"), "ab".repeat(32)).unwrap();
    std::fs::write(dir.join("models.yaml"), common::models_yaml()).unwrap();
    std::fs::write(dir.join("upstreams.yaml"), "pools: {}\n").unwrap();
    std::fs::write(dir.join("tollgate.yaml"), yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut child = out;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            return (status.code(), err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("the gateway started where it should have refused");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn limits_yaml(port: u16, pki: &Pki, ca: &str) -> String {
    format!(
        "  store: {{ backend: redis, url: \"rediss://127.0.0.1:{port}\", prefix: tls-test, timeout_ms: 2000, tls: {{ ca_file: \"{}\", cert_file: \"{}\", key_file: \"{}\" }} }}\n",
        pki.path(ca),
        pki.path("client.pem"),
        pki.path("client.key")
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn redis_over_tls_verified_against_the_ca_with_a_client_certificate() {
    let dir = std::env::temp_dir().join(format!("tollgate-store-tls-r-{}", common::free_port()));
    let pki = Pki::make(&dir.join("pki"));
    let redis = TlsRedis::start(&pki);
    let mock = Mock::start();
    let opts = Opts { limits: Some(limits_yaml(redis.port, &pki, "ca.pem")), ..Opts::default() };
    let gw = Gateway::start_with(&mock, opts);
    // Admission runs through the limiter's Redis: a 200 is a TLS round trip.
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (s, health) = gw.admin("GET", "/admin/v1/health", None);
    assert_eq!(s, 200, "{health}");
    assert_eq!(health["stores"]["limiter"]["status"], "ok", "{health}");

    // The same server, a CA that did not sign its certificate: refused at start, saying where.
    let bad = dir.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:{}\nadmin_listen: 127.0.0.1:{}\nlimits:\n{}",
        common::free_port(),
        common::free_port(),
        limits_yaml(redis.port, &pki, "other-ca.pem")
    );
    let (code, err) = serve_expecting_exit(&bad, &yaml);
    println!("store_tls: redis with a wrong CA: {}", err.trim());
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("limits.store: TLS to rediss://127.0.0.1"), "{err}");
    assert!(err.contains("limits.store.tls.ca_file"), "{err}");
    // A file that is not a certificate is a config problem naming the field.
    let check = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(bad.join("tollgate.yaml"))
        .output()
        .unwrap();
    assert!(check.status.success(), "the bad CA file itself is a valid certificate");
    std::fs::write(dir.join("pki/other-ca.pem"), "not a certificate").unwrap();
    let check = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(bad.join("tollgate.yaml"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&check.stdout).to_string() + &String::from_utf8_lossy(&check.stderr);
    assert!(!check.status.success(), "{text}");
    assert!(text.contains("limits.store.tls.ca_file"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A PostgreSQL cluster of the test's own (initdb as the `postgres` user) that accepts only
/// TLS connections with a client certificate its CA signed.
struct TlsPostgres {
    data: PathBuf,
    port: u16,
    bin: PathBuf,
}

impl TlsPostgres {
    fn start(pki: &Pki, root: &Path) -> TlsPostgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL server binaries under /usr/lib/postgresql (scripts/services.sh installs them)")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .find(|b| b.join("initdb").exists())
            .expect("initdb");
        let data = root.join("pgdata");
        let port = common::free_port();
        let as_postgres = |cmd: &Path| {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(cmd);
            c
        };
        // The server's key must belong to the server's user and be private to it.
        let certs = root.join("pgcerts");
        std::fs::create_dir_all(&certs).unwrap();
        for f in ["server.pem", "server.key", "ca.pem"] {
            std::fs::copy(pki.dir.join(f), certs.join(f)).unwrap();
        }
        let chown = Command::new("chown").args(["-R", "postgres:postgres"]).arg(root).status().unwrap();
        assert!(chown.success());
        std::fs::set_permissions(certs.join("server.key"), std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let out = as_postgres(&bin.join("initdb"))
            .args(["-D", &data.display().to_string(), "-A", "trust", "-U", "postgres"])
            .output()
            .unwrap();
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        // TLS only, with a client certificate; plain TCP is refused.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 cert\nhostnossl all all 127.0.0.1/32 reject\n",
        )
        .unwrap();
        let options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c ssl=on -c ssl_cert_file={} -c ssl_key_file={} -c ssl_ca_file={}",
            root.display(),
            certs.join("server.pem").display(),
            certs.join("server.key").display(),
            certs.join("ca.pem").display()
        );
        let out = as_postgres(&bin.join("pg_ctl"))
            .args(["-D", &data.display().to_string(), "-o", &options, "-l"])
            .arg(root.join("pg.log"))
            .args(["-w", "start"])
            .output()
            .unwrap();
        let log = std::fs::read_to_string(root.join("pg.log")).unwrap_or_default();
        assert!(out.status.success(), "pg_ctl start: {} {log}", String::from_utf8_lossy(&out.stderr));
        wait_port(port);
        TlsPostgres { data, port, bin }
    }
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .args(["-D", &self.data.display().to_string(), "-m", "immediate", "stop"])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_over_tls_verified_against_the_ca_with_a_client_certificate() {
    let root = std::env::temp_dir().join(format!("tollgate-store-tls-pg-{}", common::free_port()));
    let pki = Pki::make(&root.join("pki"));
    let pg = TlsPostgres::start(&pki, &root);
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port);
    let tls = format!(
        "tls: {{ ca_file: \"{}\", cert_file: \"{}\", key_file: \"{}\" }}",
        pki.path("ca.pem"),
        pki.path("client.pem"),
        pki.path("client.key")
    );
    let mock = Mock::start();
    let opts = Opts { postgres_url: Some(url.clone()), postgres_tls: Some(tls.clone()), ..Opts::default() };
    let gw = Gateway::start_with(&mock, opts);
    // Keys, holds and settlements are in that PostgreSQL: a billed 200 went over TLS.
    let r = gw.post("/v1/chat/completions", &chat_body("chat-model", false), &[]).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let (s, health) = gw.admin("GET", "/admin/v1/health", None);
    assert_eq!(s, 200, "{health}");
    assert_eq!(health["stores"]["identity"]["status"], "ok", "{health}");
    drop(gw);

    // A wrong CA: the gateway does not start, and says which store.
    let bad = root.join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    let yaml = format!(
        "listen: 127.0.0.1:{}\nadmin_listen: 127.0.0.1:{}\nidentity:\n  store: {{ backend: postgres, url: \"{url}\", {} }}\n  migrate_on_start: true\n  key_pepper: {{ file: pepper }}\n  key_encryption_key: {{ file: enc }}\n",
        common::free_port(),
        common::free_port(),
        tls.replace("ca.pem", "other-ca.pem")
    );
    let (code, err) = serve_expecting_exit(&bad, &yaml);
    println!("store_tls: postgres with a wrong CA: {}", err.trim());
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("store postgres"), "{err}");
    assert!(err.contains("invalid peer certificate: UnknownIssuer"), "{err}");
    drop(pg);
    let _ = std::fs::remove_dir_all(&root);
}
