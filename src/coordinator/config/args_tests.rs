//! `kvplane coordinator`'s flags through every layer: flags, `KVPLANE_COORDINATOR_*` twins,
//! LMCache's `LMCACHE_MP_COORDINATOR_*` variables, a settings file.

use super::*;
use crate::coordinator::CoordinatorConfig;
use crate::service::layers::Settings;
use std::collections::HashMap;
use std::time::Duration;

/// `argv` and the variables `env` through the coordinator's layers, validated; an error's
/// text names the flag.
fn parse_with(
    argv: &[&str],
    env: &[(&str, &str)],
    file: Option<&Settings>,
) -> Result<CoordinatorConfig, String> {
    let env: HashMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    let words: Vec<String> = argv.iter().map(|w| (*w).to_string()).collect();
    let (args, prov) = layers::parse_embedded::<CoordinatorArgs>(
        &layout(),
        &words,
        &|k: &str| env.get(k).cloned(),
        file,
    )
    .map_err(|e| e.0)?;
    args.validate().map_err(|e| prov.explain(&e.to_string()))
}

fn validate(argv: &[&str], env: &[(&str, &str)]) -> Result<CoordinatorConfig, String> {
    parse_with(argv, env, None)
}

#[test]
fn defaults_are_the_documented_ones() {
    let c = validate(&[], &[]).unwrap();
    assert_eq!((c.host.as_str(), c.port), ("0.0.0.0", 9300));
    assert_eq!(c.instance_timeout, Duration::from_secs(30));
    assert_eq!(c.health_check_interval, Some(Duration::from_secs(10)));
    assert_eq!(c.eviction_check_interval, Some(Duration::from_secs(5)));
    assert_eq!(
        (c.model.eviction_ratio, c.model.trigger_watermark),
        (0.2, 1.0)
    );
    assert_eq!(c.timeout_keep_alive, Duration::from_secs(10));
    assert_eq!(
        c.resync,
        Some(ResyncConfig {
            poll_interval: Duration::from_secs(1),
            max_wait: Duration::from_secs(60),
            page_size: 1000
        })
    );
    assert_eq!(c.http.max_body_bytes, 16 << 20);
    assert_eq!(c.http.max_body_items, 1 << 20);
    assert_eq!(c.http.max_connections, 16_384);
    assert_eq!(c.http.read_timeout, Duration::from_secs(30));
}

#[test]
fn http_limits_from_flags_and_both_variables() {
    let env = [
        ("LMCACHE_MP_COORDINATOR_MAX_BODY_BYTES", "2048"),
        ("KVPLANE_COORDINATOR_MAX_BODY_ITEMS", "64"),
        ("LMCACHE_MP_COORDINATOR_MAX_BODY_ITEMS", "65"),
        ("KVPLANE_COORDINATOR_HTTP_READ_TIMEOUT", "2.5"),
    ];
    let c = validate(&["--max-http-connections", "8"], &env).unwrap();
    assert_eq!(c.http.max_body_bytes, 2048);
    assert_eq!(c.http.max_body_items, 64);
    assert_eq!(c.http.max_connections, 8);
    assert_eq!(c.http.read_timeout, Duration::from_millis(2500));
}

#[test]
fn flag_then_kvplane_then_lmcache_variable() {
    let env = [
        ("LMCACHE_MP_COORDINATOR_PORT", "9400"),
        ("LMCACHE_MP_COORDINATOR_EVICTION_RATIO", "0.5"),
        ("KVPLANE_COORDINATOR_EVICTION_RATIO", "0.25"),
        ("LMCACHE_MP_COORDINATOR_INSTANCE_TIMEOUT", "12"),
        ("LMCACHE_MP_COORDINATOR_HEALTH_CHECK_INTERVAL", "0"),
        ("LMCACHE_MP_COORDINATOR_ENABLE_STARTUP_RESYNC", "False"),
        ("KVPLANE_COORDINATOR_RESYNC_PAGE_SIZE", "50"),
        ("KVPLANE_PORT", "1"),
    ];
    let c = validate(&["--instance-timeout", "7"], &env).unwrap();
    assert_eq!(c.port, 9400);
    assert_eq!(c.model.eviction_ratio, 0.25);
    assert_eq!(c.instance_timeout, Duration::from_secs(7));
    assert_eq!(c.health_check_interval, None);
    assert!(c.resync.is_none());
    let c = validate(&["--enable-startup-resync", "yes"], &env).unwrap();
    assert_eq!(c.resync.map(|r| r.page_size), Some(50));
    assert_eq!(c.metadata_path, None);
    let env = [("LMCACHE_MP_COORDINATOR_METADATA_PATH", "/var/lib/meta.json")];
    let c = validate(&[], &env).unwrap();
    assert_eq!(c.metadata_path, Some("/var/lib/meta.json".into()));
    let c = validate(&["--metadata-path", ""], &env).unwrap();
    assert_eq!(c.metadata_path, None);
}

