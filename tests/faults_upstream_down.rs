//! Fault injection: the upstream down (its port bound, every connection refused) and back,
//! under the fault tests' workload and script (`common/fault_script.rs`): recovered from
//! without a restart.

mod common;

use std::net::SocketAddr;
use std::sync::{Mutex, PoisonError};

use common::fault_script::*;
use common::*;
use keyrelay::config::Upstream;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

/// A TCP relay between keyrelay and the simulator that can take the upstream down. While
/// down, its port stays bound but does not listen: every connection is refused, as by a
/// stopped server, and no other socket can take the port before the upstream comes back.
/// (Pointing keyrelay at a freed port and binding it again later would race every other
/// test that binds ephemeral ports; a relay also keeps the simulator's handle and state.)
struct Gate {
    addr: SocketAddr,
    target: SocketAddr,
    state: Mutex<Option<GateState>>,
}

enum GateState {
    Up {
        stop: oneshot::Sender<()>,
        relay: JoinHandle<()>,
    },
    Down(TcpSocket),
}

impl Gate {
    /// A gate on an ephemeral port, up, relaying to `target`.
    fn open(target: SocketAddr) -> Gate {
        let socket = reserve(SocketAddr::from(([127, 0, 0, 1], 0))).expect("bind 127.0.0.1:0");
        let addr = socket.local_addr().expect("a bound socket has an address");
        let gate = Gate {
            addr,
            target,
            state: Mutex::new(Some(GateState::Down(socket))),
        };
        gate.up();
        gate
    }

    fn up(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(GateState::Down(socket)) = state.take() else {
            panic!("the gate is already up");
        };
        let listener = socket.listen(1024).expect("a bound socket can listen");
        let (stop, stopped) = oneshot::channel();
        let relay = tokio::spawn(relay(listener, self.target, stopped));
        *state = Some(GateState::Up { stop, relay });
    }

    /// Returns once the listener and every relayed connection are closed and the port is
    /// bound again without listening.
    async fn down(&self) {
        let taken = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(GateState::Up { stop, relay }) = taken else {
            panic!("the gate is already down");
        };
        // Fails only if the relay already ended, which the await below reports.
        let _ = stop.send(());
        relay.await.expect("the relay ends cleanly");
        let socket =
            reserve(self.addr).unwrap_or_else(|e| panic!("cannot bind {} again: {e}", self.addr));
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = Some(GateState::Down(socket));
    }
}

fn reserve(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = TcpSocket::new_v4()?;
    // Relayed connections the gate closed linger in TIME_WAIT on this port.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

async fn relay(listener: TcpListener, target: SocketAddr, mut stop: oneshot::Receiver<()>) {
    let mut pipes = JoinSet::new();
    loop {
        tokio::select! {
            // A dropped gate stops the relay too.
            _ = &mut stop => break,
            Some(_) = pipes.join_next(), if !pipes.is_empty() => {}
            accepted = listener.accept() => {
                if let Ok((inbound, _)) = accepted {
                    pipes.spawn(pipe(inbound, target));
                }
            }
        }
    }
    drop(listener);
    // Every relayed connection closes, as when a server goes down.
    pipes.shutdown().await;
}

async fn pipe(mut inbound: TcpStream, target: SocketAddr) {
    if let Ok(mut outbound) = TcpStream::connect(target).await {
        // Ends when either side closes; an error is one more way of closing.
        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
    }
}

#[tokio::test]
async fn the_upstream_down_then_back_is_recovered_from_without_a_restart() {
    let sim = roomy_sim().await;
    let gate = Gate::open(sim.addr());
    let mut config = pool_config(&sim);
    let upstream =
        Upstream::parse(&format!("http://{}", gate.addr)).expect("a loopback url is valid");
    for key in &mut config.keys {
        key.upstream = upstream.clone();
    }
    config.upstream = upstream;
    let h = Harness::start(sim, config).await;
    let report = run(
        &h,
        async {
            gate.down().await;
            let refused = TcpStream::connect(gate.addr).await.map(drop);
            assert_eq!(
                refused.map_err(|e| e.kind()),
                Err(std::io::ErrorKind::ConnectionRefused),
                "a down upstream refuses connections"
            );
        },
        async { gate.up() },
    )
    .await;
    // A refused connection never reached the upstream, and every key sits behind the gate's
    // one host:port, so the submit's walk ended there: one attempt, answered at once. A
    // request caught on a pooled connection that the gate had just closed may have arrived,
    // and is answered as such.
    assert_fault_answers(
        &report,
        &[
            Refusal::AllAttemptsFailed,
            Refusal::MayHaveArrived("no_answer"),
            Refusal::NoKeyInRotation,
        ],
    );
    for e in report
        .wholly_faulty()
        .filter(|e| e.json && Refusal::AllAttemptsFailed.matches(e))
    {
        assert_eq!(
            e.attempts_reported(),
            1,
            "a second key behind the gate: {e:?}"
        );
    }
    let metrics = h.metrics().await;
    assert!(errors(&metrics, "connect") >= 1.0, "{metrics}");
    assert!(
        errors(&metrics, "connect") + errors(&metrics, "no_answer")
            >= report.least_failed_attempts()
    );
    h.stop().await;
}
