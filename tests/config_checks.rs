//! Operator mistakes in the three YAML files, through the real binary: each is a problem
//! naming its file and field (never a start that half works), and what is valid but likely
//! not meant is a warning (decision 174).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MODELS: &str =
    "models:\n  - id: m\n    supported_endpoints: [chat_completions]\n    pricing: { input: 1, output: 2 }\n";
const UPSTREAMS: &str = "pools:\n  m:\n    replicas:\n      - { address: \"127.0.0.1:2\", max_concurrency: 1 }\n";

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tollgate-cfg-{name}-{}-{}", std::process::id(), common::free_port()));
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("models.yaml"), MODELS).unwrap();
    std::fs::write(d.join("upstreams.yaml"), UPSTREAMS).unwrap();
    std::fs::write(d.join("pepper"), "p".repeat(48)).unwrap();
    std::fs::write(d.join("enc"), "ab".repeat(32)).unwrap();
    d
}

fn good_gateway() -> String {
    let (a, b) = (common::free_port(), common::free_port());
    format!("listen: 127.0.0.1:{a}\nadmin_listen: 127.0.0.1:{b}\nplugins:\n  - name: chat_completions\n")
}

/// `check-config` on `d`: (passed, stdout + stderr).
fn check(d: &Path) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(d.join("tollgate.yaml"))
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn each_mistake_is_a_problem_naming_its_file_and_field() {
    let token = |d: &Path| std::fs::write(d.join("token"), "aaaaaaaaaaaaaaaaaaaa\nbbbbbbbbbbbbbbbbbbbb\n").unwrap();
    let (a, b) = (common::free_port(), common::free_port());
    // (tollgate.yaml or None for the good one, upstreams.yaml or None, what the problem says)
    let cases: Vec<(Option<String>, Option<&str>, String)> = vec![
        (Some("# nothing here\n".into()), None, "tollgate.yaml: .: the file is empty".into()),
        (Some("{}\n".into()), None, "tollgate.yaml: .: the file is empty".into()),
        (Some("~\n".into()), None, "tollgate.yaml: .: the file is empty".into()),
        (
            Some(format!("listen: 127.0.0.1:{a}\nadmin_listen: 127.0.0.1:{a}\nplugins: []\n")),
            None,
            format!("tollgate.yaml: admin_listen: `127.0.0.1:{a}` takes the port of `listen`"),
        ),
        (
            Some(format!("listen: 0.0.0.0:{a}\nadmin_listen: 127.0.0.1:{a}\nplugins: []\n")),
            None,
            "tollgate.yaml: admin_listen:".into(),
        ),
        (
            Some(format!(
                "listen: 127.0.0.1:{a}\nadmin_listen: 127.0.0.1:{b}\nshutdown:\n  grace_period_seconds: 18446744073709551615\nplugins: []\n"
            )),
            None,
            "tollgate.yaml: shutdown.grace_period_seconds: must be at most 86400".into(),
        ),
        (
            Some(format!(
                "listen: 127.0.0.1:{a}\nadmin_listen: 127.0.0.1:{b}\nplugins:\n  - name: chat_completions\n    settings: {{ rpm: 5 }}\n"
            )),
            None,
            "tollgate.yaml: plugins[0].settings:".into(),
        ),
        (
            Some(format!(
                "listen: 127.0.0.1:{a}\nadmin_listen: 127.0.0.1:{b}\nadmin:\n  token_file: token\nplugins: []\n"
            )),
            None,
            "tollgate.yaml: admin.token_file: the admin token must be one line".into(),
        ),
        (
            None,
            Some(
                "pools:\n  m:\n    replicas:\n      - { address: \"127.0.0.1:2\", max_concurrency: 1 }\n  m:\n    replicas:\n      - { address: \"127.0.0.1:3\", max_concurrency: 1 }\n",
            ),
            "`m` is listed twice".into(),
        ),
        (
            None,
            Some(
                "pools:\n  m:\n    replicas:\n      - { address: \"127.0.0.1:2\", max_concurrency: 1 }\n      - { address: \"127.0.0.1:2\", max_concurrency: 1 }\n",
            ),
            "upstreams.yaml: pools.m.replicas[1].address: `127.0.0.1:2` is listed twice".into(),
        ),
        (
            None,
            Some("pools:\n  m:\n    replicas:\n      - { address: \"127.0.0.1:0\", max_concurrency: 1 }\n"),
            "upstreams.yaml: pools.m.replicas[0].address: `127.0.0.1:0` has port 0".into(),
        ),
        (
            None,
            Some(
                "pools:\n  m:\n    upstream_model: \"\"\n    replicas:\n      - { address: \"127.0.0.1:2\", max_concurrency: 1 }\n",
            ),
            "upstreams.yaml: pools.m.upstream_model: must be 1 to 256 characters".into(),
        ),
        (
            None,
            Some(
                "pools:\n  m:\n    idle_connection_ms: 0\n    replicas:\n      - { address: \"127.0.0.1:2\", max_concurrency: 1 }\n",
            ),
            "upstreams.yaml: pools.m.idle_connection_ms: must be 100..=300000".into(),
        ),
    ];
    for (gateway, upstreams, problem) in cases {
        let d = dir("case");
        token(&d);
        std::fs::write(d.join("tollgate.yaml"), gateway.unwrap_or_else(good_gateway)).unwrap();
        if let Some(u) = upstreams {
            std::fs::write(d.join("upstreams.yaml"), u).unwrap();
        }
        let (ok, text) = check(&d);
        assert!(!ok && text.contains(&problem), "want `{problem}`, got: {text}");
        assert!(!text.contains("panicked"), "{text}");
        let _ = std::fs::remove_dir_all(&d);
    }
    // The good files pass.
    let d = dir("good");
    std::fs::write(d.join("tollgate.yaml"), good_gateway()).unwrap();
    let (ok, text) = check(&d);
    assert!(ok, "{text}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn valid_but_likely_unmeant_settings_are_warned_about() {
    let d = dir("warn");
    let (a, b) = (common::free_port(), common::free_port());
    std::fs::write(
        d.join("tollgate.yaml"),
        format!(
            "listen: 127.0.0.1:{a}\nadmin_listen: 127.0.0.1:{b}\nidentity:\n  store: {{ backend: sqlite, path: id.db }}\n  key_pepper: {{ file: pepper }}\n  key_encryption_key: {{ file: enc }}\nplugins:\n  - name: auth\n  - name: chat_completions\n  - name: billing\n"
        ),
    )
    .unwrap();
    std::fs::write(
        d.join("models.yaml"),
        format!("{MODELS}  - id: free\n    supported_endpoints: [chat_completions]\n"),
    )
    .unwrap();
    std::fs::write(
        d.join("upstreams.yaml"),
        format!("{UPSTREAMS}  free:\n    replicas:\n      - {{ address: \"127.0.0.1:3\", max_concurrency: 1 }}\n"),
    )
    .unwrap();
    let (ok, text) = check(&d);
    assert!(ok, "warnings do not fail the check: {text}");
    assert!(text.contains("warning: ") && text.contains("model `free` has no `pricing`"), "{text}");
    assert!(!text.contains("model `m` has no"), "a priced model is not warned about: {text}");
    assert!(text.contains("warning: no admin token configured"), "{text}");
    assert!(!text.contains("has no `auth`"), "{text}");
    // Without `auth` every caller is served.
    std::fs::write(d.join("tollgate.yaml"), good_gateway()).unwrap();
    let (_, text) = check(&d);
    assert!(text.contains("warning: the plugin chain has no `auth`"), "{text}");
    assert!(!text.contains("no `pricing`"), "nothing is billed without `billing`: {text}");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_listener_that_cannot_bind_ends_the_start_with_its_field_named() {
    let d = dir("bind");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let admin = common::free_port();
    std::fs::write(
        d.join("tollgate.yaml"),
        format!("listen: 127.0.0.1:{port}\nadmin_listen: 127.0.0.1:{admin}\nplugins:\n  - name: chat_completions\n"),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config"])
        .arg(d.join("tollgate.yaml"))
        .env("TMPDIR", &d)
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(d.join("log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("still running with its public port taken: {}", std::fs::read_to_string(d.join("log")).unwrap());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let log = std::fs::read_to_string(d.join("log")).unwrap();
    assert!(!status.success(), "{log}");
    assert!(log.contains(&format!("listen: 127.0.0.1:{port} cannot be bound")), "{log}");
    drop(taken);
    let _ = std::fs::remove_dir_all(&d);
}

/// Port 0 on both listeners: each start picks free ports and prints them, so two instances of
/// one file serve side by side; the admin command line, which cannot know the port, says so.
#[test]
fn port_0_picks_free_ports_that_serve_prints_and_the_admin_command_line_asks_for_the_url() {
    let d = dir("port0");
    let yaml = "listen: 127.0.0.1:0\nadmin_listen: 127.0.0.1:0\nplugins:\n  - name: chat_completions\n";
    std::fs::write(d.join("tollgate.yaml"), yaml).unwrap();
    let start = |n: usize| {
        let child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["serve", "--config"])
            .arg(d.join("tollgate.yaml"))
            .env("TMPDIR", &d)
            .stdout(std::fs::File::create(d.join(format!("out{n}"))).unwrap())
            .stderr(std::fs::File::create(d.join(format!("log{n}"))).unwrap())
            .spawn()
            .unwrap();
        let mut proc = common::Proc::new(child);
        let ports = common::await_reported_ports(&d.join(format!("out{n}")), &mut proc, &d.join(format!("log{n}")));
        (proc, ports)
    };
    let (_one, (public1, admin1)) = start(1);
    let (_two, (public2, admin2)) = start(2);
    let ports = [public1, admin1, public2, admin2];
    assert!(ports.iter().all(|p| *p != 0), "{ports:?}");
    assert_eq!(std::collections::HashSet::from(ports).len(), 4, "four different ports: {ports:?}");
    for port in ports {
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nothing listens on the printed port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_err(), "{port} is the instance's alone");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["admin", "--config"])
        .arg(d.join("tollgate.yaml"))
        .args(["--token", "t", "workspace", "list"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("admin_listen: 127.0.0.1:0 has port 0: pass --url"), "{text}");
    // An upgrade takes over named ports only.
    let out = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--upgrade", "--config"])
        .arg(d.join("tollgate.yaml"))
        .env("TMPDIR", &d)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && text.contains("listen: 127.0.0.1:0 has port 0: an upgrade"), "{text}");
    drop((_one, _two));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn settings_that_contradict_each_other_are_problems() {
    let bad_models = [
        (
            "models:\n  - id: m\n    supported_endpoints: [chat_completions]\n    max_output_tokens: 65536\n    context_window: 32768\n",
            "models.yaml: models[0].max_output_tokens: 65536 is above context_window (32768)",
        ),
        (
            "models:\n  - id: m\n    supported_endpoints: [chat_completions]\n    reasoning_efforts: [low, low]\n",
            "models.yaml: models[0].reasoning_efforts[1]: `low` is listed twice",
        ),
    ];
    for (models, problem) in bad_models {
        let d = dir("models");
        std::fs::write(d.join("tollgate.yaml"), good_gateway()).unwrap();
        std::fs::write(d.join("models.yaml"), models).unwrap();
        let (ok, text) = check(&d);
        assert!(!ok && text.contains(problem), "want `{problem}`, got: {text}");
        let _ = std::fs::remove_dir_all(&d);
    }
    let d = dir("budgets");
    std::fs::write(d.join("tollgate.yaml"), format!("{}budgets:\n  first_token_seconds: 800\n", good_gateway()))
        .unwrap();
    let (ok, text) = check(&d);
    assert!(
        !ok && text.contains("tollgate.yaml: budgets.first_token_seconds: is above budgets.response_seconds"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&d);
}
