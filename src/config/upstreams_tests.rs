use super::*;

fn pool(model_id: &str, upstream: &str) -> Pool {
    Pool {
        model_id: model_id.into(),
        upstream_model: upstream.into(),
        replicas: Vec::new(),
        connect_timeout: Duration::from_millis(1),
        idle_connection: Duration::from_secs(4),
        busy_threshold_percent: 75,
        authorization: None,
        health_check: None,
        tls: None,
        eject_after_failures: 3,
        first_byte_timeout: Duration::from_secs(30),
    }
}

#[test]
fn the_model_name_is_renamed_both_ways_in_one_place() {
    let p = pool("llama-3.1-8b", "meta-llama/Llama-3.1-8B");
    assert_eq!(p.to_upstream(), "meta-llama/Llama-3.1-8B");
    assert_eq!(p.from_upstream("meta-llama/Llama-3.1-8B"), Some("llama-3.1-8b"));
    assert_eq!(p.from_upstream("something-else"), None, "another name is left as it is");
    let same = pool("m", "m");
    assert_eq!(same.from_upstream("m"), None, "nothing to change when the names agree");
}