#[test]
fn default_quota_is_unset_unless_given() {
    assert_eq!(validate(&[], &[]).unwrap().default_quota_gb, None);
    let c = validate(&["--default-quota-gb", "0"], &[]).unwrap();
    assert_eq!(c.default_quota_gb, Some(0.0));
    let env = [
        ("LMCACHE_MP_COORDINATOR_DEFAULT_QUOTA_GB", "3"),
        ("KVPLANE_COORDINATOR_DEFAULT_QUOTA_GB", "1.5"),
    ];
    assert_eq!(validate(&[], &env).unwrap().default_quota_gb, Some(1.5));
    let env = [("LMCACHE_MP_COORDINATOR_DEFAULT_QUOTA_GB", "null")];
    assert_eq!(validate(&[], &env).unwrap().default_quota_gb, None);
    for bad in ["-1", "x", "NaN", "inf", "1e300"] {
        let e = validate(&["--default-quota-gb", bad], &[]).unwrap_err();
        assert!(e.contains("--default-quota-gb"), "{e}");
    }
}

#[test]
fn bad_values_name_the_flag() {
    for (argv, flag) in [
        (&["--trigger-watermark", "0"][..], "--trigger-watermark"),
        (&["--eviction-ratio", "1.5"], "--eviction-ratio"),
        (&["--instance-timeout", "0"], "--instance-timeout"),
        (&["--port", "x"], "--port"),
        (
            &["--eviction-check-interval", "-1"],
            "--eviction-check-interval",
        ),
        (&["--timeout-keep-alive", "0"], "--timeout-keep-alive"),
        (&["--max-body-bytes", "0"], "--max-body-bytes"),
        (&["--max-body-items", "x"], "--max-body-items"),
        (&["--max-http-connections", "0"], "--max-http-connections"),
        (&["--http-read-timeout", "0"], "--http-read-timeout"),
    ] {
        let e = validate(argv, &[]).expect_err("invalid");
        assert!(e.contains(flag), "{e}");
    }
    let e = validate(&[], &[("LMCACHE_MP_COORDINATOR_TRIGGER_WATERMARK", "2")]).unwrap_err();
    assert!(e.starts_with("--trigger-watermark"), "{e}");
    assert!(
        e.contains("LMCACHE_MP_COORDINATOR_TRIGGER_WATERMARK"),
        "{e}"
    );
}

#[test]
fn defaults_match_056() {
    let c = validate(&[], &[]).unwrap();
    assert_eq!(c.chunk_size, 256);
    assert_eq!(c.blend_probe_stride, None);
    assert_eq!(c.checkpoint, None);
    assert!(c.features.eviction_controller && c.features.metrics);
}

#[test]
fn blend_flags_and_the_seeds_alias() {
    let c = validate(&["--blend-chunk-size", "16", "--enable-blend-lookup"], &[]).unwrap();
    assert_eq!((c.chunk_size, c.blend_probe_stride), (16, Some(1)));
    // --chunk-size (0.5.6's name) wins over the seed's alias.
    let c = validate(&["--chunk-size", "32", "--blend-chunk-size", "16"], &[]).unwrap();
    assert_eq!(c.chunk_size, 32);
    let env = [
        ("LMCACHE_MP_COORDINATOR_BLEND_CHUNK_SIZE", "64"),
        ("LMCACHE_MP_COORDINATOR_BLEND_PROBE_STRIDE", "4"),
        ("KVPLANE_COORDINATOR_ENABLE_BLEND_LOOKUP", "yes"),
    ];
    let c = validate(&[], &env).unwrap();
    assert_eq!((c.chunk_size, c.blend_probe_stride), (64, Some(4)));
    // The stride alone does not turn the index on.
    let c = validate(&["--blend-probe-stride", "2"], &[]).unwrap();
    assert_eq!(c.blend_probe_stride, None);
}

