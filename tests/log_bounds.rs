//! Log lines a hostile caller can cause are bounded: cut to a fixed length with the length
//! noted, and one line a minute per kind (or per destination), with a count of the ones
//! held back. In a test binary of its own: it installs the process's global log
//! subscriber to read the lines, which no other test may share.

mod common;

use common::logs::Logs;
use common::raw::*;
use common::*;

use keyrelay::CallerToken;

const TOKEN: &str = "client-token-0123456789abcdef012";
const ADMIN_TOKEN: &str = "admin-token-0123456789abcdef0123";

#[tokio::test]
async fn refused_admin_calls_and_destinations_cost_the_log_one_short_line_a_minute() {
    let logs = Logs::install();
    let sim = sim_with(&[KEY_A]).await;
    let mut config = config_for(&sim, &[("a", KEY_A, 1.0)]);
    config.forward.intercept = Some(vec!["ocr.captchaai.com".to_owned()]);
    config.admin.token = Some(CallerToken::new(ADMIN_TOKEN));
    config.access.tokens.push(caller_token("client", TOKEN));
    let h = Harness::start(sim, config).await;
    let before = logs.text().len();

    // 50 admin calls with a 60 kB path and no token.
    let path = format!("/admin/keys/{}/disable", "x".repeat(60_000));
    for _ in 0..50 {
        let (_, head, _) = exchange(
            h.addr,
            &format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    }
    // 50 tunnels to keyrelay's own port, refused, with a token.
    let auth = format!("Proxy-Authorization: Basic {}\r\n", basic("s", TOKEN));
    for _ in 0..50 {
        let target = h.addr.to_string();
        let (_, head, _) = exchange(
            h.addr,
            &format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n{auth}\r\n"),
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 403"), "{head}");
    }
    h.stop().await;

    let refused = logs.lines_with("admin call refused");
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert!(refused[0].len() < 1024, "{}", refused[0]);
    assert!(refused[0].contains("…(60020 bytes)"), "{}", refused[0]);
    let destinations = logs.lines_with("refused a destination");
    assert_eq!(destinations.len(), 1, "{destinations:?}");
    let added = logs.text().len() - before;
    assert!(added < 16 * 1024, "100 refusals added {added} bytes of log");
    assert!(!logs.text().contains(TOKEN) && !logs.text().contains(ADMIN_TOKEN));
}
