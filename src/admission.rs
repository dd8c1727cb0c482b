//! May this submit take a thread of this key: one place decides it, over the caller token's
//! `max_threads`, the key's threads here, the queue while every key is full, and the shared
//! count where replicas share the pool. A submit begins an [`Admission`] (its token's
//! thread, taken once), and each attempt asks it for the next key and a [`Ticket`]. The
//! service accepted the submit: [`Admission::open`] makes every write a pinned task needs
//! (its pin, its thread here, its caller token's thread, its seat in the shared count). Any
//! other ending (a failure, a failover, a cancelled request at any await) drops the ticket
//! and the admission, and everything they held goes back.

use std::sync::Arc;

use rand::Rng;
use tokio::time::Instant;

use crate::app::App;
use crate::budgets;
use crate::capacity::{Lease, Refusal, SharedSeat, SharedTake, Take, Waited};
use crate::captcha::{Profile, TaskId};
use crate::config::{Capacity as Limits, Config};
use crate::metrics::WaitResult;
use crate::pool::{Candidates, KeyEntry, KeyPool, SharedView};
use crate::tokens::{Token, TokenHold, TokenId};

/// One attempt's hold on a key: its thread here and, where replicas share the pool, its
/// seat in the shared count.
#[must_use = "a ticket not opened for a task is given back when dropped"]
pub struct Ticket<'a> {
    local: Lease<'a>,
    seat: Option<Box<dyn SharedSeat>>,
}

/// One submit's admission: the keys it may still try, in the pool's order, and the thread
/// of its caller token's cap that it holds across every attempt.
pub struct Admission<'a, R> {
    app: &'a App,
    pool: &'a KeyPool,
    config: &'a Config,
    deadline: Instant,
    candidates: Candidates<'a, R>,
    /// After a transient failure with no other key left to try, the same key is tried
    /// again: a lone key must still get its retries. Not after a refused connection: the
    /// key's host:port is what refused, and would again.
    retry_same: Option<&'a Arc<KeyEntry>>,
    token: Option<(&'a Token, TokenHold)>,
}

impl<'a, R: Rng> Admission<'a, R> {
    /// Begins the admission of a submit that arrived at `started`, over `candidates` (the
    /// caller `token`'s keys among them), waiting `[capacity] queue_timeout` at most, in
    /// all. The token's own thread comes first: a token at its `max_threads` waits for one
    /// of its tasks to end as a full pool waits for a key's thread.
    pub async fn begin(
        app: &'a App,
        pool: &'a KeyPool,
        config: &'a Config,
        token: Option<&'a Token>,
        candidates: Candidates<'a, R>,
        started: Instant,
    ) -> Result<Self, Refusal> {
        let limits = &config.capacity;
        let deadline = started + limits.queue_timeout;
        let candidates = candidates.for_token(token);
        let token = match token {
            None => None,
            Some(token) => Some((token, token_thread(token, limits, deadline).await?)),
        };
        Ok(Admission {
            app,
            pool,
            config,
            deadline,
            candidates,
            retry_same: None,
            token,
        })
    }

    /// The next key to try and a ticket for it. While every key that could take the task
    /// is full, waits in the pool's queue (FIFO, until the deadline) for a thread to come
    /// free; a key whose shared count has no seat is passed over, and the walk looks again.
    pub async fn next(&mut self) -> Waited<(&'a Arc<KeyEntry>, Ticket<'a>)> {
        loop {
            let (key, local) = match self.thread().await {
                Waited::Got(taken) => taken,
                Waited::NoKey => return Waited::NoKey,
                Waited::Refused(refusal) => return Waited::Refused(refusal),
            };
            // Not boxed here: the shared count's round trip is a boxed future of its
            // store's own, so this one stays small, and a single instance allocates
            // nothing for it.
            match self.seat(key, local).await {
                Some(ticket) => return Waited::Got((key, ticket)),
                // Held elsewhere, or the shared count is away and this replica's share
                // applies now: the local thread went back; the walk looks again.
                None => self.candidates.put_back(key),
            }
        }
    }

    /// The attempt on `key` failed for a moment: if no other key is left, `key` is tried
    /// again.
    pub fn may_retry(&mut self, key: &'a Arc<KeyEntry>) {
        self.retry_same = Some(key);
    }

    /// `key`'s host:port refused the connection: every key behind it is out of this walk,
    /// and a lone key is not tried again either.
    pub fn shun_origin_of(&mut self, key: &KeyEntry) {
        self.candidates.shun_origin_of(key);
        self.retry_same = None;
    }

