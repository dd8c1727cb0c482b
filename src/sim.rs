//! The built-in CaptchaAI simulator: an in-process fake of `in.php`, `res.php` and `solve.php`
//! used as the proxy's upstream in integration tests, by benchmarks, `keyrelay demo` and
//! `keyrelay simulate`. It can play the other 2captcha-compatible services too
//! ([`Simulator::provider`]), several on one listener under path prefixes, and go down and
//! come back ([`SimHandle::go_down`]) for outage tests. Owns the builder, the handle and the serve loop; it does not share any
//! protocol code with the proxy (`crate::captcha`), so each checks the other.
//!
//! Behaviour, in the order a request meets it (facts from `docs/captcha-api.md` §1–§4):
//! - Parameters come from the query and the body (urlencoded, multipart, JSON, or JSON sent as
//!   `text/plain`), merged PHP-style: the body wins. `json=1` (or `true`) selects JSON answers.
//!   API errors are HTTP 200 with the code as body, as the real service does.
//! - The first [`Fault`] matching the key (or `"*"`) and the endpoint fires.
//! - A malformed body answers `ERROR_BAD_PARAMETERS`; then the key is checked
//!   (`ERROR_WRONG_USER_KEY` / `ERROR_KEY_DOES_NOT_EXIST` / `ERROR_IP_NOT_ALLOWED`).
//! - `in.php` checks balance, then a free thread (the busy code), then parameters; an accepted
//!   task costs `cost`, takes a thread until its final answer, and gets an id from a counter
//!   starting at 73 000 000 001. `solve.php` does the same and answers once solved.
//! - `res.php` answers `get` (also `ids=`), `get2`, reports, `getbalance`, `threadsinfo` and the
//!   pingback actions; a task polled by another key is `ERROR_WRONG_CAPTCHA_ID`.
//!
//! Layout: `state` (keys, tasks, request log), `faults`, `wire` (parsing), `api` (endpoints).

mod api;
mod faults;
mod state;
mod wire;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tracing::debug;

pub use crate::provider::Provider;
pub use faults::{Fault, FaultKind, FaultTarget};
pub use state::{SimKey, SimKeyState};
pub use wire::{Received, ReceivedFile};

use api::Routes;
use state::State;

/// Default keys served when no key is configured (also used by the shipped `proxy.toml`).
pub const DEFAULT_KEYS: [&str; 2] = [
    "simkey-valid-0000000000000000001",
    "simkey-valid-0000000000000000002",
];

/// Polls before an answer by default: one `CAPCHA_NOT_READY`, then the answer, so every
/// client sees the not-ready path at least once.
const DEFAULT_POLLS_TO_READY: u32 = 2;
/// What a full key answers by default: CaptchaAI's error documentation says "no available
/// threads" is `ERROR_ZERO_BALANCE`, and the official SDK acts on that code.
const DEFAULT_BUSY_CODE: &str = "ERROR_ZERO_BALANCE";
/// What a full key answers at the pay-per-task services (2captcha's "no free slot").
const PAY_PER_TASK_BUSY_CODE: &str = "ERROR_NO_SLOT_AVAILABLE";
/// Pause after a failed `accept` (out of file descriptors, say) before trying again.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);

/// Builder for a simulator.
pub struct Simulator {
    keys: Vec<SimKey>,
    polls_to_ready: u32,
    solve_time: Option<(Duration, Duration)>,
    /// `None`: the provider's own.
    busy_code: Option<String>,
    provider: Provider,
}

impl Default for Simulator {
    fn default() -> Simulator {
        Simulator::new()
    }
}

impl Simulator {
    /// A simulator with no keys, answering after 2 polls, busy code `ERROR_ZERO_BALANCE`.
    pub fn new() -> Simulator {
        Simulator {
            keys: Vec::new(),
            polls_to_ready: DEFAULT_POLLS_TO_READY,
            solve_time: None,
            busy_code: None,
            provider: Provider::CaptchaAi,
        }
    }

    /// Plays `provider` (CaptchaAI by default), by the simulator's own reading of how each
    /// service differs: a full key answers `ERROR_NO_SLOT_AVAILABLE` at the pay-per-task
    /// services (whose `ERROR_ZERO_BALANCE` means only "no money"), `threadsinfo` is
    /// CaptchaAI's alone, CaptchaAI's own methods (`bls`, `cloudflare_challenge`) are
    /// `ERROR_NO_SUCH_METHOD` elsewhere, and each service's task ids are a range of their
    /// own.
    pub fn provider(mut self, provider: Provider) -> Simulator {
        self.provider = provider;
        self
    }

