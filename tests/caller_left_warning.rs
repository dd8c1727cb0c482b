//! A request whose caller left before the answer says so in a warning, without a key, once
//! a minute per kind. In a test binary of its own: it installs the process's global log
//! subscriber to read the lines, which no other test may share.

mod common;

use std::time::Duration;

use common::logs::Logs;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn warnings(logs: &Logs) -> Vec<String> {
    logs.lines_with("the caller left before the answer")
        .into_iter()
        .filter(|l| l.contains("WARN"))
        .collect()
}

#[tokio::test]
async fn a_caller_that_left_or_half_closed_is_named_in_a_warning() {
    let logs = Logs::install();
    let sim = sim_with(&[KEY_A]).await;
    let config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    let h = Harness::start(sim, config).await;
    let host = h.addr.to_string();
    let submit = format!(
        "GET /in.php?key={CALLER_KEY}&method=userrecaptcha&googlekey=g&pageurl=https://x.test HTTP/1.1\r\n\
         Host: {host}\r\n\r\n"
    );

    // Gone: the request and the close leave together, and the upstream answers later.
    delay_next_submit(&h.sim, KEY_A, Duration::from_millis(50));
    send_and_leave(h.addr, &submit, Leave::Close).await;
    eventually("a warning for the departed caller", || {
        warnings(&logs).len() == 1
    })
    .await;

    // Half-closed: it still reads its answer.
    let mut stream = TcpStream::connect(h.addr).await.expect("connect");
    stream.write_all(submit.as_bytes()).await.expect("write");
    stream.shutdown().await.expect("half-close");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("read");
    assert!(String::from_utf8_lossy(&answer).contains("OK|"));

    // Reset: the connection fails under the request, which is finished all the same.
    delay_next_submit(&h.sim, KEY_A, Duration::from_millis(50));
    send_and_leave(h.addr, &submit, Leave::Reset).await;
    let app = h.app.clone();
    eventually("every departed caller's task pinned", || {
        app.pins().len() == 3
    })
    .await;

    // A caller that waits draws no warning.
    h.submit().await;
    h.stop().await;
    // The later two were of the first one's kind within the minute: held back, so that a
    // caller leaving on purpose cannot fill the log (the next line would count them).
    let warnings = warnings(&logs);
    assert_eq!(warnings.len(), 1, "{}", logs.text());
    let line = &warnings[0];
    assert!(line.contains("endpoint=\"in\""), "{line}");
    assert!(line.contains("outcome=\"success\""), "{line}");
    assert!(line.contains("held_back=0"), "{line}");
    let text = logs.text();
    assert!(
        !text.contains(KEY_A) && !text.contains(CALLER_KEY),
        "{text}"
    );
}
