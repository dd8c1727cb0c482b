//! Other providers' simulators, several under one listener, and a simulator that goes
//! down and comes back.

use super::*;

#[tokio::test]
async fn a_2captcha_sim_speaks_as_2captcha_does() {
    let sim = Simulator::new()
        .provider(Provider::TwoCaptcha)
        .key(SimKey {
            threads: 1,
            ..SimKey::valid(KEY_A)
        })
        .spawn()
        .await
        .unwrap();
    let client = TestClient::new(&sim);
    // CaptchaAI's own methods are no method here (and take no thread).
    for method in ["bls", "cloudflare_challenge"] {
        let answer = client
            .get(&format!("/in.php?key={KEY_A}&method={method}"))
            .await
            .body;
        assert_eq!(answer, "ERROR_NO_SUCH_METHOD", "{method}");
    }
    let submit = format!("/in.php?key={KEY_A}&method=userrecaptcha&googlekey=g&pageurl=p");
    let first = client.get(&submit).await.body;
    let id: u64 = first.strip_prefix("OK|").unwrap().parse().unwrap();
    assert!(id > FIRST_ID, "a range of its own: {id}");
    // Full: "no free slot", not CaptchaAI's ERROR_ZERO_BALANCE.
    assert_eq!(client.get(&submit).await.body, "ERROR_NO_SLOT_AVAILABLE");
    // No money: ERROR_ZERO_BALANCE.
    sim.set_balance(KEY_A, 0.0);
    assert_eq!(client.get(&submit).await.body, "ERROR_ZERO_BALANCE");
    sim.set_balance(KEY_A, 5.0);
    let threads = client
        .get(&format!("/res.php?key={KEY_A}&action=threadsinfo&json=1"))
        .await
        .body;
    assert!(threads.contains("ERROR_BAD_PARAMETERS"), "{threads}");
    sim.shutdown().await;
}

#[tokio::test]
async fn several_providers_share_a_listener_under_their_prefixes() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sims = vec![
        (String::new(), Simulator::new().key(SimKey::valid(KEY_A))),
        (
            "/2captcha".to_owned(),
            Simulator::new()
                .provider(Provider::TwoCaptcha)
                .key(SimKey::valid(KEY_A)),
        ),
    ];
    let server = tokio::spawn(Simulator::serve_many(sims, listener, async {
        let _ = stopped.await;
    }));
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let get = |path: String| {
        let client = client.clone();
        async move {
            let response = client
                .get(format!("http://{addr}{path}").parse().unwrap())
                .await
                .unwrap();
            let status = response.status().as_u16();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let threads = format!("/res.php?key={KEY_A}&action=threadsinfo&json=1");
    assert!(
        get(threads.clone()).await.1.contains("\"threads\""),
        "CaptchaAI at the root"
    );
    let (_, at_2captcha) = get(format!("/2captcha{threads}")).await;
    assert!(
        at_2captcha.contains("ERROR_BAD_PARAMETERS"),
        "{at_2captcha}"
    );
    // Separate accounts: a task of one is unknown to the other.
    let (_, made) = get(format!(
        "/2captcha/in.php?key={KEY_A}&method=userrecaptcha&googlekey=g&pageurl=p"
    ))
    .await;
    let id = made.strip_prefix("OK|").unwrap();
    let (_, there) = get(format!("/2captcha/res.php?key={KEY_A}&action=get&id={id}")).await;
    assert_eq!(there, "CAPCHA_NOT_READY");
    let (_, here) = get(format!("/res.php?key={KEY_A}&action=get&id={id}")).await;
    assert_eq!(here, "ERROR_WRONG_CAPTCHA_ID");
    assert_eq!(get("/nowhere/in.php".to_owned()).await.0, 404);
    let _ = stop.send(());
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_sim_that_goes_down_refuses_connections_and_comes_back_with_its_tasks() {
    let sim = Simulator::new()
        .key(SimKey::valid(KEY_A))
        .spawn()
        .await
        .unwrap();
    let client = TestClient::new(&sim);
    let made = client
        .get(&format!(
            "/in.php?key={KEY_A}&method=userrecaptcha&googlekey=g&pageurl=p"
        ))
        .await
        .body;
    let id = made.strip_prefix("OK|").unwrap().to_owned();
    sim.go_down().await;
    let refused = TcpStream::connect(sim.addr()).await;
    assert_eq!(
        refused.map(|_| ()).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionRefused)
    );
    sim.go_down().await; // twice is once
    sim.come_back().await.unwrap();
    sim.come_back().await.unwrap();
    let poll = TestClient::new(&sim)
        .get(&format!("/res.php?key={KEY_A}&action=get&id={id}"))
        .await
        .body;
    assert_eq!(poll, "CAPCHA_NOT_READY", "the same task, still open");
    sim.shutdown().await;
}
