//! The durable pin journal's cost per pinned submit: `PinStore::pin` on a `JournalPins` in a
//! temp directory, called as `proxy::submit` calls it (through `Arc<dyn PinStore>`, a fresh
//! numeric task id, `Instant::now()`, key names looked up in a `KeyRegistry` as `App` does),
//! next to `MemoryPins` alone. Measured twice: wall time, and the calling threads' own CPU
//! time (user + kernel, from `/proc/thread-self/schedstat`), which is what a pin costs the
//! proxy whatever else the machine runs. Run with `cargo bench --bench journal`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::measurement::{Measurement, ValueFormatter};
use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use keyrelay::captcha::TaskId;
use keyrelay::config::{KeyConfig, Upstream};
use keyrelay::key_id::KeyId;
use keyrelay::pins::{JournalPins, MemoryPins, PinStore};
use keyrelay::registry::KeyRegistry;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2 * 60 * 60);
const MAX_PINS: usize = 1_000_000;
/// CaptchaAI's task ids are 11-digit numbers.
const FIRST_TASK: u64 = 80_000_000_000;
const KEYS: u16 = 3;

/// A journal in a fresh temp directory, with key names resolved as `App::build` resolves
/// them: through the registry, on every pin.
fn journal(max_pins: usize) -> (Option<tempfile::TempDir>, Arc<dyn PinStore>) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let registry = Arc::new(KeyRegistry::new());
    let upstream = Upstream::parse("http://127.0.0.1:1").expect("a valid url");
    let keys: Vec<KeyConfig> = (0..KEYS)
        .map(|n| KeyConfig::new(&format!("key-{n}"), &format!("{n:0>32}"), upstream.clone()))
        .collect();
    registry.admit(&keys).expect("three keys fit");
    let names = Arc::clone(&registry);
    let key_name = Arc::new(move |id| names.get(id).map(|key| Arc::from(key.name.as_str())));
    let configured = |name: &str| registry.id_of(name);
    let (pins, _) = JournalPins::open(dir.path(), TTL, max_pins, &configured, key_name)
        .expect("the journal opens");
    (Some(dir), Arc::new(pins))
}

fn memory(max_pins: usize) -> (Option<tempfile::TempDir>, Arc<dyn PinStore>) {
    (None, Arc::new(MemoryPins::new(TTL, max_pins)))
}

/// Pins `n` fresh tasks from `first` on, as one submit after another would.
fn pin_many(pins: &dyn PinStore, first: u64, n: u64) {
    for task in first..first + n {
        let key = KeyId((task % u64::from(KEYS)) as u16);
        pins.pin(black_box(TaskId::Num(task)), key, Instant::now());
    }
}

/// Time on the CPU of the calling thread, in nanoseconds, user and kernel alike.
fn thread_cpu_ns() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat")
        .expect("/proc/thread-self/schedstat (Linux)");
    stat.split_whitespace()
        .next()
        .and_then(|ns| ns.parse().ok())
        .expect("schedstat starts with the time on CPU in ns")
}

/// Criterion's clock replaced by the thread's CPU time.
struct ThreadCpu;

impl Measurement for ThreadCpu {
    type Intermediate = u64;
    type Value = u64;

    fn start(&self) -> u64 {
        thread_cpu_ns()
    }

    fn end(&self, started: u64) -> u64 {
        thread_cpu_ns().saturating_sub(started)
    }

    fn add(&self, a: &u64, b: &u64) -> u64 {
        a + b
    }

    fn zero(&self) -> u64 {
        0
    }

    fn to_f64(&self, value: &u64) -> f64 {
        *value as f64
    }

    fn formatter(&self) -> &dyn ValueFormatter {
        &CpuNanos
    }
}

struct CpuNanos;

impl ValueFormatter for CpuNanos {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        let (factor, unit) = match typical {
            t if t < 1e3 => (1.0, "ns cpu"),
            t if t < 1e6 => (1e-3, "µs cpu"),
            _ => (1e-6, "ms cpu"),
        };
        values.iter_mut().for_each(|v| *v *= factor);
        unit
    }

    fn scale_throughputs(&self, _: f64, _: &Throughput, _: &mut [f64]) -> &'static str {
        "ns cpu"
    }

    fn scale_for_machines(&self, _: &mut [f64]) -> &'static str {
        "ns cpu"
    }
}

/// Table sizes the pins are measured at: a quiet proxy's, and the default cap of a million
/// (reached at 140 submits a second within the two-hour TTL), where every pin evicts one.
const TABLES: [(&str, usize); 2] = [("10k_pins", 10_000), ("1M_pins", MAX_PINS)];

fn wall(c: &mut Criterion) {
    let mut group = c.benchmark_group("pin_wall");
    for (table, cap) in TABLES {
        for (label, (_dir, pins)) in [("journal", journal(cap)), ("memory", memory(cap))] {
            let mut next = FIRST_TASK;
            group.bench_function(format!("{label}/{table}"), |b| {
                b.iter_custom(|iters| {
                    let started = std::time::Instant::now();
                    pin_many(&*pins, next, iters);
                    next += iters;
                    started.elapsed()
                })
            });
        }
    }
    group.finish();
}

/// CPU per pin with `threads` submits pinning at once, each on its own thread: the sum of
/// the threads' CPU time, scaled to `iters` pins.
fn cpu_across(pins: &Arc<dyn PinStore>, threads: u64, first: u64, iters: u64) -> u64 {
    let per_thread = iters.div_ceil(threads);
    let used: u64 = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let pins = Arc::clone(pins);
                scope.spawn(move || {
                    let started = thread_cpu_ns();
                    pin_many(&*pins, first + t * per_thread, per_thread);
                    thread_cpu_ns() - started
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a pinning thread"))
            .sum()
    });
    used * iters / (per_thread * threads)
}

fn cpu(c: &mut Criterion<ThreadCpu>) {
    let mut group = c.benchmark_group("pin_cpu");
    // Flat sampling: every sample runs long enough (a quarter second) that the scheduler's
    // per-tick accounting behind schedstat is a small, unbiased error.
    group.sampling_mode(SamplingMode::Flat).sample_size(20);
    for (table, cap) in TABLES {
        for (label, (_dir, pins)) in [("journal", journal(cap)), ("memory", memory(cap))] {
            let mut next = FIRST_TASK;
            group.bench_function(format!("{label}/{table}/1_thread"), |b| {
                b.iter_custom(|iters| {
                    let started = thread_cpu_ns();
                    pin_many(&*pins, next, iters);
                    next += iters;
                    thread_cpu_ns() - started
                })
            });
            if label == "memory" {
                continue;
            }
            for threads in [2, 4] {
                group.bench_function(format!("{label}/{table}/{threads}_threads"), |b| {
                    b.iter_custom(|iters| {
                        let used = cpu_across(&pins, threads, next, iters);
                        next += iters.div_ceil(threads) * threads;
                        used
                    })
                });
            }
        }
    }
    group.finish();
}

criterion_group!(
    name = wall_time;
    config = Criterion::default().measurement_time(Duration::from_secs(4));
    targets = wall
);
criterion_group!(
    name = cpu_time;
    config = Criterion::default()
        .with_measurement(ThreadCpu)
        .measurement_time(Duration::from_secs(5));
    targets = cpu
);
criterion_main!(wall_time, cpu_time);
