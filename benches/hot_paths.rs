//! Criterion micro-benchmarks of the pure functions on every request's path: parsing a
//! request and rewriting its key (each body encoding), reading a poll's action and id and
//! rewriting it with them, parsing and classifying an upstream
//! answer, and choosing a key in pools of 3 and 100. Run with `cargo bench --bench hot_paths`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use keyrelay::capacity::{Capacity, MemoryLoad};
use keyrelay::captcha::{classify, parse_reply, ParsedRequest, ResCommand, TaskCommand};
use keyrelay::config::{KeyConfig, Strategy, Upstream};
use keyrelay::health::MemoryHealth;
use keyrelay::key_id::KeyId;
use keyrelay::pool::{KeyEntry, KeyPool, Selection};
use rand::rngs::SmallRng;
use rand::SeedableRng;
use tokio::time::Instant;

const POOL_KEY: &str = "poolpoolpoolpoolpoolpoolpool0001";
const CALLER_KEY: &str = "callercallercallercallercaller99";

/// One request as a client sends it: (label, query, content type, body).
fn requests() -> Vec<(&'static str, Option<String>, Option<&'static str>, Bytes)> {
    let image = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg";
    let boundary = "----keyrelaybench";
    let file = vec![0x89u8; 10 * 1024];
    let mut multipart = Vec::new();
    for (name, value) in [("key", CALLER_KEY), ("method", "post"), ("json", "1")] {
        multipart.extend_from_slice(
            format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n")
                .as_bytes(),
        );
    }
    multipart.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"c.png\"\r\nContent-Type: image/png\r\n\r\n").as_bytes(),
    );
    multipart.extend_from_slice(&file);
    multipart.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    vec![
        (
            "get_query",
            Some(format!(
                "key={CALLER_KEY}&method=userrecaptcha&googlekey=6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-&pageurl=https://example.com/login&json=1"
            )),
            None,
            Bytes::new(),
        ),
        (
            "post_urlencoded",
            None,
            Some("application/x-www-form-urlencoded"),
            Bytes::from(format!(
                "key={CALLER_KEY}&method=base64&json=1&soft_id=4580&body={image}"
            )),
        ),
        (
            "post_multipart_10k",
            None,
            Some("multipart/form-data; boundary=----keyrelaybench"),
            Bytes::from(multipart),
        ),
        (
            "post_json",
            None,
            Some("application/json"),
            Bytes::from(format!(
                "{{\"key\":\"{CALLER_KEY}\",\"method\":\"base64\",\"json\":1,\"body\":\"{image}\"}}"
            )),
        ),
    ]
}

fn parse_and_rewrite(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse_and_rewrite");
    for (label, query, content_type, body) in requests() {
        group.bench_function(label, |b| {
            b.iter(|| {
                let parsed =
                    ParsedRequest::parse(query.as_deref(), content_type, black_box(body.clone()))
                        .expect("a valid request");
                black_box(parsed.rewrite(&[("key", POOL_KEY)]))
            })
        });
    }
    group.finish();
}

/// A `res.php` poll as clients send it: its params read and the request rewritten for the
/// upstream. `checked` is the path since issue 37: `action`, `id` and `ids` read strictly
/// (`ResCommand::of`) and sent as checked, `ids` dropped. `key_only` is the work the path did
/// before it, kept as the yardstick: the same params read PHP's way, the key alone
/// rewritten.
fn poll_read_and_rewrite(c: &mut Criterion) {
    let mut group = c.benchmark_group("poll_read_and_rewrite");
    let query = format!("key={CALLER_KEY}&action=get&id=73000000001&json=1");
    group.bench_function("checked", |b| {
        b.iter(|| {
            let parsed = ParsedRequest::parse(Some(black_box(&query)), None, Bytes::new())
                .expect("a valid request");
            let Ok(ResCommand::Task(TaskCommand::One { action, id })) = ResCommand::of(&parsed)
            else {
                unreachable!("a poll of one task")
            };
            let set = [("key", POOL_KEY), ("action", action.name()), ("id", &id)];
            black_box(parsed.rewrite_dropping(&set, &["ids"]))
        })
    });
    group.bench_function("key_only", |b| {
        b.iter(|| {
            let parsed = ParsedRequest::parse(Some(black_box(&query)), None, Bytes::new())
                .expect("a valid request");
            black_box((
                parsed.param("action"),
                parsed.param("ids"),
                parsed.param("id"),
            ));
            black_box(parsed.rewrite(&[("key", POOL_KEY)]))
        })
    });
    group.finish();
}