    /// Registers a key (a later key with the same value replaces an earlier one).
    pub fn key(mut self, key: SimKey) -> Simulator {
        self.keys.push(key);
        self
    }

    /// Polls 1..n-1 of a task answer `CAPCHA_NOT_READY`, poll n the answer (0 and 1 both mean
    /// "ready at the first poll").
    pub fn polls_to_ready(mut self, n: u32) -> Simulator {
        self.polls_to_ready = n;
        self
    }

    /// Tasks take between `min` and `max` to solve, each its own time spread evenly over
    /// the range by its id: polls before it answer `CAPCHA_NOT_READY`, as a real service's
    /// do while a worker solves. Without it a task is ready by polls alone.
    pub fn solve_time(mut self, min: Duration, max: Duration) -> Simulator {
        self.solve_time = Some((min, max.max(min)));
        self
    }

    /// Code answered when a valid key has no free thread. Default `ERROR_ZERO_BALANCE`
    /// (CaptchaAI's error documentation); `ERROR_NO_SLOT_AVAILABLE` is the blog's variant.
    pub fn busy_code(mut self, code: &str) -> Simulator {
        self.busy_code = Some(code.to_owned());
        self
    }

    fn into_state(self) -> Arc<State> {
        let busy_code = self.busy_code.unwrap_or_else(|| {
            if self.provider == Provider::CaptchaAi {
                DEFAULT_BUSY_CODE.to_owned()
            } else {
                PAY_PER_TASK_BUSY_CODE.to_owned()
            }
        });
        Arc::new(
            State::new(self.keys, self.polls_to_ready, busy_code, self.provider)
                .with_solve_time(self.solve_time),
        )
    }

    /// Binds `127.0.0.1:0` and serves in a background task until [`SimHandle::shutdown`].
    ///
    /// # Errors
    /// When the listener cannot be bound.
    pub async fn spawn(self) -> io::Result<SimHandle> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let state = self.into_state();
        let running = Running::start(Arc::clone(&state), listener);
        Ok(SimHandle(Arc::new(HandleInner {
            addr,
            state,
            running: tokio::sync::Mutex::new(Some(running)),
        })))
    }

    /// Serves on an already-bound listener until `shutdown` resolves (for the CLI), then lets
    /// in-flight requests finish.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for listener errors that should end the server.
    pub async fn serve(
        self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let routes = Routes(vec![(String::new(), self.into_state())]);
        serve_routes(Arc::new(routes), listener, shutdown).await
    }

    /// Serves several simulators on one listener, each under its path prefix (`"/2captcha"`:
    /// `/2captcha/in.php`; `""`: the root), until `shutdown` resolves.
    ///
    /// # Errors
    /// As [`Simulator::serve`].
    pub async fn serve_many(
        sims: Vec<(String, Simulator)>,
        listener: TcpListener,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let routes = sims
            .into_iter()
            .map(|(prefix, sim)| (prefix.trim_end_matches('/').to_owned(), sim.into_state()))
            .collect();
        serve_routes(Arc::new(Routes(routes)), listener, shutdown).await
    }
}

/// A serve loop running in the background, and how to stop it.
struct Running {
    stop: watch::Sender<bool>,
    task: JoinHandle<io::Result<()>>,
}

impl Running {
    fn start(state: Arc<State>, listener: TcpListener) -> Running {
        let (stop, mut stop_requested) = watch::channel(false);
        let shutdown = async move {
            // A dropped sender means the handle is gone, which must not stop the server.
            if stop_requested.wait_for(|stop| *stop).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let routes = Arc::new(Routes(vec![(String::new(), state)]));
        let task = tokio::spawn(serve_routes(routes, listener, shutdown));
        Running { stop, task }
    }

    async fn stop(self) {
        // Fails only if the serve loop already ended, which is what we want anyway.
        let _ = self.stop.send(true);
        if let Err(error) = self.task.await {
            debug!(%error, "sim serve task ended abnormally");
        }
    }
}

/// Accepts connections until `shutdown`, then closes idle keep-alive connections, lets
/// in-flight requests finish, and returns once every connection is done.
async fn serve_routes(
    routes: Arc<Routes>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    tokio::pin!(shutdown);
    let (stop_connections, stop_requested) = watch::channel(false);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            // Reap finished connections so the set does not grow with every client.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    connections.spawn(serve_connection(
                        stream,
                        Arc::clone(&routes),
                        stop_requested.clone(),
                    ));
                }
                Err(error) => {
                    debug!(%error, "sim accept failed");
                    tokio::time::sleep(ACCEPT_RETRY_DELAY).await;
                }
            },
        }
    }
    drop(listener);
    // Fails only if no connection is listening any more, which is fine.
    let _ = stop_connections.send(true);
    while connections.join_next().await.is_some() {}
    Ok(())
}

