//! `check-config`: every problem with its file and path, and the chain as served.

#[test]
fn check_config_lists_every_problem_with_file_and_path() {
    let dir = std::env::temp_dir().join(format!("tollgate-badconf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("tollgate.yaml"),
        "listen: nowhere\nbudgets:\n  response_seconds: -1\nplans:\n  window_wait_seconds: 45\n  tiers:\n    pro: { five_hour_cents: 500, week_cents: 100, standby_day_cents: 10, plan_concurrency: 0, standby_concurrency: 1 }\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("models.yaml"),
        "models:\n  - id: a\n    supported_endpoints: [chat_completions, teleport]\n    pricing: { input: 0.123456789, output: 1 }\n",
    )
    .unwrap();
    std::fs::write(dir.join("upstreams.yaml"), "pools: {}\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tollgate.yaml: listen:"), "{err}");
    assert!(err.contains("tollgate.yaml: budgets.response_seconds:"), "{err}");
    assert!(err.contains("tollgate.yaml: plans.window_wait_seconds: must be 0..=30 seconds"), "{err}");
    assert!(err.contains("tollgate.yaml: plans.tiers.pro.plan_concurrency: must be 1..=10000, got 0"), "{err}");
    assert!(err.contains("tollgate.yaml: plans.tiers.pro.week_cents: must be at least five_hour_cents"), "{err}");

    // With the gateway file fixed, the catalog's problems are all listed together.
    std::fs::write(dir.join("tollgate.yaml"), "listen: 127.0.0.1:1\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("models.yaml: models[0].supported_endpoints[1]: `teleport`"), "{err}");
    assert!(err.contains("models.yaml: models[0].pricing.input: 0.123456789 has more than 8 decimal places"), "{err}");

    // Unknown fields are errors with their path, not silent defaults.
    std::fs::write(
        dir.join("models.yaml"),
        "models:\n  - id: a\n    supported_endpoints: [chat_completions]\n    pricng: {}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["serve", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "serve refuses a bad config");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("models.yaml: models[0].pricng:"), "{err}");
    assert!(err.contains("unknown field `pricng`"), "{err}");
}

#[test]
fn check_config_lists_the_chain_as_served() {
    let dir = std::env::temp_dir().join(format!("tollgate-okconf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("pepper"), "p".repeat(48)).unwrap();
    std::fs::write(dir.join("enc"), "ab".repeat(32)).unwrap();
    std::fs::write(
        dir.join("tollgate.yaml"),
        "listen: 127.0.0.1:1\nidentity:\n  store: { backend: sqlite, path: id.db }\n  key_pepper: { file: pepper }\n  key_encryption_key: { file: enc }\nplugins:\n  - name: billing\n  - name: chat_completions\n  - name: auth\n",
    )
    .unwrap();
    std::fs::write(dir.join("models.yaml"), "models:\n  - id: a\n    supported_endpoints: [chat_completions]\n")
        .unwrap();
    std::fs::write(
        dir.join("upstreams.yaml"),
        "pools:\n  a:\n    replicas:\n      - { address: \"127.0.0.1:2\", max_concurrency: 1 }\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .env_remove("TOLLGATE_ADMIN_TOKEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains(r#"plugins ["auth", "chat_completions", "billing"]"#),
        "in request order, stores or not: {text}"
    );
    assert!(!dir.join("id.db").exists(), "check-config opens no store");
    assert!(text.contains("warning: no admin token configured"), "an unusable admin listener is said: {text}");
    // A short token from the environment is blamed on the variable, not on a file.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check-config", "--config"])
        .arg(dir.join("tollgate.yaml"))
        .env("TOLLGATE_ADMIN_TOKEN", "short")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("TOLLGATE_ADMIN_TOKEN: the admin token in the environment variable must be at least 16"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
