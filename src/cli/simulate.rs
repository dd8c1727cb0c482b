//! `keyrelay simulate`: the built-in simulator of CaptchaAI (and other providers, under
//! their own paths) on a real port, to try scripts without spending real threads.

use std::net::SocketAddr;

use anyhow::Context as _;
use keyrelay::sim::{SimKey, Simulator, DEFAULT_KEYS};
use tokio::net::TcpListener;

pub async fn simulate(
    listen: SocketAddr,
    keys: Vec<SimKey>,
    polls_to_ready: u32,
    providers: Vec<keyrelay::provider::Provider>,
) -> anyhow::Result<()> {
    use keyrelay::provider::Provider;
    let keys = if keys.is_empty() {
        DEFAULT_KEYS.iter().map(|k| SimKey::valid(k)).collect()
    } else {
        keys
    };
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    // The bound address, so that `--listen 127.0.0.1:0` says where the simulator is.
    let addr = listener.local_addr()?;
    let mut served = vec![Provider::CaptchaAi];
    for provider in providers {
        if !served.contains(&provider) {
            served.push(provider);
        }
    }
    let mut sims = Vec::new();
    for provider in served {
        let prefix = if provider == Provider::CaptchaAi {
            String::new()
        } else {
            format!("/{}", provider.name())
        };
        let label = if provider == Provider::CaptchaAi {
            "CaptchaAI".to_owned()
        } else {
            provider.name().to_owned()
        };
        println!("simulated {label} on http://{addr}{prefix} with keys:");
        let mut sim = Simulator::new()
            .polls_to_ready(polls_to_ready)
            .provider(provider);
        for key in &keys {
            println!(
                "  {}  balance {}  threads {}  {:?}",
                key.key, key.balance, key.threads, key.state
            );
            sim = sim.key(key.clone());
        }
        sims.push((prefix, sim));
    }
    Simulator::serve_many(sims, listener, keyrelay::server::shutdown_signal()).await?;
    Ok(())
}