#[test]
fn checkpoint_flags() {
    let c = validate(&["--checkpoint-path", "/tmp/c.ckpt"], &[]).unwrap();
    let cp = c.checkpoint.unwrap();
    assert_eq!(cp.path, std::path::PathBuf::from("/tmp/c.ckpt"));
    assert_eq!(cp.interval, Some(Duration::from_secs(60)));
    let env = [
        ("LMCACHE_MP_COORDINATOR_CHECKPOINT_PATH", "/x"),
        ("KVPLANE_COORDINATOR_CHECKPOINT_INTERVAL", "0"),
    ];
    let c = validate(&[], &env).unwrap();
    assert_eq!(
        c.checkpoint.unwrap().interval,
        None,
        "0: only at a clean stop"
    );
    let c = validate(
        &["--checkpoint-path", "/x", "--checkpoint-interval", "2.5"],
        &[],
    )
    .unwrap();
    assert_eq!(
        c.checkpoint.unwrap().interval,
        Some(Duration::from_millis(2500))
    );
    let c = validate(&["--checkpoint-path", ""], &env).unwrap();
    assert_eq!(c.checkpoint, None);
}

#[test]
fn extra_config_and_metrics() {
    let c = validate(
        &[
            "--extra-config",
            r#"{"disabled_controllers": ["FleetEvictionController"]}"#,
        ],
        &[],
    )
    .unwrap();
    assert!(!c.features.eviction_controller);
    let c = validate(&["--extra-config", "{}", "--disable-metrics"], &[]).unwrap();
    assert!(c.features.eviction_controller && !c.features.metrics);
    let c = validate(&[], &[("LMCACHE_MP_COORDINATOR_DISABLE_METRICS", "1")]).unwrap();
    assert!(!c.features.metrics);
    let c = validate(
        &["--hash-algorithm", "blake3", "--event-transport", "http"],
        &[],
    )
    .unwrap();
    assert!(c.features.metrics);
}