async fn serve_connection(stream: TcpStream, routes: Arc<Routes>, mut stop: watch::Receiver<bool>) {
    let service = service_fn(move |request| {
        let routes = Arc::clone(&routes);
        async move { api::respond(&routes, request).await }
    });
    let connection = http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let result = tokio::select! {
        result = connection.as_mut() => result,
        // `is_ok()` drops the watch guard here: it must not live across the await below.
        _ = async { stop.wait_for(|stop| *stop).await.is_ok() } => {
            connection.as_mut().graceful_shutdown();
            connection.await
        }
    };
    if let Err(error) = result {
        // Includes the deliberate drops of `FaultKind::Reset`.
        debug!(%error, "sim connection ended with an error");
    }
}

// === impl SimHandle ===

/// Cheap handle to a running simulator. Dropping it does not stop the server.
#[derive(Clone)]
pub struct SimHandle(Arc<HandleInner>);

struct HandleInner {
    addr: SocketAddr,
    state: Arc<State>,
    /// The serve loop while the simulator listens: taken by `shutdown` and `go_down`,
    /// put back by `come_back`.
    running: tokio::sync::Mutex<Option<Running>>,
}

impl SimHandle {
    /// The address the simulator listens on.
    pub fn addr(&self) -> SocketAddr {
        self.0.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.0.addr)
    }

    /// Registers a key, or reconfigures an existing one (its tasks and counters stay).
    pub fn add_key(&self, key: SimKey) {
        self.0.state.add_key(key);
    }

    /// Changes how a registered key is treated; unknown keys are ignored.
    pub fn set_state(&self, key: &str, state: SimKeyState) {
        self.0.state.set_state(key, state);
    }

    /// Sets a registered key's balance; unknown keys are ignored.
    pub fn set_balance(&self, key: &str, balance: f64) {
        self.0.state.set_balance(key, balance);
    }

    /// A registered key's balance.
    pub fn balance(&self, key: &str) -> Option<f64> {
        self.0.state.balance(key)
    }

    /// Injects a fault for requests carrying `key`, or every request when `key` is `"*"`.
    pub fn add_fault(&self, key: &str, fault: Fault) {
        self.0.state.faults().add(key, fault);
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.0.state.faults().clear();
    }

    /// Tasks of `key` currently holding a thread (0 for unknown keys).
    pub fn working_threads(&self, key: &str) -> u32 {
        self.0.state.working_threads(key)
    }

    /// Highest concurrent working-thread count the key ever reached (capacity tests).
    pub fn peak_threads(&self, key: &str) -> u32 {
        self.0.state.peak_threads(key)
    }

    /// Finishes a task as unsolvable: its next poll answers `ERROR_CAPTCHA_UNSOLVABLE`.
    /// When task `task_id` is solved, for a simulator with a [`Simulator::solve_time`].
    pub fn ready_at(&self, task_id: u64) -> Option<tokio::time::Instant> {
        self.0.state.ready_at(task_id)
    }

    pub fn make_unsolvable(&self, task_id: u64) {
        self.0.state.make_unsolvable(task_id);
    }

    /// Which key created a task.
    pub fn task_owner(&self, task_id: u64) -> Option<String> {
        self.0.state.task_owner(task_id)
    }

    /// Every request received (the last 10 000), in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.0.state.received()
    }

    /// Forgets the received requests.
    pub fn clear_received(&self) {
        self.0.state.clear_received();
    }

    /// Stops accepting connections and waits until in-flight requests have been answered.
    /// Later calls (from clones) return at once.
    pub async fn shutdown(self) {
        self.go_down().await;
    }

    /// A service outage: stops listening, so that connections to the simulator's address
    /// are refused, and closes the open ones once their requests are answered. Keys, tasks
    /// and counters stay for [`SimHandle::come_back`].
    pub async fn go_down(&self) {
        let running = self.0.running.lock().await.take();
        if let Some(running) = running {
            running.stop().await;
        }
    }

    /// Ends an outage: listens again on the same address, with the same keys and tasks.
    ///
    /// # Errors
    /// When the address cannot be bound again (another process took the port meanwhile).
    pub async fn come_back(&self) -> io::Result<()> {
        let mut running = self.0.running.lock().await;
        if running.is_none() {
            let socket = tokio::net::TcpSocket::new_v4()?;
            // The closed connections of before linger in TIME_WAIT on this port.
            socket.set_reuseaddr(true)?;
            socket.bind(self.0.addr)?;
            let listener = socket.listen(1024)?;
            *running = Some(Running::start(Arc::clone(&self.0.state), listener));
        }
        Ok(())
    }
}
