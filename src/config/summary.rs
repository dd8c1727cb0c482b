//! The human-readable description of a [`Config`] that `keyrelay check` prints: settings
//! first, then one table row per key. Keys show only their fingerprint.

use std::fmt::Write;

use humantime::format_duration;

use super::Config;

/// Column headers of the key table.
const HEADERS: [&str; 7] = [
    "name",
    "tier",
    "provider",
    "upstream",
    "weight",
    "threads",
    "fingerprint",
];

pub(super) fn render(config: &Config) -> String {
    let f = &config.failover;
    let t = &config.timeouts;
    let mut out = String::new();
    // Writing to a String cannot fail; the results are discarded on that ground.
    let _ = writeln!(
        out,
        "listen {}, upstream {}, refresh every {}",
        config.listen,
        config.upstream,
        format_duration(config.refresh_interval)
    );
    if let Some(ca) = &config.upstream_ca {
        let _ = writeln!(
            out,
            "upstream_ca {}: trusted for https upstreams beside the Mozilla roots",
            ca.display()
        );
    }
    if let Some(proxy) = &config.upstream_proxy {
        let _ = writeln!(
            out,
            "upstream_proxy {proxy}: every upstream connection, and every forward-proxy tunnel \
             or relay to another host, goes through it"
        );
        if !proxy.direct().is_empty() {
            let _ = writeln!(
                out,
                "upstream_no_proxy {}: dialled directly, not through upstream_proxy",
                proxy.direct().join(", ")
            );
        }
    }
    let _ = writeln!(
        out,
        "failover: max_attempts {}, retry_unsure_submits {}, min_balance {}, busy_cooldown {}, \
         transient_failures {}, transient_cooldown {}, backoff {} to {}",
        f.max_attempts,
        f.retry_unsure_submits,
        f.min_balance,
        format_duration(f.busy_cooldown),
        f.transient_failures,
        format_duration(f.transient_cooldown),
        format_duration(f.backoff_base),
        format_duration(f.backoff_max)
    );
    let _ = writeln!(
        out,
        "pins: ttl {}, max_pins {}; limits: max_body {} bytes; key_headers {}",
        format_duration(config.pins.ttl),
        config.pins.max_pins,
        config.limits.max_body,
        config.observability.key_headers
    );
    let _ = writeln!(
        out,
        "timeouts: connect {}, request {}, solve {}, refresh {}",
        format_duration(t.connect),
        format_duration(t.request),
        format_duration(t.solve),
        format_duration(t.refresh)
    );
    let c = &config.capacity;
    let _ = writeln!(
        out,
        "strategy {}; capacity: queue_timeout {}, max_queued {}, stale_after {}, slow_start {}",
        config.strategy,
        format_duration(c.queue_timeout),
        c.max_queued,
        format_duration(c.stale_after),
        format_duration(c.slow_start)
    );
    let polling = &config.polling;
    let _ = if polling.shapes() {
        let first = match polling.first {
            super::FirstPoll::Auto => "auto".to_owned(),
            super::FirstPoll::After(delay) => format_duration(delay).to_string(),
        };
        writeln!(
            out,
            "polling: interval {}, first {first}, keep_answers {} (at most {}), orphan_after {} \
             ({} polls a second)",
            format_duration(polling.interval),
            format_duration(polling.keep_answers),
            polling.keep_answers_max,
            format_duration(polling.orphan_after),
            polling.orphan_polls_per_second
        )
    } else {
        writeln!(
            out,
            "polling: interval 0s (every poll relayed), orphan_after {} ({} polls a second)",
            format_duration(polling.orphan_after),
            polling.orphan_polls_per_second
        )
    };
    let brake = config.scaling.brake_balance;
    let _ = writeln!(
        out,
        "scaling: brake_balance {brake}{}",
        // 0 is the default and switches the brake off: say so, as docs/scaling.md does.
        if brake == 0.0 { " (never brakes)" } else { "" }
    );
    if let Some(tls) = &config.tls {
        let cert = match &tls.files {
            Some(files) => format!("certificate {}", files.cert.display()),
            None => "certificate from the local CA".to_owned(),
        };
        let _ = writeln!(out, "tls: listen {}, {cert}", tls.listen);
    }
    let tokens: Vec<&str> = config
        .access
        .tokens
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    let _ = writeln!(
        out,
        "access: {}{}; admin: {}, {}",
        if tokens.is_empty() {
            "no tokens".to_owned()
        } else {
            format!("tokens {}", tokens.join(", "))
        },
        if config.access.open { ", open" } else { "" },
        config.admin.listen.map_or_else(
            || "on the proxy listeners".to_owned(),
            |a| format!("listen {a}")
        ),
        if config.admin.token.is_some() {
            "token set"
        } else {
            "no token"
        }
    );
    if let Some(cluster) = &config.cluster {
        let _ = writeln!(
            out,
            "cluster: replica {} on {} (prefix {}), replica_timeout {}",
            cluster.replica,
            cluster.redis,
            cluster.prefix,
            format_duration(cluster.replica_timeout)
        );
    }
    let count = config.keys.len();
    let _ = writeln!(out, "{count} key{}:", if count == 1 { "" } else { "s" });

    let rows: Vec<[String; 7]> = config
        .keys
        .iter()
        .map(|k| {
            [
                k.name.clone(),
                k.tier.to_string(),
                k.provider.name().to_owned(),
                k.upstream.to_string(),
                k.weight.to_string(),
                k.threads.map_or_else(|| "-".to_owned(), |n| n.to_string()),
                k.key.fingerprint(),
            ]
        })
        .collect();
    let mut widths = HEADERS.map(|h| h.chars().count());
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header = HEADERS.map(str::to_owned);
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::from("  ");
        for (i, (cell, width)) in row.iter().zip(widths).enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}
