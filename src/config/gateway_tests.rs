use std::time::Duration;

fn settings(billing: &str) -> Result<super::GatewaySettings, String> {
    let dir = std::env::temp_dir().join(format!("tollgate-gwcfg-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("tollgate.yaml");
    std::fs::write(
        &file,
        format!("listen: 127.0.0.1:1\nadmin_listen: 127.0.0.1:2\n{billing}plugins:\n  - name: chat_completions\n"),
    )
    .unwrap();
    let out = crate::config::load_settings(&file).map_err(|e| e.to_string());
    let _ = std::fs::remove_dir_all(&dir);
    out
}

#[test]
fn the_ledger_wait_bound_defaults_to_half_a_second_and_is_checked() {
    assert_eq!(settings("").unwrap().ledger_max_wait, Duration::from_millis(500));
    let s = settings("billing:\n  ledger_max_wait_ms: 750\n").unwrap();
    assert_eq!(s.ledger_max_wait, Duration::from_millis(750));
    let err = settings("billing:\n  ledger_max_wait_ms: 5\n").err().unwrap();
    assert!(err.contains("tollgate.yaml") && err.contains("billing.ledger_max_wait_ms"), "{err}");
}

#[test]
fn work_stealing_defaults_to_off_with_one_thread_and_on_with_several() {
    assert!(!settings("threads: 1\n").unwrap().work_stealing);
    assert!(settings("threads: 2\n").unwrap().work_stealing);
    assert!(settings("threads: 1\nwork_stealing: true\n").unwrap().work_stealing);
    assert!(!settings("threads: 4\nwork_stealing: false\n").unwrap().work_stealing);
    let err = settings("work_stealing: sometimes\n").err().unwrap();
    assert!(err.contains("tollgate.yaml") && err.contains("work_stealing"), "{err}");
}