#[test]
fn refusals_name_the_flag_and_the_alternative() {
    for (argv, env, flag, hint) in [
        (
            &["--hash-algorithm", "sha256_cbor"][..],
            &[][..],
            "--hash-algorithm",
            "blake3",
        ),
        (
            &[],
            &[("KVPLANE_COORDINATOR_HASH_ALGORITHM", "xxhash")][..],
            "--hash-algorithm",
            "blake3",
        ),
        (
            &["--otlp-endpoint", "http://otel:4317"],
            &[],
            "--otlp-endpoint",
            "GET /metrics",
        ),
        (
            &["--event-transport", "kafka"],
            &[],
            "--event-transport",
            "--coordinator-event-transport http",
        ),
        (
            &["--event-transport", "grpc"],
            &[],
            "--event-transport",
            "http, kafka",
        ),
        (
            &["--kafka-bootstrap-servers", "k:9092"],
            &[],
            "--kafka-bootstrap-servers",
            "POST /events",
        ),
        (
            &[],
            &[("LMCACHE_MP_COORDINATOR_KAFKA_TOPIC", "t")],
            "--kafka-topic",
            "POST /events",
        ),
        (
            &["--kafka-group-id", "g"],
            &[],
            "--kafka-group-id",
            "POST /events",
        ),
        (
            &["--extra-config", "[1]"],
            &[],
            "--extra-config",
            "JSON object",
        ),
        (&["--extra-config", "{"], &[], "--extra-config", "not JSON"),
        (
            &["--extra-config", r#"{"disabled_controllers": ["Nope"]}"#],
            &[],
            "--extra-config",
            "available",
        ),
        (
            &[
                "--extra-config",
                r#"{"disabled_controllers": "FleetEvictionController"}"#,
            ],
            &[],
            "--extra-config",
            "list of names",
        ),
        (
            &["--extra-config", r#"{"controller_packages": ["my.pkg"]}"#],
            &[],
            "--extra-config",
            "built in",
        ),
        (
            &["--checkpoint-path", "/x", "--checkpoint-interval", "-1"],
            &[],
            "--checkpoint-interval",
            "",
        ),
        (
            &["--checkpoint-interval", "x"],
            &[],
            "--checkpoint-interval",
            "invalid value",
        ),
        (
            &["--blend-probe-stride", "0"],
            &[],
            "--blend-probe-stride",
            "",
        ),
        (&["--blend-chunk-size", "0"], &[], "--blend-chunk-size", ""),
    ] {
        let e = validate(argv, env).expect_err("refused");
        assert!(e.contains(flag), "{argv:?}: {e}");
        assert!(e.contains(hint), "{argv:?}: {e}");
    }
}

fn settings(name: &str, yaml: &str) -> Settings {
    let dir = std::env::temp_dir().join(format!("kvplane-coordinator-args-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, yaml).unwrap();
    Settings::read(&path).unwrap()
}

#[test]
fn a_settings_file_by_flag_name_comes_after_the_variables() {
    let file = settings(
        "plain.yaml",
        "eviction_ratio: 0.5\nport: 9400\nenable-blend-lookup: true\nchunk_size: 64\n",
    );
    let env = [("KVPLANE_COORDINATOR_EVICTION_RATIO", "0.25")];
    let c = parse_with(&[], &env, Some(&file)).unwrap();
    assert_eq!(
        (c.port, c.model.eviction_ratio, c.chunk_size),
        (9400, 0.25, 64)
    );
    assert_eq!(c.blend_probe_stride, Some(1));
    let bad = settings("bad.yaml", "trigger_watermark: 3\n");
    let e = parse_with(&[], &[], Some(&bad)).unwrap_err();
    assert!(e.starts_with("--trigger-watermark"), "{e}");
    assert!(e.contains("bad.yaml (key trigger_watermark)"), "{e}");
    let unknown = settings("unknown.yaml", "eviction_ration: 0.1\n");
    let e = parse_with(&[], &[], Some(&unknown)).unwrap_err();
    assert!(e.contains("unknown key \"eviction_ration\""), "{e}");
    assert!(e.contains("eviction_ratio"), "{e}");
}

#[test]
fn embedded_in_serve_takes_serves_address_and_its_section() {
    let file = settings(
        "serve.yaml",
        "controller_port: 9000\ncoordinator:\n  eviction_ratio: 0.5\n  chunk_size: 16\n",
    );
    let section = file.section("coordinator").unwrap().expect("section");
    let env: HashMap<&str, &str> = [
        ("KVPLANE_COORDINATOR_CHUNK_SIZE", "8"),
        ("KVPLANE_COORDINATOR_PORT", "1"),
        ("LMCACHE_MP_COORDINATOR_HOST", "10.0.0.1"),
    ]
    .into();
    let env = |k: &str| env.get(k).map(|v| (*v).to_string());
    let c = embedded(&Embedded::new("127.0.0.1", 0, &env, Some(&section))).unwrap();
    assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 0));
    assert_eq!((c.model.eviction_ratio, c.chunk_size), (0.5, 8));
    let file = settings("serve-port.yaml", "coordinator:\n  port: 9400\n");
    let section = file.section("coordinator").unwrap().expect("section");
    let e = embedded(&Embedded::new("127.0.0.1", 0, &env, Some(&section)))
        .unwrap_err()
        .0;
    assert!(
        e.contains("key coordinator.port") && e.contains("--port"),
        "{e}"
    );
    let e = embedded(&Embedded::new(
        "127.0.0.1",
        0,
        &|k: &str| (k == "KVPLANE_COORDINATOR_CLUSTER").then(|| "nats://127.0.0.1:1".to_string()),
        None,
    ))
    .unwrap_err()
    .0;
    assert!(
        e.starts_with("--cluster") && e.contains("KVPLANE_COORDINATOR_CLUSTER"),
        "{e}"
    );
    let file = settings("serve-list.yaml", "coordinator: [1]\n");
    assert!(file.section("coordinator").is_err());
}