    /// The service accepted the submit on `key` and answered `task`: the task is pinned to
    /// `key` for the caller token (with the thread it holds of the token's cap), keeps the
    /// key's thread here and its seat in the shared count, gets its polling cadence
    /// (`method`'s first poll as the key's provider advises it) and, for a caller token,
    /// reserves the method's price in the token's budget, all before the caller has
    /// the id, so that a poll on any replica finds its key. The shared seat is kept after
    /// the local writes: the shared count never holds a task this replica does not.
    pub async fn open(
        self,
        ticket: Ticket<'a>,
        key: &Arc<KeyEntry>,
        task: &TaskId,
        method: Option<&str>,
    ) {
        let now = Instant::now();
        let polling = &self.config.polling;
        let method = method.unwrap_or("");
        let advised = Profile::of(key.provider).first_poll(method);
        (self.app.polling()).opened(polling, task, (key.provider, method), advised, now);
        let (token, hold) = self.token.unzip();
        let token_id = token.map_or(TokenId::NONE, |t| t.id);
        self.app.pins().pin_for(task.clone(), key.id, token_id, now);
        ticket.local.keep_for(task.clone(), now);
        if let Some(hold) = hold {
            self.app.capacity().keep_token(task.clone(), hold, now);
        }
        if let Some(token) = token {
            // A key of a thread-billed plan, or one the price table leaves out, costs 0.
            let price = (self.config.prices)
                .per_task(key.provider, method)
                .unwrap_or(0.0);
            (self.app.budgets()).reserve(task.clone(), &token.name, price, budgets::now());
        }
        let token_name = token.map_or("", |t| &*t.name);
        if let Some(seat) = ticket.seat {
            seat.keep(task, &key.name, token_name, self.pool.shared_limit(key))
                .await;
        }
    }

    /// A key's thread here, from the walk, waiting in the queue while every key is full.
    async fn thread(&mut self) -> Waited<(&'a Arc<KeyEntry>, Lease<'a>)> {
        let pool = self.pool;
        let (candidates, retry_same) = (&mut self.candidates, &mut self.retry_same);
        let take = || {
            candidates.at(Instant::now());
            while let Some(key) = candidates.next() {
                match pool.hold(key) {
                    Some(lease) => {
                        *retry_same = None;
                        return Take::Got((key, lease));
                    }
                    // Its last thread went to another request since the pick: look again,
                    // and the key counts as full this time.
                    None => candidates.put_back(key),
                }
            }
            let full = candidates.saw_full();
            match retry_same.filter(|k| pool.in_rotation(k, Instant::now())) {
                Some(key) => match pool.hold(key) {
                    Some(lease) => {
                        *retry_same = None;
                        Take::Got((key, lease))
                    }
                    None => Take::Full,
                },
                None if full => Take::Full,
                None => Take::NoKey,
            }
        };
        let recheck = || pool.next_return(Instant::now());
        let (waited, queued) = self
            .app
            .capacity()
            .wait_for(
                self.deadline,
                self.config.capacity.max_queued,
                recheck,
                take,
            )
            .await;
        if let Some(queued) = queued {
            let result = match &waited {
                Waited::Got(_) => WaitResult::Admitted,
                Waited::NoKey => WaitResult::NoKey,
                Waited::Refused(_) => WaitResult::Refused,
            };
            self.app
                .metrics()
                .queue_wait
                .with_label_values(&[result.label()])
                .observe(queued.as_secs_f64());
        }
        waited
    }

    /// The shared count's seat after the key's own thread (`local`): a ticket, or `None`
    /// when every thread of the key is held elsewhere (marked so for a moment, for the walk
    /// and the queue to pass it over) or the count cannot be asked now (this replica's
    /// share applies from now on). Either way the local thread goes back.
    async fn seat(&self, key: &KeyEntry, local: Lease<'a>) -> Option<Ticket<'a>> {
        let shared = self.app.shared_threads();
        if !shared.counts() {
            return Some(Ticket { local, seat: None });
        }
        let limit = self.pool.shared_limit(key);
        match shared.take(&key.name, limit).await {
            SharedTake::Seated(seat) => Some(Ticket {
                local,
                seat: Some(seat),
            }),
            SharedTake::Full => {
                key.stats
                    .shared
                    .set_full(Some(Instant::now() + SharedView::FULL_HOLD));
                None
            }
            SharedTake::Unavailable(error) => {
                tracing::warn!(key = %key.name, error = %error, "shared thread count unavailable; this replica's share applies");
                None
            }
        }
    }
}

/// One thread of `token`'s `max_threads`, waited for until `deadline` while the token holds
/// them all, if the pool's queue is on.
async fn token_thread(
    token: &Token,
    limits: &Limits,
    deadline: Instant,
) -> Result<TokenHold, Refusal> {
    if let Some(hold) = token.try_hold() {
        return Ok(hold);
    }
    if limits.max_queued == 0 || limits.queue_timeout.is_zero() {
        return Err(Refusal::NoQueue);
    }
    tracing::debug!(token = %token.name, "token at its max_threads; waiting for one of its tasks to end");
    token.hold_until(deadline).await.ok_or(Refusal::TimedOut)
}
