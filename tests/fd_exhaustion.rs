//! Out of file descriptors, keyrelay keeps going: the real binary under `prlimit --nofile`
//! is flooded with connections until `accept` (or the dup after it) fails; an established connection is still
//! served, the failure is logged once (not once per failed accept), and once the flood
//! closes, accepting resumes; a limit too low for `limits.max_connections` is warned about
//! at start. Needs util-linux's `prlimit` (which `.ci/run` installs);
//! skipped without it outside CI.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::*;

const KEY: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaa0001";

fn has_prlimit() -> bool {
    Command::new("prlimit")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// One request on `stream`, kept alive; the status code.
fn get(stream: &mut TcpStream, path: &str) -> std::io::Result<u16> {
    stream.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())?;
    let mut buf = [0u8; 1024];
    let n = stream.read(&mut buf)?;
    let head = String::from_utf8_lossy(&buf[..n]);
    head.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no status in {head:?}")))
}

/// The two log lines a descriptor shortage can cause, one per place that meets it.
const SHORTAGE: [&str; 2] = ["accept failed", "cannot set up the connection"];

fn is_shortage(line: &str) -> bool {
    SHORTAGE.iter().any(|kind| line.contains(kind)) && line.contains("os error 24")
}

fn connect(addr: &str) -> TcpStream {
    let stream = TcpStream::connect(addr).expect("the kernel completes the handshake");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

#[test]
fn running_out_of_descriptors_neither_hangs_the_listener_nor_breaks_connections() {
    if !has_prlimit() {
        assert!(
            std::env::var_os("CI").is_none(),
            "prlimit is missing on CI: .ci/run installs util-linux"
        );
        eprintln!("no prlimit here; skipped");
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let sim = runtime.block_on(sim_with(&[KEY]));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.toml");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nupstream = \"{}\"\n[pins]\ndurable = false\n\
             [[keys]]\nname = \"a\"\nkey = \"{KEY}\"\n",
            sim.url()
        ),
    )
    .unwrap();
    let mut command = Command::new("prlimit");
    command
        .arg("--nofile=64:64")
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_keyrelay"))
        .arg("--config")
        .arg(&config)
        .arg("--threads")
        .arg("1");
    let mut proxy = Binary::start(command);
    let addr = proxy.wait_for_addr();
    // 64 descriptors cannot serve the default 4,096 connections: said at start.
    let warning = proxy.wait_for_line("the descriptor warning", |l| l.contains("open-file limit"));
    assert!(warning.contains("open_files=64"), "{warning}");

    let mut established = connect(&addr);
    assert_eq!(get(&mut established, "/healthz").unwrap(), 200);
    // Far more connections than descriptors: the kernel queues those keyrelay cannot take.
    let flood: Vec<TcpStream> = (0..120).map(|_| connect(&addr)).collect();
    // Which call meets the limit first, `accept` or the dup that watches for hangups,
    // depends on timing; either is the descriptor shortage, logged.
    proxy.wait_for_line("the descriptor shortage", is_shortage);
    assert_eq!(
        get(&mut established, "/healthz").unwrap(),
        200,
        "an established connection is still served"
    );
    drop(flood);
    // Accepting resumes once descriptors are free: a new connection is served.
    let mut served = false;
    for _ in 0..200 {
        let mut fresh = connect(&addr);
        if get(&mut fresh, "/healthz").ok() == Some(200) {
            served = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        served,
        "a new connection was never served; log:\n{}",
        proxy.log
    );
    let log = proxy.stop();
    for kind in SHORTAGE {
        let failures = log.lines().filter(|l| l.contains(kind)).count();
        assert!(
            failures <= 1,
            "{kind:?} logged once a minute, not per accept:\n{log}"
        );
    }
    runtime.block_on(sim.shutdown());
}