fn answers(c: &mut Criterion) {
    let mut group = c.benchmark_group("parse_and_classify_answer");
    let bodies: [(&str, &[u8]); 4] = [
        ("plain_ok", b"OK|73000000001"),
        ("json_ok", br#"{"status":1,"request":"73000000001"}"#),
        ("plain_error", b"ERROR_NO_SLOT_AVAILABLE"),
        (
            "json_token",
            br#"{"status":1,"request":"03AGdBq24PBCbwiDRaS_MJ7Z...","user_agent":"Mozilla/5.0"}"#,
        ),
    ];
    for (label, body) in bodies {
        group.bench_function(label, |b| {
            b.iter(|| {
                let reply = parse_reply(black_box(body));
                black_box(classify(200, &reply))
            })
        });
    }
    group.finish();
}

fn pool_of(size: usize, strategy: Strategy) -> KeyPool {
    let upstream = Upstream::parse("http://127.0.0.1:1").expect("a valid url");
    let keys = (0..size)
        .map(|i| {
            let mut config =
                KeyConfig::new(&format!("k{i}"), &format!("key-{i:028}"), upstream.clone());
            config.threads = Some(50);
            config.weight = 1.0 + (i % 3) as f64;
            let entry = KeyEntry::from_config(KeyId(i as u16), &config);
            entry.stats.set_balance(Some(10.0 + i as f64));
            Arc::new(entry)
        })
        .collect();
    KeyPool::new(
        keys,
        Arc::new(MemoryHealth::new()),
        Arc::new(Capacity::new(Box::new(MemoryLoad::new()))),
        Selection {
            strategy,
            min_balance: 0.01,
            slow_start: Duration::from_secs(30),
            prices: Default::default(),
        },
    )
}

fn selection(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    // tokio's Instant needs a runtime context for its clock.
    let _guard = runtime.enter();
    let mut group = c.benchmark_group("select_key");
    for size in [3, 100] {
        for strategy in [
            Strategy::Weighted,
            Strategy::LeastLoaded,
            Strategy::RoundRobin,
        ] {
            let pool = pool_of(size, strategy);
            let mut rng = SmallRng::seed_from_u64(1);
            group.bench_function(format!("{}/{size}_keys", strategy.label()), |b| {
                b.iter_batched(
                    Instant::now,
                    |now| {
                        let key = pool.candidates(&mut rng, now).next().expect("a key");
                        // Take and give back a thread, as a submit does.
                        drop(black_box(pool.hold(key)));
                    },
                    BatchSize::SmallInput,
                )
            });
        }
    }
    group.finish();
}

/// The background stale release scans every open task, every 5 s: its cost at the
/// benchmark's million unpolled tasks, when none is stale yet (the usual case).
fn stale_scan(c: &mut Criterion) {
    use keyrelay::capacity::LoadStore;
    use keyrelay::captcha::TaskId;
    let load = MemoryLoad::new();
    let now = Instant::now();
    for n in 0..1_000_000_u64 {
        load.try_hold(KeyId((n % 3) as u16), None);
        load.open(KeyId((n % 3) as u16), TaskId::Num(10_000_000_000 + n), now);
    }
    let long_ago = now.checked_sub(Duration::from_secs(3600)).unwrap_or(now);
    c.bench_function("stale release scan, 1M open tasks, none stale", |b| {
        b.iter(|| black_box(load.release_stale(black_box(long_ago))))
    });
}

/// The caller token check on every API request once tokens are configured: read the `key`
/// param as the service would, then one hash lookup, among 3 and 1,000 tokens; a wrong
/// token costs the same lookup. Beside `parse_and_rewrite/get_query`, it is the share of a
/// request the check adds (issue 13 §5).
fn token_check(c: &mut Criterion) {
    use keyrelay::config::TokenConfig;
    use keyrelay::tokens::{TokenCounters, TokenTable};
    use keyrelay::CallerToken;
    let upstream = Upstream::parse("http://127.0.0.1:1").expect("a valid url");
    let keys: Vec<KeyConfig> = (0..3)
        .map(|i| KeyConfig::new(&format!("k{i}"), &format!("key-{i:028}"), upstream.clone()))
        .collect();
    let query = |token: &str| {
        format!("key={token}&method=userrecaptcha&googlekey=6Le-wvkSAAAAAPBMRTvw0Q4Muexq9bi0DJwx_mJ-&pageurl=https://example.com/login&json=1")
    };
    let mut group = c.benchmark_group("token_check");
    for size in [3, 1000] {
        let tokens: Vec<TokenConfig> = (0..size)
            .map(|i| TokenConfig {
                name: format!("client-{i}"),
                token: CallerToken::new(format!("token-{i:026}")),
                keys: Some(vec!["k1".into()]),
                tiers: None,
                max_threads: Some(20),
                max_tunnels: keyrelay::config::DEFAULT_MAX_TUNNELS,
                budget: None,
            })
            .collect();
        let ids = (0..3).map(|i| KeyId(i as u16)).zip(&keys);
        let table = TokenTable::new(&tokens, ids, &TokenCounters::default());
        for (label, presented) in [
            ("right", format!("token-{:026}", size / 2)),
            ("wrong", format!("token-{:026}", size + 7)),
        ] {
            let parsed =
                ParsedRequest::parse(Some(&query(&presented)), None, Bytes::new()).expect("parses");
            group.bench_function(format!("{label}/{size}_tokens"), |b| {
                b.iter(|| {
                    let key = black_box(&parsed).param("key");
                    black_box(key.as_deref().and_then(|k| table.lookup(k)).is_some())
                })
            });
        }
    }
    group.finish();
}

criterion_group!(
    benches,
    parse_and_rewrite,
    poll_read_and_rewrite,
    answers,
    selection,
    stale_scan,
    token_check
);
criterion_main!(benches);
