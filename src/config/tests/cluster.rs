//! `[cluster]`: defaults, every rule with its message, and that a Redis password given in
//! the file or through `${VAR}` is never shown.

use super::*;

#[test]
fn no_cluster_table_is_a_single_instance() {
    assert!(parse(&one_key()).cluster.is_none());
}

#[test]
fn a_cluster_table_takes_the_documented_defaults() {
    let config = parse(&format!(
        "{}\n[cluster]\nredis = \"redis://127.0.0.1:6379/0\"\nreplica = \"kr-1\"\n",
        one_key()
    ));
    let cluster = config.cluster.expect("[cluster] parsed");
    assert_eq!(cluster.replica, "kr-1");
    assert_eq!(cluster.prefix, "keyrelay");
    assert_eq!(cluster.replica_timeout, Duration::from_secs(15));
    assert_eq!(cluster.timeout, Duration::from_millis(250));
    assert_eq!(cluster.sync_interval, Duration::from_millis(500));
}

#[test]
fn the_replica_defaults_to_a_name_redis_and_metrics_can_carry() {
    let config = parse(&format!(
        "{}\n[cluster]\nredis = \"redis://127.0.0.1:6379/0\"\n",
        one_key()
    ));
    let replica = config.cluster.expect("[cluster] parsed").replica;
    assert!(!replica.is_empty());
    assert!(replica
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')));
}

#[test]
fn each_cluster_rule_names_its_field() {
    let cases = [
        ("", "cluster.redis: missing; write redis = \"redis://127.0.0.1:6379/0\""),
        (
            "redis = \"http://127.0.0.1\"",
            "cluster.redis: http://127.0.0.1 must start with redis://, rediss:// or redis+unix://",
        ),
        (
            "redis = \"redis://h/0\"\nreplica = \"kr 1\"",
            "cluster.replica: may only contain A-Z, a-z, 0-9, '.', '_' and '-'",
        ),
        (
            "redis = \"redis://h/0\"\nprefix = \"\"",
            "cluster.prefix: must not be empty",
        ),
        (
            "redis = \"redis://h/0\"\nreplica_timeout = \"500ms\"",
            "cluster.replica_timeout: must be at least 1s",
        ),
        (
            "redis = \"redis://h/0\"\nsync_interval = \"5s\"",
            "cluster.sync_interval: must be at most 1s",
        ),
        (
            "redis = \"redis://h/0\"\ntimeout = 1",
            "cluster.timeout: write durations as a string with a unit, e.g. \"30s\" (got the integer 1)",
        ),
    ];
    for (table, want) in cases {
        assert_problem(&format!("{}\n[cluster]\n{table}\n", one_key()), want);
    }
}

#[test]
fn a_redis_password_is_never_shown() {
    let env = env_of(&[("REDIS_PASSWORD", "hunter2-secret")]);
    let config = parse_with(
        &format!(
            "{}\n[cluster]\nredis = \"redis://:${{REDIS_PASSWORD}}@10.0.0.5:6379/0\"\n",
            one_key()
        ),
        &env,
    );
    let cluster = config.cluster.expect("[cluster] parsed");
    assert_eq!(
        cluster.redis.expose(),
        "redis://:hunter2-secret@10.0.0.5:6379/0"
    );
    assert!(!format!("{cluster:?}").contains("hunter2"));
    let error = error_with(
        &format!(
            "{}\n[cluster]\nredis = \"http://:${{REDIS_PASSWORD}}@10.0.0.5\"\n",
            one_key()
        ),
        &env,
    );
    assert!(!error.to_string().contains("hunter2"), "{error}");
}
